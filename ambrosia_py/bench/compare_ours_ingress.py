"""Ours called from an ordinary program, for ``bench compare``: the work Restate and
Temporal are measured on.

A real ``ambrosia-py run ambrosia_py.bench.ingress:IngressBench --ingress`` (its
coordinator logging and ``fdatasync``ing every call before it runs, group-committed
across callers) in a temporary dir; callers are :class:`~ambrosia_py.client.Client`s,
one per thread, each calling ``IngressBench.add`` with one byte, so the counter's value
is the number of calls made (:mod:`.compare_callers` drives them). Every answer is
checked: a caller alone must see each call add exactly one (the counter's value is
then the number of calls made so far), callers together must each see the counter only
go up. After them, a batch of calls one after the other, each checked the first way,
has the service process's and its coordinator's syncs counted
(:func:`~.compare_peer_process.count_syncs`).
"""

from __future__ import annotations

import threading
from pathlib import Path

from ..client import Client
from ..testing import ServiceProcess, free_port
from .compare_callers import CallPlan, make_calls, measure_callers
from .compare_peer_process import count_syncs, descendants
from .ingress import IngressBench

__all__ = ["OursCaller", "Tally", "measure_ours_client"]

SERVICE = "ambrosia_py.bench.ingress:IngressBench"


class Tally:
    """The calls all callers made, and so what the counter must hold."""

    def __init__(self) -> None:
        self.made = 0
        self.lock = threading.Lock()


class OursCaller:
    """One :class:`Client` of its own; ``exact``: the only caller, so each answer is
    the one before plus one."""

    def __init__(self, address: str, data_dir: Path, tally: Tally, exact: bool) -> None:
        self.client = Client(address, data_dir=data_dir)
        self.tally = tally
        self.exact = exact
        self.made = 0
        self.last = 0

    def call(self) -> None:
        value = self.client.call(IngressBench.add, b"x")
        with self.tally.lock:
            self.tally.made += 1
            expected = self.tally.made
        if not isinstance(value, int) or value <= self.last or (self.exact and value != expected):
            raise RuntimeError(f"ours: the counter answered {value!r} after {self.last}")
        self.last = value
        self.made += 1

    def close(self) -> None:
        self.client.close()


def measure_ours_client(directory: Path, plan: CallPlan) -> dict[str, float]:
    """The :mod:`.compare_callers` figures for ours through the ingress, and
    ``client_syncs_per_call`` where the syncs could be counted."""
    address = f"127.0.0.1:{free_port()}"
    svc = ServiceProcess(SERVICE, "counter", directory, ["--ingress", address])
    tally = Tally()
    svc.start()
    try:
        svc.wait_for_log("ingress listening on")
        figures = measure_callers(
            lambda i: OursCaller(address, directory, tally, exact=i == 0), plan
        )
        if svc.proc is None:
            raise RuntimeError("the service is not running")
        one = OursCaller(address, directory, tally, exact=True)
        try:
            one.last = tally.made
            _, syncs = count_syncs(
                descendants(svc.proc.pid),
                directory / "syncs",
                lambda: make_calls(one, plan.sync_batch),
            )
        finally:
            one.close()
        if syncs is not None:
            figures["client_syncs_per_call"] = syncs / plan.sync_batch
        return figures
    finally:
        svc.stop()
