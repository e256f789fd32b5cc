"""``ambrosia-py bench ingress``: calls from a program through the ingress, answered once
durable.

A real ``ambrosia-py run ambrosia_py.bench.ingress:IngressBench --ingress 127.0.0.1:PORT``
(its coordinator logging every call durably) runs in a temporary data directory; this
process calls ``IngressBench.add`` with :class:`~ambrosia_py.client.AsyncClient`, each
call with its own key (16 random bytes), 16-byte arguments:

- one call at a time: each waits for its answer, which leaves only once the call is in
  the fsynced log and has run;
- 64 in flight: 64 tasks on one client (one connection), the coordinator group-commits
  what arrives together;
- 16 callers: 16 threads, each with a :class:`~ambrosia_py.client.Client` (a connection)
  of its own and one call in flight, as many programs calling one service would; the
  ingress logs the calls of each turn of its event loop, from all connections, as one
  batch.

Calls per second and the latency of each call (from ``call`` to its value: encoding,
the round trip, the durable write, the handler, decoding), p50 and p99. The disk's
fdatasync rate is measured in the same run, since it bounds every durable figure, and
so is the floor under the 16 callers (:mod:`.ingress_floor`: the same path, the same
threads and processes, with no work behind it).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from .. import Immortal, eventloop, rpc
from ..client import AsyncClient, Client
from ..testing.processes import interruptible
from .coordinator import measure_fsync_rate
from .ingress_floor import in_threads, measure_ingress_floor

__all__ = [
    "IngressBench",
    "IngressProcess",
    "ingress_bench",
    "measure_calls",
    "measure_callers",
    "percentile",
]

IN_FLIGHT = 64
CALLERS = 16


class IngressBench(Immortal):
    """The service measured: one handler, a counter."""

    def __init__(self) -> None:
        self.total = 0

    @rpc
    def add(self, data: bytes) -> int:
        self.total += len(data)
        return self.total


def percentile(samples: list[float], p: float) -> float:
    """The ``p``-th percentile (nearest rank) of ``samples``."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(p / 100 * len(ordered)) - 1))]


class IngressProcess:
    """One ``ambrosia-py run ... --ingress`` and its coordinator, in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.log = data_dir / "ingress-bench.run.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.address = ""

    def start(self, timeout: float = 60.0) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "ambrosia_py.cli", "run"]
        argv += [f"{__name__}:IngressBench", "--instance", "bench", "--data-dir"]
        argv += [str(self.data_dir), "--ingress", "127.0.0.1:0"]
        with self.log.open("ab") as log:
            # stop() sends SIGINT, however the bench was started
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, preexec_fn=interruptible)
        deadline = time.monotonic() + timeout
        while not self.address:
            for line in self.log.read_text(errors="replace").splitlines():
                if line.startswith("ingress listening on "):
                    self.address = line.split()[-1]
            if not self.address and (self.proc.poll() is not None or time.monotonic() > deadline):
                self.stop()
                tail = self.log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the service did not start:\n{tail}")
            time.sleep(0.02)  # polling its log for the ready line, bounded by the deadline

    def stop(self) -> None:
        """SIGINT: the binding leaves, its coordinator flushes and stops; else SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    @contextlib.contextmanager
    def running(self) -> Iterator[IngressProcess]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


async def measure_calls(
    client: AsyncClient, count: int, in_flight: int
) -> tuple[float, list[float]]:
    """Calls per second with ``in_flight`` callers, and each call's latency (seconds)."""
    latencies: list[float] = []
    todo = iter(range(count))

    async def caller() -> None:
        for _ in todo:
            began = time.perf_counter()
            await client.call(IngressBench.add, os.urandom(16))
            latencies.append(time.perf_counter() - began)

    start = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    return count / (time.perf_counter() - start), latencies


def measure_callers(
    address: str, data_dir: Path, callers: int, seconds: float
) -> tuple[float, list[float]]:
    """Calls per second with ``callers`` threads calling for ``seconds``, each with a
    :class:`Client` of its own, and each call's latency (seconds)."""
    clients = [Client(address, data_dir=data_dir) for _ in range(callers)]
    latencies: list[list[float]] = [[] for _ in range(callers)]
    try:
        for client in clients:  # connected, and the calling threads' connection made
            client.call(IngressBench.add, os.urandom(16))
            client.call(IngressBench.add, os.urandom(16))
        stop = time.perf_counter() + seconds

        def caller(i: int) -> None:
            client, mine = clients[i], latencies[i]
            while (began := time.perf_counter()) < stop:
                client.call(IngressBench.add, os.urandom(16))
                mine.append(time.perf_counter() - began)

        took = in_threads(caller, callers)
    finally:
        for client in clients:
            client.close()
    every = [latency for mine in latencies for latency in mine]
    return len(every) / took, every


def _row(label: str, rate: float, latencies: list[float]) -> list[str]:
    return [
        label,
        f"{len(latencies):,}",
        f"{rate:,.0f}",
        f"{percentile(latencies, 50) * 1000:.2f}",
        f"{percentile(latencies, 99) * 1000:.2f}",
    ]


async def _run(address: str, data_dir: Path, sequential: int, parallel: int) -> list[list[str]]:
    rows = []
    async with AsyncClient(address, data_dir=data_dir) as client:
        await measure_calls(client, max(1, sequential // 10), 1)  # warm-up: imports, caches
        for label, count, in_flight in (
            ("1 in flight", sequential, 1),
            (f"{IN_FLIGHT} in flight", parallel, IN_FLIGHT),
        ):
            rate, latencies = await measure_calls(client, count, in_flight)
            rows.append(_row(label, rate, latencies))
    return rows


@click.command("ingress")
@click.option("--sequential", default=2_000, show_default=True, help="Calls, one in flight.")
@click.option("--parallel", default=20_000, show_default=True, help="Calls, 64 in flight.")
@click.option("--seconds", default=5.0, show_default=True, help="Time the 16 callers call.")
@click.option("--quick", is_flag=True, help="Tiny counts: checks it works.")
def ingress_bench(sequential: int, parallel: int, seconds: float, quick: bool) -> None:
    """Calls through the ingress (ambrosia_py.client): calls/s and latency percentiles."""
    if quick:
        sequential, parallel, seconds = 20, 200, 0.3
    console = Console(width=120)
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-ingress-") as tmp:
        data_dir = Path(tmp)
        syncs = measure_fsync_rate(data_dir, 0.2 if quick else 1.0)
        service = IngressProcess(data_dir / "data")
        with service.running():
            rows = eventloop.run(_run(service.address, service.data_dir, sequential, parallel))
            rate, latencies = measure_callers(service.address, service.data_dir, CALLERS, seconds)
            rows.append(_row(f"{CALLERS} callers, a Client each", rate, latencies))
        floor = measure_ingress_floor(
            data_dir / "floor", callers=CALLERS, seconds=seconds, sequential=max(10, sequential)
        )
    table = Table(
        title="calls through the ingress: 16 B arguments, each logged durably before it runs"
    )
    for col in ("callers", "calls", "calls/s", "p50 ms", "p99 ms"):
        table.add_column(col, justify="right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(
        f"the floor (the same path, no work): {CALLERS} callers {floor.calls_per_s:,.0f} calls/s "
        f"(ours {rate / floor.calls_per_s:.2f}x), one at a time p50 "
        f"{floor.sequential_p50_s * 1000:.2f} ms"
    )
    console.print(f"this machine's disk: {syncs:,.0f} fdatasync'ed 4 KiB writes/s")
