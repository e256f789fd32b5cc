"""Two more network partitions of an immortal's replicas, with etcd choosing the primary.

The machines are those of ``tests/test_replicas_partition.py``: three replicas of the
counter, each in a network namespace of its own, cabled to a front network (callers,
ingress addresses) and a replication network (replica to replica).

A secondary cut off from the other replicas changes nothing its callers see: the primary
commits with the other secondary, a majority of two, in the same term. The cut-off one
still reaches etcd, and finds the primary silent, but takes no role over: none of the
replicas it asks agree (they cannot hear it, and would say no). Plugged in again,
the cut-off secondary is sent what it missed, and a counter it later serves as primary
holds every call exactly once.

A primary cut off from etcd and from the other replicas, but not from its callers, goes
on taking their calls; it loses its lease and can ship nothing, so it must answer
nothing it took since. For that etcd has a network of its own (``tests/netns.py``), and
the cut pulls the primary's etcd and replication cables, leaving its front one in. The
secondaries take over; healed, the old primary learns it was deposed (from a replica
that refuses its epoch, or from the registry) and stops; started again, it rejoins.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.primary import Term
from ambrosia_py.testing import wait_for
from ambrosia_py.testing.processes import process_gone
from tests import netns
from tests import test_replicas_failover as failover
from tests.test_replicas_failover import DEADLINE, Registry, counted_once, current_term
from tests.test_replicas_partition import (
    Partitionable,
    Replica,
    TracedCallers,
    newer_primary,
    position,
    rejoined,
    replica_machines,
    serving,
    stopped,
)

pytestmark = pytest.mark.timeout(300)


def test_a_secondary_cut_off_catches_up_and_later_serves_every_call_once(
    etcd_apart: Partitionable,
) -> None:
    replicas, registry, secret = etcd_apart
    callers = failover.Callers(registry, secret, 4)
    callers.start()
    try:
        callers.wait_answers(30)
        term = current_term(registry)
        assert term is not None
        primary = replicas[term.replica]
        cut, other = (r for r in replicas if r.replica != term.replica)

        # The primary commits with the other secondary alone, in the same term, for
        # longer than a secondary waits before it takes a silent primary's role over.
        # The cut-off secondary still reaches etcd, but none of the others: it asks
        # them whether they find the primary silent, hears no one agree, and waits.
        cut.host.cut()
        callers.wait_answers(100)
        committing_on(registry, term, primary)
        assert current_term(registry) == term, "the cut-off secondary took the role: " + "; ".join(
            re.findall(r"replica \d+ is primary .*", cut.process_output())
        )
        for replica in replicas:
            assert replica.process is not None
            replica.process.check_alive()
        healed_at = position(registry, primary)
        assert position(registry, cut) < healed_at  # as it published before the cut

        # Plugged in again, it is sent what it missed and follows on.
        cut.host.heal()
        wait_for(
            f"replica {cut.replica} to catch up past seq {healed_at}",
            lambda: position(registry, cut) > healed_at,
            DEADLINE,
        )
        callers.wait_answers(30)
        assert current_term(registry) == term
        for replica in replicas:
            assert replica.process is not None
            replica.process.check_alive()
        assert "is primary from epoch" not in cut.process_output()
        make_primary(registry, term, cut, other, primary, callers)
    finally:
        callers.stop()
    counted_once(callers)
    assert served_by(registry, cut)  # the count above is the one it holds


def make_primary(
    registry: Registry,
    term: Term,
    cut: Replica,
    other: Replica,
    primary: Replica,
    callers: failover.Callers,
) -> None:
    """Make ``cut`` primary. With ``other`` gone, the primary's records are committed on
    ``cut`` alone; then the primary goes too and ``other`` comes back. Its log lacks
    records ``cut`` holds, so no term of its own can be established: the role can only
    end with ``cut``."""
    assert other.process is not None and primary.process is not None
    other.process.kill("both")
    callers.wait_answers(30)
    primary.process.kill("both")
    # Started again once etcd has let its killed process's registration go.
    wait_for(
        f"replica {other.replica}'s lease to end", lambda: position(registry, other) < 0, DEADLINE
    )
    other.start()
    wait_for("a new primary", lambda: failover.newer_term(registry, term), DEADLINE)
    wait_for(f"replica {cut.replica} to serve", lambda: served_by(registry, cut), DEADLINE)
    callers.wait_answers(50)


def committing_on(registry: Registry, term: Term, primary: Replica) -> None:
    """Wait until ``primary``, of ``term``, has published a log position further on
    twice (it publishes about once a second: its log grew over at least one whole
    interval, far longer than a secondary waits on a silent primary), or the term ends."""
    for _ in range(2):
        seen = position(registry, primary)

        def further(seen: int = seen) -> bool:
            return position(registry, primary) > seen or current_term(registry) != term

        wait_for(f"the primary to publish a position past {seen}", further, DEADLINE)


def served_by(registry: Registry, replica: Replica) -> bool:
    """Whether ``replica`` holds the primary role now (and still runs)."""
    assert replica.process is not None
    replica.process.check_alive()
    term = current_term(registry)
    return term is not None and term.replica == replica.replica


@pytest.fixture
def etcd_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Partitionable]:
    """As ``partitionable`` in ``tests/test_replicas_partition.py``, but with etcd on
    a network of its own, every machine cabled to it, the callers reaching it from the
    root namespace."""
    yield from replica_machines(tmp_path, monkeypatch, etcd_network=True)


def joined(callers: TracedCallers, n: int) -> TracedCallers:
    """``n`` more callers whose answers go into the same lists as ``callers``'."""
    more = TracedCallers(callers.registry, callers.secret, n)
    more.answers, more.traced = callers.answers, callers.traced
    return more


def test_a_primary_cut_off_from_etcd_and_its_replicas_acknowledges_nothing_more(
    etcd_apart: Partitionable,
) -> None:
    replicas, registry, secret = etcd_apart
    callers = TracedCallers(registry, secret, 4)
    with contextlib.ExitStack() as running:
        callers.start()
        running.callback(callers.stop)
        term, old, coordinator = serving(replicas, registry, callers)
        old.host.cut(netns.ETCD, netns.REPLICATION)  # its callers still reach it
        cut = time.monotonic()
        new_term, new = newer_primary(replicas, registry, term)
        # Its lease runs out: etcd drops what it published (its replica key).
        wait_for(
            "the cut-off primary's lease to end", lambda: position(registry, old) < 0, DEADLINE
        )
        late = joined(callers, 2)  # started after the take-over: they find the new primary
        late.start()
        running.callback(late.stop)
        callers.wait_answers(20)
        assert callers.answered_by(new), "the new primary answers"
        print(f"before healing, the cut-off primary runs: {not process_gone(coordinator)}")

        # Healed, it finds it was deposed (a replica refuses its epoch, or the registry
        # names the new primary) and stops, its binding with it.
        old.host.heal(netns.ETCD, netns.REPLICATION)
        out = stopped(old, coordinator)
        print("it stopped:", next(line for line in out.splitlines() if "primary no more" in line))

        # Started again, it rejoins as a secondary and holds records of the new term.
        rejoined(old, registry, new_term)
        callers.wait_answers(20)
        assert current_term(registry) == new_term
    counted_once(callers)

    # Nothing made after the cut was answered by the cut-off primary; a call in flight
    # at the cut (at most one per caller) may have been, if committed before it.
    answered_late = [a for a in callers.answered_by(old) if a.answered > cut]
    print(f"the cut-off primary answered {len(answered_late)} calls after the cut")
    made_after = [a for a in answered_late if a.asked > cut]
    assert not made_after, f"the cut-off primary acknowledged {made_after} without a quorum"
    assert all(callers.answers.count(a.value) == 1 for a in answered_late)
