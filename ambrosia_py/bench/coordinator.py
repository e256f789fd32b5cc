"""``ambrosia-py bench coordinator``: durable self-call throughput through a real IC.

A coordinator process runs in a temporary data directory; this process attaches to it as
a raw binding, does the first-start handshake, then streams self-call forks (from a
sender thread) while reading back the records the coordinator forwards — each one
written and ``fdatasync``ed before it was forwarded. Beside it, the same run measures
the disk: small ``fdatasync``ed writes per second, and sequential write bandwidth with
an ``fdatasync`` every 4 MiB, probed before and after each 64 KiB run (see
:func:`compare_with_raw`).
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..coordinator.core.binding_auth import Socket, encode_preamble, token_for_ready_line
from ..coordinator.core.process import coordinator_argv
from ..wire import (
    Checkpoint,
    InitialMessage,
    OutgoingRpc,
    RecordReader,
    RpcType,
    encode_message,
)
from .compare_floor import allocate_ahead

__all__ = [
    "compare_with_raw",
    "coordinator",
    "measure_bandwidth",
    "measure_coordinator",
    "measure_disk",
    "measure_fsync_rate",
    "measure_prealloc_fsync_rate",
]


def _synced_writes(
    directory: Path, size: int, seconds: float, preallocate: int = 0
) -> tuple[int, float]:
    """Write ``size`` random bytes and ``fdatasync``, again and again for ``seconds``: at
    the end of the file, or over ``preallocate`` bytes allocated ahead (where the platform
    can; at most that many bytes then). Returns (writes, seconds taken)."""
    path = directory / "disk-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        if preallocate:
            allocate_ahead(fd, preallocate)
        block = os.urandom(size)
        most = preallocate // size if preallocate else None
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds and n != most:
            os.write(fd, block)
            os.fdatasync(fd)
            n += 1
        return n, time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()


def measure_fsync_rate(directory: Path, seconds: float = 1.0) -> float:
    """``fdatasync``ed 4 KiB appends per second: the ceiling on records per second."""
    n, took = _synced_writes(directory, 4096, seconds)
    return n / took


def measure_prealloc_fsync_rate(directory: Path, seconds: float = 1.0, size: int = 256) -> float:
    """``fdatasync``ed ``size``-byte writes per second into space the file already has
    (``posix_fallocate``d ahead, as a coordinator's log is): no new file size to commit
    with each sync. Appends where the platform cannot preallocate."""
    n, took = _synced_writes(directory, size, seconds, preallocate=64 * 1024 * 1024)
    return n / took


def measure_bandwidth(directory: Path, seconds: float = 1.0) -> float:
    """Raw sequential write bandwidth in MB/s: 4 MiB appends, each ``fdatasync``ed."""
    chunk = 4 * 1024 * 1024
    n, took = _synced_writes(directory, chunk, seconds)
    return n * chunk / took / 1e6


def measure_disk(directory: Path, seconds: float = 1.0) -> tuple[float, float]:
    """(fdatasync'ed 4 KiB writes per second, MB/s writing 4 MiB then fdatasync)."""
    return measure_fsync_rate(directory, seconds), measure_bandwidth(directory, seconds)


def compare_with_raw(
    arg_size: int, count: int, data_dir: Path, rounds: int = 3
) -> tuple[list[dict[str, float]], list[float], list[float]]:
    """Coordinator runs interleaved with raw bandwidth probes: raw, run, raw, run, ... raw.

    The disk of a virtual machine swings by a factor of two or more from one second to
    the next, so one raw figure taken before the runs says little about the runs. Each
    run is compared with the mean of the probes just before and just after it. Returns
    (the runs' figures, the raw probes, the per-run ratios of coordinator to raw MB/s).
    """
    data_dir.mkdir(parents=True, exist_ok=True)
    raws = [measure_bandwidth(data_dir)]
    runs = []
    for i in range(rounds):
        runs.append(measure_coordinator(arg_size, count, data_dir / f"round-{i}"))
        raws.append(measure_bandwidth(data_dir))
    ratios = [r["mb_per_s"] / ((raws[i] + raws[i + 1]) / 2) for i, r in enumerate(runs)]
    return runs, raws, ratios


def _connect(port: int, deadline: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port))
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)


def measure_coordinator(arg_size: int, count: int, data_dir: Path) -> dict[str, float]:
    """Stream ``count`` self-call forks with ``arg_size``-byte arguments through an IC."""
    proc = subprocess.Popen(
        coordinator_argv("bench", data_dir),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("ready"):
            line = proc.stdout.readline()
        fields = dict(kv.split("=") for kv in line.split() if "=" in kv)
        deadline = time.monotonic() + 30
        token = token_for_ready_line(fields, data_dir, "bench")
        to_ic = _connect(int(fields["receive_port"]), deadline)
        if token is not None:
            to_ic.sendall(encode_preamble(token, Socket.RECEIVE))
        from_ic = _connect(int(fields["send_port"]), deadline)
        if token is not None:
            from_ic.sendall(encode_preamble(token, Socket.SEND))
        reader = RecordReader(max_record_size=1 << 30)

        def records() -> int:
            while True:
                rec = reader.next_record()
                if rec is not None:
                    return len(rec.messages)
                data = from_ic.recv(1 << 20)
                if not data:
                    raise RuntimeError("coordinator closed the connection")
                reader.feed(data)

        records()  # TakeBecomingPrimaryCheckpoint
        to_ic.sendall(encode_message(InitialMessage(b"bench")) + encode_message(Checkpoint(b"")))
        records()  # record 0
        msg = encode_message(OutgoingRpc("", 1, RpcType.FORK, os.urandom(arg_size)))
        per_send = max(1, (256 * 1024) // len(msg))

        def send() -> None:
            left = count
            while left:
                n = min(per_send, left)
                to_ic.sendall(msg * n)
                left -= n

        start = time.perf_counter()
        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        got = batches = 0
        while got < count:
            got += records()
            batches += 1
        elapsed = time.perf_counter() - start
        sender.join()
        to_ic.close()
        from_ic.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return {
        "arg_size": arg_size,
        "messages_per_s": count / elapsed,
        "records_per_s": batches / elapsed,
        "mb_per_s": count * len(msg) / elapsed / 1e6,
        "messages_per_record": count / batches,
    }


@click.command()
@click.option("--messages", default=200_000, show_default=True, help="Small messages per run.")
@click.option(
    "--rounds", default=3, show_default=True, help="64 KiB runs, each between two raw probes."
)
def coordinator(messages: int, rounds: int) -> None:
    """Durable self-call throughput through a real coordinator, beside raw disk figures."""
    console = Console(width=160)
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-") as tmp:
        syncs = measure_fsync_rate(Path(tmp))
        table = Table(title="coordinator: self-call forks, durable (write + fdatasync per record)")
        for col in ("args", "messages", "msg/s", "MB/s", "records/s", "msg/record"):
            table.add_column(col, justify="right")

        def row(size: int, n: int, r: dict[str, float]) -> None:
            table.add_row(
                f"{size} B",
                f"{n:,}",
                f"{r['messages_per_s']:,.0f}",
                f"{r['mb_per_s']:,.1f}",
                f"{r['records_per_s']:,.0f}",
                f"{r['messages_per_record']:,.0f}",
            )

        for size, n in ((16, messages), (1024, messages // 4)):
            row(size, n, measure_coordinator(size, n, Path(tmp) / f"run-{size}"))
        big = 64 * 1024
        runs, raws, ratios = compare_with_raw(big, 12000, Path(tmp) / "big", rounds)
        for r in runs:
            row(big, 12000, r)
        console.print(table)
        console.print(f"this machine's disk: {syncs:,.0f} fdatasync'ed 4 KiB writes/s")
        console.print(
            "raw sequential writes (4 MiB, each fdatasync'ed), probed around the 64 KiB runs: "
            + ", ".join(f"{b:,.0f}" for b in raws)
            + " MB/s"
        )
        console.print(
            "64 KiB runs as a share of the raw bandwidth around them: "
            + ", ".join(f"{100 * x:.0f}%" for x in ratios)
            + f"; median {100 * statistics.median(ratios):.0f}%"
        )
