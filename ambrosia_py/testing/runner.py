"""Run an immortal under test: a real coordinator process, the binding in this process.

The coordinator is started with ``ambrosia-py coordinator`` in a data directory of the
test's; the binding runs on an event loop in a thread of the test process, so the test
can send impulses, wait until they are logged, wait for the state it expects, read the
state, and kill the coordinator with SIGKILL whenever it likes. The binding dies with
its coordinator (its in-memory state is dropped); starting the same instance again
recovers from the log, which holds every impulse logged before the kill and none of the
others (:mod:`.impulses`).
"""

from __future__ import annotations

import asyncio
import contextlib
import linecache
import os
import reprlib
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from .. import eventloop
from ..binding.client import serve
from ..binding.dispatcher import Mode
from ..binding.files import StateFiles, state_files_dir, use_state_files
from ..binding.immortal import Immortal
from ..coordinator.core.binding_auth import token_for_ready_line
from ..coordinator.core.process import coordinator_argv
from ..ingress.keys import KeyTable
from .impulses import CountingDispatcher
from .processes import readline_within, wait_for

__all__ = ["ImmortalRunner", "RunningImmortal"]

DEFAULT_TIMEOUT = 30.0


class _Impulses:
    def __init__(self, running: RunningImmortal) -> None:
        self._running = running

    def __getattr__(self, name: str) -> Callable[..., None]:
        def send(*args: Any, **kwargs: Any) -> None:
            def in_loop() -> None:
                getattr(self._running.dispatcher.immortal.impulse, name)(*args, **kwargs)

            self._running._in_loop(in_loop)

        return send


class RunningImmortal:
    """One incarnation of an immortal: its coordinator process and its binding thread."""

    def __init__(
        self,
        service: type[Immortal],
        data_dir: Path,
        instance: str,
        timeout: float,
        options: dict[str, Any] | None = None,
        coordinator_options: Sequence[str] = (),
        earlier_unlogged: int = 0,
    ) -> None:
        """``earlier_unlogged``: impulses the last incarnation was killed with before they
        were seen logged (its :attr:`unlogged_at_kill`), said when a wait here times out."""
        options = options or {}
        self.service = service
        self.instance = instance
        self.data_dir = data_dir
        self.timeout = timeout
        self.earlier_unlogged = earlier_unlogged
        self.unlogged_at_kill: int | None = None  # set by kill()
        # The coordinator's log goes to a file (a pipe nobody reads would fill up and
        # stall it); failures quote its end.
        data_dir.mkdir(parents=True, exist_ok=True)
        self.ic_log = data_dir / f"{instance}.coordinator.log"
        with self.ic_log.open("ab") as log_file:
            self.ic = subprocess.Popen(
                coordinator_argv(instance, data_dir, *coordinator_options),
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
            )
        assert self.ic.stdout is not None
        line = readline_within(self.ic.stdout, timeout)
        if not line.startswith("ready"):
            if line == "" and self.ic.poll() is None:  # no line, and it still runs: hung
                self.ic.kill()
            self.ic.wait(timeout)
            raise RuntimeError(f"coordinator did not start: {line!r}\n{self._log_tail()}")
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        self._token = token_for_ready_line(fields, data_dir, instance)
        self.dispatcher = CountingDispatcher(
            service, instance, options=service.make_options(**options), ingress=KeyTable
        )
        self.loop = eventloop.new_event_loop()
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(int(fields["receive_port"]), int(fields["send_port"])),
            daemon=True,
        )
        self._thread.start()
        try:
            self.wait_until(lambda _: True, what="the immortal to be primary (recovered)")
        except BaseException:  # the caller gets no handle to stop it with: stop it here
            # A coordinator that refused the start exits by itself, saying why: let it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ic.wait(self.timeout)
            self.kill()
            raise

    def _run(self, receive_port: int, send_port: int) -> None:
        try:
            with use_state_files(StateFiles(state_files_dir(self.data_dir, self.instance))):
                self.loop.run_until_complete(
                    serve(
                        self.service,
                        self.instance,
                        receive_port,
                        send_port,
                        dispatcher=self.dispatcher,
                        token=self._token,
                    )
                )
        except BaseException as exc:  # reported to the test by the next call
            self.error = exc

    def _in_loop(self, fn: Callable[[], Any]) -> Any:
        if not self._thread.is_alive():
            raise RuntimeError(f"the binding of {self.instance!r} has stopped ({self.error!r})")

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(self.timeout)

    @property
    def impulse(self) -> Any:
        """``running.impulse.method(args)``: an impulse, as a background task would send.

        It returns once the binding has taken it, not once it is durable: a :meth:`kill`
        before the coordinator has logged it loses it. :meth:`wait_logged` waits for that.
        """
        return _Impulses(self)

    @property
    def state(self) -> dict[str, Any]:
        """A copy of the immortal's attributes, taken between two records."""

        def copy() -> dict[str, Any]:
            return dict(cloudpickle.loads(cloudpickle.dumps(self.dispatcher.state())))

        result: dict[str, Any] = self._in_loop(copy)
        return result

    def wait_logged(self, timeout: float | None = None) -> int:
        """Wait until every impulse this incarnation has sent so far (through
        :attr:`impulse`, or from the service's background tasks) is in a log record the
        coordinator has made durable; return how many of its impulses are logged.

        After it, :meth:`kill` loses none of them: the next start replays them, each
        once. (A handler runs only on a logged record, so a :meth:`wait_until` on state
        the handlers build waits for as much.)
        """
        d = self.dispatcher
        sent: int = self._in_loop(lambda: d.impulses_sent)

        def logged() -> bool:
            self._check_running()
            return d.impulses_logged >= sent

        def context() -> str:
            return f"{d.impulses_logged} logged so far\n{self._log_tail()}"

        limit = timeout or self.timeout
        wait_for(f"{self.instance}'s {sent} impulses to be logged", logged, limit, context)
        return d.impulses_logged

    def wait_until(
        self,
        predicate: Callable[[dict[str, Any]], bool],
        timeout: float | None = None,
        what: str | None = None,
    ) -> dict[str, Any]:
        """Wait (with a deadline) until ``predicate(state)`` holds; return that state.

        Past the deadline, TimeoutError says what was waited for (``what``, or the
        predicate's line of source), a short summary of the state, the impulses sent and
        logged, and the end of the coordinator's log.
        """
        limit = timeout or self.timeout
        deadline = time.monotonic() + limit
        while True:
            primary = self.dispatcher.mode is Mode.PRIMARY
            state = self.state if primary else {}
            if primary and predicate(state):
                return state
            self._check_running()
            if time.monotonic() > deadline:
                raise TimeoutError(self._timed_out(what or _describe(predicate), limit, state))
            time.sleep(0.005)  # polling a condition, bounded by the deadline

    def _check_running(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError(
                f"the binding of {self.instance!r} stopped ({self.error!r})\n" + self._log_tail()
            ) from self.error

    def _timed_out(self, what: str, limit: float, state: dict[str, Any]) -> str:
        d = self.dispatcher
        lines = [f"{self.instance}: timed out after {limit:g} s waiting for {what}"]
        if d.mode is Mode.PRIMARY:
            lines.append(f"state: {_summary(state)}")
        else:
            lines.append(f"the immortal is still {d.mode.value}")
        if d.impulses_sent or self.earlier_unlogged:
            lines.append(
                f"impulses sent by this incarnation: {d.impulses_sent}, logged: {d.impulses_logged}"
            )
        if self.earlier_unlogged:
            lines.append(
                f"the last incarnation was killed with {self.earlier_unlogged} impulses not "
                "yet seen logged: those the coordinator had not logged are lost (call "
                "wait_logged() before kill() to keep them)"
            )
        lines.append(self._log_tail())
        return "\n".join(lines)

    def _log_tail(self, lines: int = 5) -> str:
        text = self.ic_log.read_text(errors="replace").splitlines()[-lines:]
        return f"coordinator log {self.ic_log} ends:\n" + "\n".join(text)

    def kill(self) -> None:
        """SIGKILL the coordinator; the binding goes down with it.

        Impulses the coordinator had not logged yet are lost (:meth:`wait_logged`); how
        many were sent and not yet seen logged is kept in :attr:`unlogged_at_kill`, and
        the next incarnation's timeouts say it.
        """
        if self.ic.poll() is None:
            os.kill(self.ic.pid, signal.SIGKILL)
        self.ic.wait(self.timeout)
        self._thread.join(self.timeout)
        self.loop.close()
        self.unlogged_at_kill = self.dispatcher.impulses_sent - self.dispatcher.impulses_logged

    def stop(self) -> None:
        """Stop cleanly: the binding leaves, the coordinator flushes and exits."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._cancel_all)
            self._thread.join(self.timeout)
        try:
            self.ic.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.ic.kill()
            self.ic.wait()
        if not self.loop.is_closed():
            self.loop.close()

    def _cancel_all(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()


class ImmortalRunner:
    """Starts immortals in one data directory and cleans up after the test."""

    def __init__(
        self,
        data_dir: Path,
        timeout: float = DEFAULT_TIMEOUT,
        coordinator_options: Sequence[str] = (),
    ) -> None:
        """``coordinator_options``: more command-line options for every coordinator it
        starts (``--link-to``, ``--secret-file``, ...), as ``ambrosia-py coordinator``
        takes them."""
        self.data_dir = data_dir
        self.timeout = timeout
        self.coordinator_options = tuple(coordinator_options)
        self._running: list[RunningImmortal] = []

    def start(
        self, service: type[Immortal], instance: str | None = None, **options: Any
    ) -> RunningImmortal:
        """Start (or, if it has history, recover) ``instance`` running ``service``.

        ``options`` set the service's options (its nested ``Options`` class) by name.
        """
        name = instance or service.__name__.lower()
        earlier = [r for r in self._running if r.instance == name]
        running = RunningImmortal(
            service,
            self.data_dir,
            name,
            self.timeout,
            options,
            self.coordinator_options,
            earlier_unlogged=(earlier[-1].unlogged_at_kill or 0) if earlier else 0,
        )
        self._running.append(running)
        return running

    def close(self) -> None:
        for running in self._running:
            if running.ic.poll() is None:
                running.kill()


_SHORT = reprlib.Repr()  # a state summary, not a dump of it
_SHORT.maxstring = _SHORT.maxother = 40
_SUMMARY_CHARS = 600


def _summary(state: dict[str, Any]) -> str:
    """Each attribute's short repr, with the size of a container: a few hundred characters
    at most, however large the state."""
    parts = []
    for name, value in state.items():
        size = ""
        if isinstance(value, list | tuple | dict | set | frozenset):
            size = f" ({len(value)} items)"
        parts.append(f"{name}={_SHORT.repr(value)}{size}")
    text = ", ".join(parts) or "no attributes"
    return text if len(text) <= _SUMMARY_CHARS else text[:_SUMMARY_CHARS] + " ..."


def _describe(predicate: Callable[..., Any]) -> str:
    """The predicate as its line of source and where that is (a lambda has no name)."""
    code = getattr(predicate, "__code__", None)
    name = getattr(predicate, "__qualname__", repr(predicate))
    if code is None:
        return name
    where = f"{Path(code.co_filename).name}:{code.co_firstlineno}"
    line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    if not line:
        return f"{name} ({where})"
    return f"the condition at {where}: {line if len(line) <= 160 else line[:157] + '...'}"
