"""``ambrosia-py bench ockam``: the Ockam hub's throughput, and its checkpoints at 1M messages.

A plug-in of ``ambrosia-py bench`` (the entry point group ``ambrosia_py.bench`` in
``pyproject.toml``): the framework lists it without importing this package.

A real hub (``ambrosia-py run immortals.ockam.hub``, its coordinator logging every frame
durably) runs in a temporary data directory on a free port; this process talks to it
over TCP with :mod:`.hub_client`, 100-byte payloads throughout:

- confirmed pushes per second with one push in flight (each waits for its confirm,
  which the hub sends only once the push is in the fsynced log) and with 64 in flight
  on one connection (:class:`~.hub_client.Publisher`, pipelined);
- pulled messages per second, reading a filled stream front to back, one pull of up to
  1,000 messages at a time (a pull is logged too, and its reply is cut to one u16 frame).

The checkpoint figures are sans-IO, in this process: a :class:`StreamHub` filled with
``StreamLog.push`` directly (the handlers' frame decoding would only make the filling
slower; the stored state is the same), then ``cloudpickle.dumps`` of it with sealed
segments going to state files (the first checkpoint writes them all, the second, after
10,000 more pushes, only the new ones) and, for comparison, with everything inline.
The disk's fdatasync rate is taken in the same run, since it bounds every durable figure.
"""

from __future__ import annotations

import socket
import statistics
import tempfile
import time
from pathlib import Path

import click
import cloudpickle
from rich.console import Console
from rich.table import Table

from ambrosia_py import eventloop
from ambrosia_py.bench.coordinator import measure_fsync_rate
from ambrosia_py.binding.files import StateFiles, sync_written, use_state_files
from ambrosia_py.testing.ports import free_port
from ambrosia_py.testing.processes import ServiceProcess, wait_for

from .hub_client import OckamClient, Publisher
from .hub_core import StreamHub
from .segments import StreamLog

__all__ = [
    "PAYLOAD_SIZE",
    "HubProcess",
    "measure_checkpoints",
    "measure_pulls",
    "measure_pushes",
    "ockam_bench",
    "payloads",
]

PAYLOAD_SIZE = 100
PULL_BATCH = 1000


def payloads(tag: str, count: int, size: int = PAYLOAD_SIZE) -> list[bytes]:
    """``count`` distinct payloads of ``size`` bytes (the publisher needs them unique)."""
    return [f"{tag}:{k}:".encode().ljust(size, b".") for k in range(count)]


class HubProcess(ServiceProcess):
    """One ``ambrosia-py run immortals.ockam.hub`` (and its coordinator child process),
    serving once :meth:`start` returns."""

    def __init__(self, data_dir: Path) -> None:
        self.port = free_port()
        super().__init__(
            "immortals.ockam.hub",
            "hub",
            data_dir,
            ["--listen", f"127.0.0.1:{self.port}"],
            log=data_dir / "hub.run.log",
        )

    def start(self, timeout: float = 60.0) -> None:
        super().start()

        def serving() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return True
            except OSError:
                self.check_alive()
                return False

        try:
            wait_for("the hub to accept connections", serving, timeout, self.tail)
        except BaseException:
            self.stop()
            raise


async def measure_pushes(port: int, stream_name: str, count: int, window: int) -> float:
    """Confirmed pushes per second: ``window`` 1 pushes one by one, more go pipelined."""
    data = payloads(stream_name, count)
    if window == 1:
        client = await OckamClient.connect("127.0.0.1", port)
        try:
            stream = await client.create(stream_name)
            start = time.perf_counter()
            for payload in data:
                await client.push(stream, payload, timeout=60)
            return count / (time.perf_counter() - start)
        finally:
            await client.close()
    publisher = Publisher("127.0.0.1", port, stream_name, window=window, retry_for=60)
    start = time.perf_counter()
    indexes = await publisher.publish(data)
    elapsed = time.perf_counter() - start
    if len(indexes) != count or publisher.reconnects:
        raise RuntimeError(f"{len(indexes)} of {count} confirmed, {publisher.reconnects} drops")
    return count / elapsed


async def measure_pulls(port: int, stream_name: str, count: int) -> tuple[float, float]:
    """(messages pulled per second, messages per pull) reading ``count`` from index 0."""
    client = await OckamClient.connect("127.0.0.1", port)
    try:
        stream = await client.create(stream_name)
        got = pulls = 0
        start = time.perf_counter()
        while got < count:
            batch = await client.pull(stream, got, PULL_BATCH, timeout=60)
            if not batch:
                raise RuntimeError(f"stream {stream_name} ended at {got} of {count}")
            got += len(batch)
            pulls += 1
        return got / (time.perf_counter() - start), got / pulls
    finally:
        await client.close()


def measure_checkpoints(messages: int, more: int, files_dir: Path) -> dict[str, float]:
    """Seconds and bytes of ``cloudpickle.dumps`` of a hub holding ``messages`` messages.

    Inline first (every segment's bytes in the pickle), then with state files: the
    first checkpoint writes every sealed segment's file, the second after ``more``
    pushes writes only the segments sealed since. Sizes exclude the segment files,
    which are reported apart.
    """
    hub = StreamHub()
    log = hub.streams[("bench", 0)] = StreamLog()
    data = b"m" * PAYLOAD_SIZE
    start = time.perf_counter()
    for k in range(messages):
        log.push(data, 1_700_000_000_000 + k)
    fill = time.perf_counter() - start
    out: dict[str, float] = {"messages": messages, "fill_s": fill}

    def dump(key: str) -> None:
        t0 = time.perf_counter()
        blob = cloudpickle.dumps(hub)
        sync_written()  # as the binding does before a checkpoint leaves it
        out[f"{key}_s"] = time.perf_counter() - t0
        out[f"{key}_bytes"] = len(blob)

    with use_state_files(None):
        dump("inline")
    files = StateFiles(files_dir)

    def files_bytes() -> int:
        return sum(p.stat().st_size for p in files_dir.iterdir()) if files_dir.exists() else 0

    with use_state_files(files):
        dump("first")
        out["first_files"] = len(log.segments)
        out["first_files_bytes"] = files_bytes()
        before = len(log.segments)
        for k in range(more):
            log.push(data, 1_800_000_000_000 + k)
        dump("second")
        out["second_files"] = len(log.segments) - before
        out["second_files_bytes"] = files_bytes() - out["first_files_bytes"]
    return out


def _runs_row(table: Table, label: str, count: str, rates: list[float]) -> None:
    table.add_row(
        label,
        count,
        f"{statistics.median(rates):,.0f}",
        ", ".join(f"{r:,.0f}" for r in rates),
    )


async def _throughput(
    port: int, runs: int, single: int, pipelined: int, pulled: int, warm_up: bool
) -> dict[str, list[float]]:
    figures: dict[str, list[float]] = {"push1": [], "push64": [], "pull": [], "per_pull": []}
    if warm_up:  # imports, cold caches, the coordinator's first records
        await measure_pushes(port, "warm-up", max(1, pipelined // 10), 64)
        await measure_pulls(port, "warm-up", max(1, pipelined // 10))
    # Filled once, read by every run: filling is the pipelined figure's business.
    await measure_pushes(port, "filled", pulled, 64)
    for i in range(runs):
        figures["push1"].append(await measure_pushes(port, f"single-{i}", single, 1))
        figures["push64"].append(await measure_pushes(port, f"pipelined-{i}", pipelined, 64))
        rate, per_pull = await measure_pulls(port, "filled", pulled)
        figures["pull"].append(rate)
        figures["per_pull"].append(per_pull)
    return figures


@click.command("ockam")
@click.option("--runs", default=3, show_default=True, help="Runs per figure (median shown).")
@click.option("--single", default=2_000, show_default=True, help="Pushes, one in flight.")
@click.option("--pipelined", default=50_000, show_default=True, help="Pushes, 64 in flight.")
@click.option("--pulled", default=100_000, show_default=True, help="Messages pulled per run.")
@click.option("--stored", default=1_000_000, show_default=True, help="Messages checkpointed.")
@click.option("--quick", is_flag=True, help="Tiny counts and one run: checks it works.")
def ockam_bench(
    runs: int, single: int, pipelined: int, pulled: int, stored: int, quick: bool
) -> None:
    """The Ockam hub over TCP with durable logging, and its checkpoints at 1M messages."""
    if quick:
        runs, single, pipelined, pulled, stored = 1, 20, 500, 1_500, 5_000
    more = 10_000 if not quick else 500
    console = Console(width=140)
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-ockam-") as tmp:
        syncs = measure_fsync_rate(Path(tmp), 0.2 if quick else 1.0)
        hub = HubProcess(Path(tmp) / "hub")
        with hub.running():
            figures = eventloop.run(
                _throughput(hub.port, runs, single, pipelined, pulled, warm_up=not quick)
            )
        table = Table(title="ockam hub over TCP: 100 B payloads, every frame durably logged")
        for col in ("figure", "messages", "per s (median)", f"runs ({runs})"):
            table.add_column(col, justify="right")
        _runs_row(table, "confirmed pushes, 1 in flight", f"{single:,}", figures["push1"])
        _runs_row(table, "confirmed pushes, 64 in flight", f"{pipelined:,}", figures["push64"])
        _runs_row(
            table,
            f"pulled (pulls of {PULL_BATCH}, ~{statistics.median(figures['per_pull']):,.0f} fit)",
            f"{pulled:,}",
            figures["pull"],
        )
        console.print(table)
        console.print(f"this machine's disk: {syncs:,.0f} fdatasync'ed 4 KiB writes/s")
        console.print(
            "targets: >= 20,000 confirmed pushes/s pipelined: "
            + ("met" if statistics.median(figures["push64"]) >= 20_000 else "NOT met")
        )
        cp = measure_checkpoints(stored, more, Path(tmp) / "state-files")
        _print_checkpoints(console, cp, more)


def _print_checkpoints(console: Console, cp: dict[str, float], more: int) -> None:
    table = Table(
        title=f"checkpoint (cloudpickle.dumps) of a StreamHub with {int(cp['messages']):,} "
        f"messages of {PAYLOAD_SIZE} B (filled by StreamLog.push in {cp['fill_s']:.1f} s)"
    )
    for col in ("checkpoint", "seconds", "pickle MB", "segment files written", "files MB"):
        table.add_column(col, justify="right")
    inline = _mb(cp["inline_bytes"])
    table.add_row("inline, no state files", f"{cp['inline_s']:.3f}", inline, "-", "-")
    table.add_row(
        "state files, first",
        f"{cp['first_s']:.3f}",
        _mb(cp["first_bytes"]),
        f"{int(cp['first_files']):,}",
        _mb(cp["first_files_bytes"]),
    )
    table.add_row(
        f"state files, after {more:,} more",
        f"{cp['second_s']:.3f}",
        _mb(cp["second_bytes"]),
        f"{int(cp['second_files']):,}",
        _mb(cp["second_files_bytes"]),
    )
    console.print(table)
    ok = cp["second_s"] < 1.0 and cp["first_s"] < 1.0 and cp["first_bytes"] < 10e6
    console.print(
        "target: a checkpoint at 1M messages under 1 s and under 10 MB beyond the segment "
        f"files: {'met' if ok else 'NOT met'} (first {cp['first_s']:.2f} s, "
        f"second {cp['second_s']:.2f} s, {_mb(cp['first_bytes'])} MB pickled)"
    )


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f}"
