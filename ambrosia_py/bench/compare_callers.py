"""Ordinary programs calling a durable counter, for ``bench compare``: the same load on
every party.

A party (ours through the ingress, Restate through its HTTP ingress, Temporal through
its client) gives a way to open a *caller*: one connection of its own and a counter of
its own (ours: the one instance's counter; Restate: a Virtual Object keyed per caller;
Temporal: the value each workflow's activity adds one to). A caller's :meth:`Caller.call`
makes one durable call, waits for its answer, and raises if the answer is not the one
the calls so far make right; :attr:`Caller.made` counts them. This module drives them
the same way for everyone:

- **sequential**: one caller, one call after the other, up to ``sequential`` calls or
  until ``sequential_cap_s`` has passed (Temporal's take a fifth of a second each):
  p50 and p99 of the calls' latencies, and calls/s;
- **concurrent**: ``callers`` threads, each with a caller of its own, calling until
  ``concurrent_cap_s`` has passed: calls/s of them all.

Threads, not tasks: each caller blocks in its own client as an ordinary program would,
and a thread per connection is what 16 such programs amount to.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import threading
import time
from collections.abc import Callable
from typing import Protocol

import attrs

from .ingress import percentile

__all__ = ["CallPlan", "Caller", "make_calls", "measure_callers", "median_gap_ms"]


class Caller(Protocol):
    """One program's connection to a durable counter."""

    made: int

    def call(self) -> None:
        """One durable call, answered; raises if the answer is wrong."""

    def close(self) -> None: ...


@attrs.frozen
class CallPlan:
    """How much each party does in one run (counts, and time caps that bound them); the
    defaults are the full bench's."""

    sequential: int = 300
    sequential_cap_s: float = 8.0
    concurrent_cap_s: float = 5.0
    callers: int = 16
    awaits: int = 100  # one service awaiting another: calls, one after the other
    sync_batch: int = 20  # calls in the batch whose syncs are counted
    warm_up: int = 5


def measure_callers(open_caller: Callable[[int], Caller], plan: CallPlan) -> dict[str, float]:
    """``client_p50_ms``, ``client_p99_ms``, ``client_calls_per_s`` (one caller) and
    ``client_concurrent_calls_per_s`` (``plan.callers`` callers); each caller is closed
    after, and checked to have made the calls counted."""
    first = open_caller(0)
    try:
        for _ in range(plan.warm_up):
            first.call()
        latencies: list[float] = []
        start = time.perf_counter()
        deadline = start + plan.sequential_cap_s
        while len(latencies) < plan.sequential and (
            not latencies or time.perf_counter() < deadline
        ):
            began = time.perf_counter()
            first.call()
            latencies.append(time.perf_counter() - began)
        sequential_rate = len(latencies) / (time.perf_counter() - start)
    finally:
        first.close()
    return {
        "client_p50_ms": percentile(latencies, 50) * 1e3,
        "client_p99_ms": percentile(latencies, 99) * 1e3,
        "client_calls_per_s": sequential_rate,
        "client_concurrent_calls_per_s": _concurrent(open_caller, plan),
    }


def _concurrent(open_caller: Callable[[int], Caller], plan: CallPlan) -> float:
    """Calls per second of ``plan.callers`` threads calling until the cap."""
    callers: list[Caller] = []
    errors: list[BaseException] = []
    try:
        for i in range(plan.callers):
            callers.append(open_caller(1 + i))
        ready = threading.Barrier(plan.callers + 1)
        stop = threading.Event()
        counts = [0] * plan.callers

        def run(i: int) -> None:
            with contextlib.suppress(threading.BrokenBarrierError):
                ready.wait()
            try:
                while True:  # at least one call each, however late the thread starts
                    callers[i].call()
                    counts[i] += 1
                    if stop.is_set():
                        break
            except BaseException as exc:  # reported below, in the measuring thread
                errors.append(exc)
                stop.set()

        threads = [
            threading.Thread(target=run, args=(i,), daemon=True) for i in range(plan.callers)
        ]
        for thread in threads:
            thread.start()
        ready.wait()
        start = time.perf_counter()
        stop.wait(plan.concurrent_cap_s)
        stop.set()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - start
    finally:
        for caller in callers:
            caller.close()
    if errors:
        raise RuntimeError(f"a concurrent caller failed: {errors[0]!r}") from errors[0]
    # Calls that ended after the cap count, and so does the time they took.
    return sum(counts) / elapsed


def make_calls(caller: Caller, count: int) -> None:
    """``count`` calls, one after the other (a batch whose syncs are counted)."""
    for _ in range(count):
        caller.call()


def median_gap_ms(*series: list[float]) -> float:
    """The median time between consecutive timestamps of each series (seconds in, ms
    out): the time each awaited call took, where a handler stamps each answer."""
    gaps = [b - a for stamps in series for a, b in itertools.pairwise(stamps)]
    if not gaps:
        raise ValueError("at least two timestamps make a gap")
    return statistics.median(gaps) * 1e3
