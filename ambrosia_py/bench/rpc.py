"""``ambrosia-py bench rpc``: calls through a real coordinator, with durable logging.

Fork throughput: one impulse makes a handler fork ``k`` self-calls with arguments of a
given size; the figure is ``k`` over the time until all ``k`` have run (each was logged
and fsynced by the coordinator before it ran). Round-trip latency: a handler awaits
self-calls one after the other; each reply is timestamped by an effect (handlers may
not read the clock), and the gaps between replies are the round trips. The same two
figures to another instance go through two coordinators and the links between them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..binding.immortal import Immortal, rpc
from ..testing.runner import ImmortalRunner
from .immortal_process import STAMPS, ImmortalProcess, stamp

__all__ = [
    "RpcBench",
    "RpcCaller",
    "RpcPeer",
    "measure_forks",
    "measure_remote",
    "measure_round_trips",
    "rpc_bench",
]


class RpcBench(Immortal):
    def __init__(self) -> None:
        self.received = 0
        self.rounds = 0

    @rpc
    def sink(self, data: bytes) -> None:
        self.received += 1

    @rpc
    def burst(self, k: int, size: int) -> None:
        data = b"x" * size
        for _ in range(k):
            self.me.sink.fork(data)

    @rpc
    def echo(self) -> int:
        return 1

    @rpc
    async def ping(self, k: int) -> None:
        for _ in range(k):
            await self.me.echo()
            self.effect(stamp)
            self.rounds += 1


class RpcPeer(Immortal):
    """The far end of the cross-instance figures: its own coordinator, a TCP link away."""

    def __init__(self) -> None:
        self.received = 0

    @rpc
    def sink(self, data: bytes) -> None:
        self.received += 1

    @rpc
    def echo(self) -> int:
        return 1


class RpcCaller(Immortal):
    class Options:
        peer: str = "peer"

    def __init__(self) -> None:
        self.rounds = 0

    @rpc
    def burst(self, k: int, size: int) -> None:
        peer = self.proxy(self.options.peer, RpcPeer)
        data = b"x" * size
        for _ in range(k):
            peer.sink.fork(data)

    @rpc
    async def ping(self, k: int) -> None:
        peer = self.proxy(self.options.peer, RpcPeer)
        for _ in range(k):
            await peer.echo()
            self.effect(stamp)
            self.rounds += 1


def measure_remote(
    data_dir: Path, k_forks: int, k_pings: int, suffix: str = "", size: int = 16
) -> tuple[float, list[float]]:
    """Forks per second to another instance (``size``-byte arguments), and awaited
    round trips to it: two immortals, each in a process of its own as deployed
    (:mod:`.immortal_process`), with their coordinators and the links between them."""
    peer = ImmortalProcess(data_dir, RpcPeer, f"remote-peer{suffix}")
    try:
        caller = ImmortalProcess(
            data_dir, RpcCaller, f"remote-caller{suffix}", peer=f"remote-peer{suffix}"
        )
        try:
            start = time.perf_counter()
            caller.impulse("burst", k_forks, size)
            forks = k_forks / (peer.wait_until_at_least("received", k_forks) - start)
            if not k_pings:
                return forks, []
            caller.impulse("ping", k_pings)
            caller.wait_until_at_least("rounds", k_pings)
            return forks, [b - a for a, b in itertools.pairwise(caller.stamps())]
        finally:
            caller.stop()
    finally:
        peer.stop()


def measure_forks(runner: ImmortalRunner, size: int, k: int, instance: str = "") -> float:
    """Durable self-call forks per second with ``size``-byte arguments."""
    svc = runner.start(RpcBench, instance or f"forks{size}")
    try:
        start = time.perf_counter()
        svc.impulse.burst(k, size)
        svc.wait_until(lambda s: s["received"] >= k, timeout=600)
        return k / (time.perf_counter() - start)
    finally:
        svc.stop()


def measure_round_trips(runner: ImmortalRunner, k: int) -> list[float]:
    """Round-trip times (seconds) of ``k`` sequential awaited self-calls."""
    svc = runner.start(RpcBench, "pings")
    try:
        STAMPS.clear()
        svc.impulse.ping(k)
        svc.wait_until(lambda s: s["rounds"] >= k, timeout=600)
        return [b - a for a, b in itertools.pairwise(STAMPS)]
    finally:
        svc.stop()


@contextlib.contextmanager
def _tls_links(directory: Path) -> Iterator[None]:
    """Links over mutual TLS: a throwaway CA and one certificate (made with the
    ``openssl`` command), given to the coordinators through their environment."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca, ca_key = directory / "ca.pem", directory / "ca.key"
    cert, key, csr = directory / "link.pem", directory / "link.key", directory / "link.csr"
    openssl("req", "-x509", *ec, "-keyout", str(ca_key), "-out", str(ca), "-subj", "/CN=ca")
    openssl("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", "/CN=link")
    openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key)),
        *("-CAcreateserial", "-out", str(cert)),
    )
    env = {"AMBROSIA_TLS_CERT": cert, "AMBROSIA_TLS_KEY": key, "AMBROSIA_TLS_CA": ca}
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update({name: str(path) for name, path in env.items()})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@click.command("rpc")
@click.option("--calls", default=50_000, show_default=True, help="Forks per small-size run.")
@click.option("--round-trips", default=2_000, show_default=True)
@click.option("--runs", default=3, show_default=True, help="Fork runs per size (median shown).")
@click.option("--tls", is_flag=True, help="Links over mutual TLS (needs the openssl command).")
@click.option("--remote-only", is_flag=True, help="Only the figures to another instance.")
def rpc_bench(calls: int, round_trips: int, runs: int, tls: bool, remote_only: bool) -> None:
    """Durable self-call fork throughput and async/await round-trip latency."""
    console = Console(width=120)
    with contextlib.ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="ambrosia-bench-rpc-"))
        if tls:
            stack.enter_context(_tls_links(Path(tmp)))
        runner = ImmortalRunner(Path(tmp))
        try:
            if not remote_only:
                _self_calls(console, runner, calls, round_trips, runs)
            remote = [measure_remote(Path(tmp), calls, round_trips, f"-{i}") for i in range(runs)]
            for forks, rtts in remote:
                rtts.sort()
                console.print(
                    f"to another instance (two coordinators, an authenticated TCP link each way"
                    f"{', TLS' if tls else ''}): {forks:,.0f} durable forks/s (16 B); "
                    f"async/await round trip p50 {statistics.median(rtts) * 1e3:.2f} ms, "
                    f"p99 {rtts[int(len(rtts) * 0.99) - 1] * 1e3:.2f} ms"
                )
        finally:
            runner.close()


def _self_calls(
    console: Console, runner: ImmortalRunner, calls: int, round_trips: int, runs: int
) -> None:
    table = Table(title="rpc: durable self-call forks through a real coordinator")
    for col in ("args", "calls", "calls/s (median)", f"runs ({runs})"):
        table.add_column(col, justify="right")
    # Not reported: the first run in a process pays for imports and cold caches.
    measure_forks(runner, 16, max(1, calls // 10), "warm-up")
    # Two processes share two cores with whatever else runs: one run says little.
    for size, k in ((16, calls), (1024, calls), (64 * 1024, max(1, calls // 25))):
        rates = [measure_forks(runner, size, k, f"forks{size}-{i}") for i in range(runs)]
        table.add_row(
            f"{size} B",
            f"{k:,}",
            f"{statistics.median(rates):,.0f}",
            ", ".join(f"{r:,.0f}" for r in rates),
        )
    console.print(table)
    rtts = sorted(measure_round_trips(runner, round_trips))
    p50 = statistics.median(rtts) * 1e3
    p99 = rtts[int(len(rtts) * 0.99) - 1] * 1e3
    console.print(
        f"async/await self-call round trip ({len(rtts):,} calls, two durable records "
        f"each): p50 {p50:.2f} ms, p99 {p99:.2f} ms"
    )
