"""Failover time of a replicated instance, as a program calling it sees it.

Three replicas of the counter (:mod:`.replica_cluster`) meet in one registry; a program
calls ``IngressBench.add(b"x")`` in a loop through ``Client.connect(instance=...)``,
which finds the ingress in the registry before each connection it makes and sends a
call whose connection failed again with its key. Round after round, every process of
the primary's machine is SIGKILLed and its disk deleted; the figure is the time from
the kill to the first answer after it, taken at the caller: the secondaries noticing
the silence, the take-over in the registry, the new term established with a quorum, the
recovery, the ingress published, and the caller finding and reaching it. Between
rounds the lost replica comes back empty and catches up (it is sent the checkpoint),
so each round starts from three replicas.

An answer counts as "after the kill" only if its call was sent after it, or sent again
after its connection failed: an answer the old primary wrote just before it died, read
just after, would otherwise count as a failover of no time at all.

The caller retries after at most 50 ms (``max_backoff``), not the client's default of
up to 2 s, which would measure the backoff rather than the failover; a caller that
cares about failover time sets it so. It is the only caller, so each answer must be
the one before plus one: a call lost or run twice in a failover fails the measure. The
client's warnings that its connection failed and is back are held back meanwhile:
here they are the measure, not news.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import threading
import time
from collections.abc import Iterator

import attrs

from ..client import Client
from ..coordinator.registry.primary import Term
from ..testing import wait_for
from .ingress import IngressBench
from .replica_cluster import ReplicaGroup

__all__ = ["MAX_BACKOFF", "FailoverFigures", "FailoverRound", "TimedCaller", "measure_failover"]

MAX_BACKOFF = 0.05  # seconds between a caller's attempts to reach the service, at most


@attrs.frozen
class FailoverRound:
    """One lost primary: how long the caller went unanswered, and the terms before and
    after (their epochs, from the registry's store; the later must be higher)."""

    seconds: float
    lost_replica: int
    epoch_before: int
    new_replica: int
    epoch_after: int


@attrs.frozen
class FailoverFigures:
    """The rounds in one registry (``"sqlite"`` or ``"etcd"``), and the calls the caller
    had answered beside what the counter counted meanwhile (equal: each counted once)."""

    registry: str
    rounds: tuple[FailoverRound, ...]
    calls: int
    counter: int

    @property
    def min_s(self) -> float:
        return min(r.seconds for r in self.rounds)

    @property
    def median_s(self) -> float:
        return statistics.median(r.seconds for r in self.rounds)

    @property
    def max_s(self) -> float:
        return max(r.seconds for r in self.rounds)


@attrs.frozen
class _Answer:
    started: float  # time.perf_counter when the call was made
    ended: float  # and when its answer came
    resent: bool  # sent again after its connection failed


class TimedCaller:
    """One program calling ``IngressBench.add(b"x")`` by name in a loop, on a thread of
    its own, each answer timed and checked to be the one before plus one."""

    def __init__(self, group: ReplicaGroup, timeout: float) -> None:
        self.timeout = timeout
        self.client = Client.connect(
            instance=group.instance,
            registry=group.registry,
            cluster=group.cluster,
            secret_file=group.secret,
            timeout=timeout,
            max_backoff=MAX_BACKOFF,
        )
        self.first = 0  # the counter's value before the first call
        self.answers: list[_Answer] = []
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="failover caller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        try:
            last = self.first = self.client.call(IngressBench.add, b"")  # adds nothing
            while not self._stop.is_set():
                resent = self.client.resent
                started = time.perf_counter()
                value = self.client.call(IngressBench.add, b"x")
                ended = time.perf_counter()
                if value != last + 1:
                    raise RuntimeError(f"the counter answered {value!r} after {last}")
                last = value
                with self._lock:
                    self.answers.append(_Answer(started, ended, self.client.resent != resent))
        except BaseException as exc:  # reported by the measuring thread
            self.errors.append(exc)

    def _check(self) -> None:
        if self.errors:
            raise RuntimeError(f"the caller failed: {self.errors[0]!r}") from self.errors[0]

    def wait_answers(self, more: int) -> None:
        """Wait until ``more`` calls more have been answered."""
        target = len(self.answers) + more

        def enough() -> bool:
            self._check()
            return len(self.answers) >= target

        wait_for(f"{more} more answers", enough, self.timeout)

    def first_answer_after(self, moment: float) -> float:
        """When the first call sent after ``moment`` (or sent again after it, its
        connection lost) was answered; waits for it."""
        found: list[float] = []

        def answered() -> bool:
            self._check()
            with self._lock:
                found.extend(
                    a.ended
                    for a in self.answers
                    if a.ended > moment and (a.started > moment or a.resent)
                )
            return bool(found)

        wait_for("an answer after the kill", answered, self.timeout)
        return min(found)

    def stop(self) -> int:
        """Stop calling; the number of calls answered."""
        self._stop.set()
        self._thread.join(self.timeout)
        self._check()
        if self._thread.is_alive():
            raise TimeoutError(f"the caller's last call took more than {self.timeout:g} s")
        return len(self.answers)

    def counter(self) -> int:
        """The counter's value now (a call that adds nothing)."""
        value: int = self.client.call(IngressBench.add, b"")
        return value

    def close(self) -> None:
        """Stop calling (a call under way fails, unreported) and close the client."""
        self._stop.set()
        self.client.close()
        if self._thread.ident is not None:  # started
            self._thread.join(self.timeout)


@contextlib.contextmanager
def _client_warnings_held() -> Iterator[None]:
    """The client's log at errors only, for the block."""
    logger = logging.getLogger("ambrosia_py.client")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _lose_primary(group: ReplicaGroup, caller: TimedCaller) -> FailoverRound:
    """One round: lose the primary's machine, time the first answer after it, and read
    the new term; the lost machine is left down."""
    before = group.current()
    if before is None:
        raise RuntimeError("no replica holds the primary role")
    killed_at = group.machines[before.replica].lose()
    answered = caller.first_answer_after(killed_at)
    after: list[Term] = []

    def newer() -> bool:
        term = group.current()
        if term is not None and term.epoch > before.epoch:
            after.append(term)
        return bool(after)

    wait_for("a term after the lost one", newer, caller.timeout)
    return FailoverRound(
        seconds=answered - killed_at,
        lost_replica=before.replica,
        epoch_before=before.epoch,
        new_replica=after[0].replica,
        epoch_after=after[0].epoch,
    )


def measure_failover(
    group: ReplicaGroup,
    name: str,
    *,
    rounds: int,
    answers_between: int,
    cap_s: float,
    timeout: float,
    answers_after: int | None = None,
) -> FailoverFigures:
    """Up to ``rounds`` failovers of ``group`` (started here, stopped by the caller),
    none begun after ``cap_s`` seconds (at least one), with ``answers_between`` answers
    before each and ``answers_after`` (default the same) after each; every wait fails
    past ``timeout``."""
    group.start(timeout)
    caller = TimedCaller(group, timeout)
    with _client_warnings_held():
        try:
            caller.start()
            caller.wait_answers(answers_between)
            done: list[FailoverRound] = []
            began = time.monotonic()
            while len(done) < rounds and (not done or time.monotonic() - began < cap_s):
                done.append(_lose_primary(group, caller))
                caller.wait_answers(answers_between if answers_after is None else answers_after)
                group.rejoin(group.machines[done[-1].lost_replica], timeout)
            calls = caller.stop()
            counter = caller.counter() - caller.first
        finally:
            caller.close()
    return FailoverFigures(name, tuple(done), calls, counter)
