"""The pipeline the demo runs, and the crashes it inflicts on it.

Three immortals, each ``ambrosia-py run`` with its own coordinator, in one fresh data
directory (``WORKDIR/data``; their output in ``WORKDIR/logs``):

- ``hub``: the Ockam hub (``immortals.ockam.hub``) on a loopback TCP port;
- ``worker``: a Wallaroo worker (``immortals.wallaroo.worker``) whose application is
  ``examples.pipeline.sensors:aggregate`` (per-sensor counts and sums);
- ``connector``: a Wallaroo connector (``immortals.wallaroo.connector``) reading the
  stream ``readings`` from the hub (``ockam://``, through the index service) and
  feeding the worker;

and the producer (``examples/pipeline/producer.py``, a plain program) pushing readings
to the stream at a steady rate through the Ockam ``Publisher``.

While the readings flow, :class:`Pipeline` SIGKILLs the hub, the connector and the
worker, each one's service process and coordinator, by :data:`Settings.kills`: each
kill waits until the readings stored (confirmed by the hub) or aggregated (in the
worker's state, read from its operators' port) pass a share of the run, never for a
time. Each victim is started again at once with the same command, and the next kill
waits until it has recovered: the hub accepts connections again (it does so only after
its replay), the worker answers as a new incarnation, the connector holds a new
connection at the worker. Every wait has a deadline; a failure raises
:class:`DemoError` with the end of the logs that say why.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ..client.lines import ask
from ..testing.ports import free_port
from ..testing.processes import ServiceProcess, Victim
from .producer import ProducerProcess
from .view import PipelineView

__all__ = ["EACH_PROCESS", "PLAN", "STREAM", "Crash", "DemoError", "Kill", "Pipeline", "Settings"]

STREAM = "readings"
_TICK = 0.1  # seconds between looks at the pipeline (progress, kills, the view)
_STREAM_NAME = f"ockam:{STREAM}"  # the connector's name for it (immortals.wallaroo.sources)
_NOTHING_SEEN = 2**64 - 1  # a worker's point for a stream it has seen nothing of


class DemoError(Exception):
    """A step failed: ``what`` says which and why; ``logs`` the end of the logs to read."""

    def __init__(self, what: str, logs: dict[str, str] | None = None) -> None:
        super().__init__(what)
        self.what = what
        self.logs = logs or {}


@attrs.frozen
class Kill:
    """SIGKILL ``which`` process(es) of ``service`` once ``metric`` reaches ``share`` of
    the readings."""

    service: str  # hub, connector, worker
    which: Victim
    metric: str  # stored, aggregated
    share: float

    def threshold(self, events: int) -> int:
        return max(1, int(events * self.share))

    def describe(self, events: int) -> str:
        what = {"service": "service process", "coordinator": "coordinator"}.get(self.which)
        victim = f"{self.service}'s {what}" if what else f"both of {self.service}'s processes"
        return f"SIGKILL {victim} at {self.threshold(events):,} readings {self.metric}"


# In the order they happen: the hub's kills by readings stored, early enough to land
# while the producer still pushes; the others' by readings aggregated. The quick run
# kills each process of each immortal once; the full run also both processes at once.
PLAN = (
    Kill("hub", "service", "stored", 0.10),
    Kill("worker", "coordinator", "aggregated", 0.15),
    Kill("hub", "coordinator", "stored", 0.30),
    Kill("connector", "service", "aggregated", 0.35),
    Kill("hub", "both", "stored", 0.55),
    Kill("worker", "service", "aggregated", 0.55),
    Kill("connector", "coordinator", "aggregated", 0.70),
    Kill("worker", "both", "aggregated", 0.80),
    Kill("connector", "both", "aggregated", 0.90),
)
EACH_PROCESS = tuple(k for k in PLAN if k.which != "both")


@attrs.frozen
class Settings:
    """One run: how many readings, how fast, which kills."""

    events: int
    rate: float  # readings per second the producer makes (0: as fast as it can)
    kills: tuple[Kill, ...]
    sensors: int = 100
    seed: int = 1
    deadline: float = 120.0  # seconds any one wait may take


@attrs.frozen
class Crash:
    """One kill as it happened."""

    kill: Kill
    pids: str
    stored: int
    aggregated: int
    recovered_in: float


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class Pipeline:
    """The three immortals and the producer in ``workdir`` (see the module docstring)."""

    def __init__(self, workdir: Path, settings: Settings, root: Path, view: PipelineView) -> None:
        self.settings = settings
        self.view = view
        self.data = workdir / "data"
        self.logs = workdir / "logs"
        self.manifest = workdir / "produced.json"
        self.cookie = secrets.token_hex(8)
        self.hub_port = free_port()
        self.worker_address = f"127.0.0.1:{free_port()}"
        self.control = f"127.0.0.1:{free_port()}"
        path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "PYTHONPATH": path}  # the worker imports the app from root
        self.root, self.env = root, env  # where the example's programs run, and how

        def service(instance: str, module: str, *args: str) -> ServiceProcess:
            log = self.logs / f"{instance}.log"
            return ServiceProcess(module, instance, self.data, args, log=log, cwd=root, env=env)

        self.services = {
            "hub": service("hub", "immortals.ockam.hub", "--listen", f"127.0.0.1:{self.hub_port}"),
            "worker": service(
                "worker",
                "immortals.wallaroo.worker",
                *("--listen", self.worker_address, "--control", self.control),
                *("--cookie", self.cookie, "--app", "examples.pipeline.sensors:aggregate"),
            ),
            "connector": service(
                "connector",
                "immortals.wallaroo.connector",
                *("--worker", self.worker_address, "--cookie", self.cookie),
                *("--source", f"ockam://127.0.0.1:{self.hub_port}/{STREAM}"),
                *("--backoff-max", "0.5"),
            ),
        }
        s = settings
        self.producer = ProducerProcess(
            [
                *("--hub", f"127.0.0.1:{self.hub_port}", "--stream", STREAM),
                *("--events", str(s.events), "--rate", str(s.rate)),
                *("--sensors", str(s.sensors), "--seed", str(s.seed)),
                *("--manifest", str(self.manifest)),
            ],
            self.logs / "producer.log",
            root,
            env,
        )
        self.status: dict[str, Any] | None = None  # the worker's, as last read
        self.crashes: list[Crash] = []
        self._down: set[str] = set()  # services killed and not yet restarted

    # -- looking at it -----------------------------------------------------------------

    def _worker_status(self) -> dict[str, Any] | None:
        try:
            answer = ask(self.control, {"op": "status", "cookie": self.cookie}, timeout=2.0)
        except (OSError, ValueError):
            return None
        return dict(answer["status"]) if answer.get("ok") else None

    def _look(self) -> None:
        """Read the progress, refresh the view, and fail if a process died unbidden."""
        for name, svc in self.services.items():
            if name not in self._down and svc.proc is not None and not svc.alive():
                raise DemoError(f"the {name} exited by itself", {name: svc.tail()})
        code = self.producer.exited()
        if code not in (None, 0):
            raise DemoError(
                f"the producer failed (exit {code})", {"producer": self.producer.tail()}
            )
        c = self.view.counters
        p = self.producer.progress
        c.produced, c.stored = p.get("produced", c.produced), p.get("stored", c.stored)
        c.reconnects, c.recovered = p.get("reconnects", 0), p.get("recovered", 0)
        if "worker" not in self._down and (status := self._worker_status()) is not None:
            self.status = status
            c.aggregated = int(status["app_state"].get("events", 0))
            c.delivered = self._point(status)
        # A reading the worker holds was pulled from the hub's log, so it is stored even
        # if its confirm has not reached the producer yet.
        c.stored = max(c.stored, c.delivered)

    @staticmethod
    def _point(status: dict[str, Any]) -> int:
        for stream in status["streams"].values():
            if stream["name"] == _STREAM_NAME:
                point = stream["point"]  # None: nothing of it seen yet
                return 0 if point is None or point == _NOTHING_SEEN else int(point)
        return 0

    def _streaming(self) -> set[str]:
        """The worker's connections that are streaming (the connector's, after a start)."""
        if self.status is None:
            return set()
        conns = self.status["connections"].items()
        return {conn for conn, c in conns if c["state"] == "streaming"}

    def logs_of(self, *names: str) -> dict[str, str]:
        out = {n: self.services[n].tail() for n in names if n in self.services}
        if "producer" in names:
            out["producer"] = self.producer.tail()
        return out

    def wait(
        self,
        what: str,
        condition: Callable[[], bool],
        logs: tuple[str, ...],
        *,
        paced: bool = False,
    ) -> float:
        """Look every tick until ``condition`` holds; the seconds it took. DemoError with
        ``logs``' ends past the deadline: :attr:`Settings.deadline`, plus, if the condition
        waits on the stream's progress (``paced``), the time the producer takes at its
        rate (at no rate: 1,000 readings a second, far below what the pipeline does).
        Off a terminal a wait that lasts says so (:meth:`Output.heartbeat`)."""
        start = time.monotonic()
        s = self.settings
        timeout = s.deadline + (s.events / (s.rate or 1000.0) if paced else 0.0)
        deadline = start + timeout
        with self.view.out.heartbeat(f"waiting for {what}"):
            while True:
                self._look()
                if condition():
                    return time.monotonic() - start
                if time.monotonic() > deadline:
                    raise DemoError(
                        f"timed out after {timeout:.0f} s waiting for {what}", self.logs_of(*logs)
                    )
                time.sleep(_TICK)  # polling a condition, bounded by the deadline

    # -- running it --------------------------------------------------------------------

    def _pids(self, name: str) -> str:
        svc = self.services[name]
        ic = svc.coordinator_pid()
        return f"{svc.proc.pid if svc.proc else '-'}/{ic or '-'}"

    def _ready(self) -> dict[str, Callable[[], bool]]:
        """Whether each immortal serves: the hub accepts connections (only once its
        replay is done), the worker answers, the connector streams to the worker."""
        return {
            "hub": lambda: _accepts(self.hub_port),
            "worker": lambda: self._worker_status() is not None,
            "connector": lambda: bool(self._streaming()),
        }

    def start(self) -> None:
        """The three immortals at once (each retries the others until they serve), then,
        once all serve, the producer."""
        self.data.mkdir(parents=True)
        self.view.event(f"data dir {self.data}; each process's output in {self.logs}")
        ready = self._ready()
        for name, svc in self.services.items():
            svc.start()
            self.view.set_service(name, "starting")
        up: dict[str, float] = {}

        def all_up() -> bool:
            for name in self.services:
                if name not in up and ready[name]():
                    up[name] = self.view.elapsed()
                    self.view.set_service(name, "up", self._pids(name))
            return len(up) == len(self.services)

        self.wait("hub, worker and connector to serve", all_up, tuple(self.services))
        self.view.event(
            f"hub on 127.0.0.1:{self.hub_port}, worker on {self.worker_address}, "
            f"connector streaming ockam:{STREAM} to it: all up in {max(up.values()):.1f} s"
        )
        self.producer.start()
        rate = f"{self.settings.rate:,.0f}/s" if self.settings.rate > 0 else "full speed"
        self.view.event(f"producer started: {self.settings.events:,} readings at {rate}")

    def crash(self, kill: Kill) -> None:
        """Wait for the kill's moment, SIGKILL, start again, wait for the recovery."""
        events = self.settings.events
        self.view.next_step = f"next: {kill.describe(events)}"
        threshold = kill.threshold(events)
        self.wait(
            f"{threshold:,} readings {kill.metric} (to {kill.describe(events)})",
            lambda: int(getattr(self.view.counters, kill.metric)) >= threshold,
            ("hub", "connector", "worker", "producer"),
            paced=True,
        )
        name = kill.service
        before = self.status or {}
        connections = self._streaming()
        pids = self._pids(name)
        c = self.view.counters
        stored, aggregated = c.stored, c.aggregated
        self._down.add(name)
        try:
            self.services[name].kill(kill.which)
        except TimeoutError as exc:  # a process that will not die
            raise DemoError(f"SIGKILL of the {name}: {exc}", self.logs_of(name)) from None
        self.view.services[name].kills += 1
        self.view.set_service(name, "killed")
        self.view.event(
            f"SIGKILL {name}: {kill.which} (pids {pids}) at {stored:,} stored, "
            f"{aggregated:,} aggregated",
            "bold red",
        )
        recovered: dict[str, Callable[[], bool]] = {
            "hub": lambda: _accepts(self.hub_port),
            "worker": lambda: (self.status or {}).get("incarnation") != before.get("incarnation"),
            "connector": lambda: bool(self._streaming() - connections),
        }
        self.view.set_service(name, "recovering")
        self.view.next_step = f"waiting for the {name} to recover"
        self.services[name].start()
        self._down.discard(name)
        took = self.wait(f"the {name} to recover", recovered[name], (name,))
        self.view.set_service(name, "up", self._pids(name))
        self.crashes.append(Crash(kill, pids, stored, aggregated, took))
        self.view.event(f"{name} recovered in {took:.1f} s: {self._recovery(name, aggregated)}")

    def _recovery(self, name: str, aggregated: int) -> str:
        """What the recovery shows; for the worker, whether its state kept every reading
        it had aggregated before the kill (it must: each was in its log first)."""
        c = self.view.counters
        if name == "hub":
            return "its log replayed, it accepts connections again"
        if name == "worker":
            kept = "none lost" if c.aggregated >= aggregated else f"LOST, {aggregated:,} before"
            return f"state replayed: {c.aggregated:,} readings aggregated, {kept}"
        return f"reconnected, resumes after the worker's point {c.delivered:,}"

    def finish(self) -> None:
        """Wait for the producer to finish and the worker to hold every reading."""
        self.view.next_step = "next: the producer to finish, the worker to hold every reading"
        self.wait(
            "the producer to finish",
            lambda: self.producer.exited() == 0,
            ("producer", "hub"),
            paced=True,
        )
        if not self.producer.done:
            raise DemoError("the producer exited without finishing", self.logs_of("producer"))
        self.view.event(f"producer done: {self.settings.events:,} readings stored", "green")
        events = self.settings.events
        self.wait(
            f"the worker to hold all {events:,} readings",
            lambda: self.view.counters.delivered >= events,
            ("connector", "worker", "hub"),
            paced=True,
        )
        self.view.next_step = ""

    def final_state(self) -> dict[str, Any]:
        """The worker's application state, read afresh once it holds every reading."""
        self.wait("the worker's status", lambda: self._worker_status() is not None, ("worker",))
        status = self._worker_status()
        if status is None:
            raise DemoError("the worker stopped answering", self.logs_of("worker"))
        self.status = status
        return dict(status["app_state"])

    def stop(self) -> list[str]:
        """Stop everything still running (SIGINT; what remains is killed); what would not
        stop, named (one that will not stop must not keep the rest running)."""
        problems = []
        with self.view.out.heartbeat("stopping the producer, connector, worker and hub"):
            self.producer.stop()
            for name in ("connector", "worker", "hub"):
                try:
                    self.services[name].stop()
                except (TimeoutError, OSError, subprocess.SubprocessError) as exc:
                    problems.append(f"the {name} would not stop: {exc}")
        return problems
