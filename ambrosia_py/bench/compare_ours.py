"""Ours, for ``bench compare``: calls between two immortals, recovery, failover, memory.

- **Forks and awaited calls to another instance**: two coordinators (each logging and
  ``fdatasync``ing every input before its binding sees it) and the link between them;
  forks are :func:`~ambrosia_py.bench.rpc.measure_remote`'s, with the argument size
  varied; awaited calls carry a ``size``-byte argument and return an int, one after the
  other, each reply timestamped by an effect (handlers may not read the clock).
- **Replay**: an instance with a long log (``k`` impulses, 16 B each, group-committed
  as they came) is SIGKILLed and started again; recovery replays every logged call
  through its handler. The replay rate is the calls replayed over the time the replay
  took, by the coordinator's clock (from the start of recovery until the binding,
  having handled every record, sends its checkpoint as primary), less the same for an
  instance whose log is one call (handshake and checkpoint cost the same for both).
  Not a burst of forks from one handler: replaying that regenerates all its outputs at
  once, so it would time their regeneration too, not the replay alone.
- **Failover**: a real ``ambrosia-py run`` with an ingress; SIGKILL the service
  process, run the same command again, and time from the kill until a client's call is
  answered (the coordinator notices its binding is gone and exits; the new start
  recovers; the client retries with a short backoff). Bytecode is cached, as for an
  installed service, even where the environment says not to write it.
- **Memory**: the resident set of that service process and of its coordinator, idle
  (after a few calls) and at its peak (``VmHWM``) after a load of calls through the
  ingress, 64 in flight.
"""

from __future__ import annotations

import itertools
import os
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from .. import eventloop
from ..binding.immortal import rpc
from ..client import AsyncClient, Client
from ..testing import ImmortalRunner, ServiceProcess, free_port
from .immortal_process import ImmortalProcess, stamp
from .ingress import IngressBench, measure_calls
from .rpc import RpcBench, RpcCaller, RpcPeer, measure_remote

__all__ = [
    "CompareCaller",
    "ComparePeer",
    "measure_awaits",
    "measure_failover_and_memory",
    "measure_remote_forks",
    "measure_replay",
]


class ComparePeer(RpcPeer):
    """:class:`RpcPeer` with a handler that takes an argument of any size."""

    @rpc
    def take(self, data: bytes) -> int:
        self.received += 1
        return len(data)


class CompareCaller(RpcCaller):
    """:class:`RpcCaller` with awaited calls that carry a ``size``-byte argument."""

    @rpc
    async def ping_sized(self, k: int, size: int) -> None:
        peer = self.proxy(self.options.peer, ComparePeer)
        data = b"x" * size
        for _ in range(k):
            await peer.take(data)
            self.effect(stamp)
            self.rounds += 1


def measure_remote_forks(data_dir: Path, size: int, k: int, suffix: str) -> float:
    """Durable forks per second to another instance with ``size``-byte arguments."""
    forks, _ = measure_remote(data_dir, k, 0, suffix, size)
    return forks


def measure_awaits(
    data_dir: Path, sizes: Sequence[int], k: int, suffix: str, timeout: float
) -> dict[int, tuple[float, float]]:
    """Awaited calls to another instance, one after the other, ``k`` per size (one pair
    of instances for all sizes: starting one costs seconds): ``{size: (calls/s, p50 s)}``.
    Each immortal runs in a process of its own (:mod:`.immortal_process`)."""
    peer = ImmortalProcess(data_dir, ComparePeer, f"await-peer{suffix}", timeout=timeout)
    out = {}
    try:
        caller = ImmortalProcess(
            data_dir,
            CompareCaller,
            f"await-caller{suffix}",
            timeout=timeout,
            peer=f"await-peer{suffix}",
        )
        try:
            for i, size in enumerate(sizes):
                start = time.perf_counter()
                caller.impulse("ping_sized", k, size)
                caller.wait_until_at_least("rounds", (i + 1) * k)
                stamps = caller.stamps()
                elapsed = stamps[-1] - start
                gaps = [b - a for a, b in itertools.pairwise(stamps)] or [elapsed]
                out[size] = (k / elapsed, statistics.median(gaps))
            return out
        finally:
            caller.stop()
    finally:
        peer.stop()


def _replayed(ic_log: Path, timeout: float = 30.0) -> tuple[int, float]:
    """What the coordinator's last start said: the records it replayed, and how long after
    recovery began the binding had handled them all (``Coordinator.recover``'s lines; the
    second comes once the coordinator has the checkpoint the binding sent as it became
    primary, so it may follow the binding's start by a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        text = ic_log.read_text(errors="replace")
        records = re.findall(r"replayed (\d+) records", text)
        took = re.findall(r"the binding handled the replay ([0-9.]+) s after", text)
        if records and took:
            return int(records[-1]), float(took[-1])
        if time.monotonic() > deadline:
            raise RuntimeError(f"{ic_log} does not say what it replayed and when it was handled")
        time.sleep(0.01)  # polling the coordinator's log, with a deadline


def _restart_time(runner: ImmortalRunner, instance: str, k: int) -> tuple[float, int, float]:
    """Log ``k`` impulses, SIGKILL, start again: (seconds until primary, records
    replayed, seconds the replay took by the coordinator's clock)."""
    svc = runner.start(RpcBench, instance)
    data = b"x" * 16
    for _ in range(k):
        svc.impulse.sink(data)
    svc.wait_until(lambda s: s["received"] >= k, timeout=600)
    svc.kill()
    start = time.perf_counter()
    again = runner.start(RpcBench, instance)  # returns once it is primary: replay done
    elapsed = time.perf_counter() - start
    try:
        received = again.state["received"]
        if received != k:
            raise RuntimeError(f"{instance}: replay restored {received} calls, logged {k}")
        records, replay = _replayed(again.ic_log)
        return elapsed, records, replay
    finally:
        again.stop()


def measure_replay(runner: ImmortalRunner, k: int, suffix: str) -> dict[str, float]:
    """Replay rate after SIGKILL: calls and log records per second, and the restart time.

    The rate is timed by the coordinator, from the start of recovery until the binding's
    checkpoint as primary arrives (it follows every replayed record), less the same for a
    log of one call: process start-up, which varies by a tenth of a second from start to
    start, is left out, and so are the fixed costs of recovery.
    """
    _, _, base = _restart_time(runner, f"replay-base{suffix}", 1)
    long, records, replay_s = _restart_time(runner, f"replay{suffix}", k)
    replay = max(replay_s - base, 1e-6)
    return {
        "replay_calls_per_s": (k - 1) / replay,
        "replay_records_per_s": records / replay,
        "replay_records": float(records),
        "recovery_s": long,
    }


def _memory_mib(pid: int | None) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MiB."""
    if pid is None:
        raise RuntimeError("no such process to measure")
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    rss, peak = (int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM"))
    return rss, peak


def _with_bytecode_cache(prefix: Path) -> dict[str, str]:
    """This environment with compiled bytecode cached under ``prefix``. A machine that
    sets ``PYTHONDONTWRITEBYTECODE`` makes both processes of every start compile the whole
    package again (a large part of a failover), which an installed service
    does not pay; the first start fills the cache, the restart measured reads it."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(prefix)
    return env


def measure_failover_and_memory(directory: Path, load_calls: int) -> dict[str, float]:
    """Failover time after SIGKILL of the service process, and the memory figures."""
    address = f"127.0.0.1:{free_port()}"
    svc = ServiceProcess(
        "ambrosia_py.bench.ingress:IngressBench",
        "memory",
        directory,
        ["--ingress", address],
        env=_with_bytecode_cache(directory / "pycache"),
    )
    svc.start()
    try:
        svc.wait_for_log("ingress listening on")
        with Client(address, data_dir=directory, max_backoff=0.05) as client:
            for _ in range(10):
                client.call(IngressBench.add, b"x" * 16)
        figures: dict[str, float] = {}
        figures["rss_idle_service_mib"], _ = _memory_mib(svc.proc.pid if svc.proc else None)
        figures["rss_idle_coordinator_mib"], _ = _memory_mib(svc.coordinator_pid())

        async def load() -> None:
            async with AsyncClient(address, data_dir=directory) as client:
                await measure_calls(client, load_calls, 64)

        eventloop.run(load())
        _, figures["rss_load_service_mib"] = _memory_mib(svc.proc.pid if svc.proc else None)
        _, figures["rss_load_coordinator_mib"] = _memory_mib(svc.coordinator_pid())

        start = time.perf_counter()
        svc.kill("service")
        svc.start()
        with Client(address, data_dir=directory, max_backoff=0.05) as client:
            client.call(IngressBench.add, b"x" * 16)
        figures["failover_s"] = time.perf_counter() - start
        return figures
    finally:
        svc.stop()
