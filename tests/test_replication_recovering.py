"""A replica that lost its disk, on cores driven by hand: it starts empty and recovering,
its positions say so and no new term counts them (but the founding term), and it counts
again once its log is durable up to where the primary's log ended when it synced it.

Why it matters (the simulation finds it too, in tests/test_replication_sim.py): with 3
replicas committing on 2, a record durable on the primary and on replica 1 is
committed. Replica 1's machine is lost and comes back empty; the primary fails; replica
2, which never got the record, takes the role. Were replica 1's empty position counted,
replica 2 would have its quorum of 2 and go on without the record.
"""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    Append,
    CheckpointChunk,
    Established,
    History,
    InstallCheckpoint,
    Position,
    Recovered,
    ReplicationRuleError,
    SaveEpoch,
    Secondary,
    Sync,
    WriteRecords,
)
from tests.test_replication_rules import GROUP, ONE, primary, recs, secondary, sent

EMPTY = History()
ME = 77  # the incarnation replica 1 picked as it started again


def lost_and_back() -> Secondary:
    """Replica 1 started with an empty data dir: no log, no history, recovering."""
    return secondary(0, EMPTY, 0, recovering=True, incarnation=ME)


def test_a_new_term_does_not_count_a_recovering_position() -> None:
    p = primary()  # replica 0, epoch 5, its log at 10; 2 of 3 make a term
    p.events()
    p.receive(1, Position(5, 0, EMPTY, GROUP, recovering=True), 0.01)
    assert p.state.name == "GATHERING" and p.events() == []
    p.receive(2, Position(5, 8, ONE, GROUP), 0.02)  # one that vouches for its log
    assert p.state.name == "ESTABLISHED"
    assert Established(5, 10) in p.events()


def test_recovering_positions_alone_never_establish_a_term() -> None:
    p = primary()
    p.events()
    for r in (1, 2):
        p.receive(r, Position(5, 0, EMPTY, GROUP, recovering=True), 0.01)
    assert p.state.name == "GATHERING"  # waits (then lapses), never established by them


def test_the_founding_term_counts_them_every_replica_but_the_founder_starts_empty() -> None:
    founder = primary(epoch=1, history=EMPTY, end=1, founding=True)
    founder.events()
    founder.receive(1, Position(1, 0, EMPTY, GROUP, recovering=True), 0.01)
    assert founder.state.name == "ESTABLISHED"


def test_its_positions_say_it_recovers_until_it_holds_the_synced_log_end() -> None:
    s = lost_and_back()
    assert s.position() == Position(0, 0, EMPTY, GROUP, recovering=True, incarnation=ME)
    s.receive(0, Sync(5, History.of([(1, 0), (5, 10)]), log_end=12, answers=ME), 0.01)
    assert SaveEpoch(5) in s.events()
    # Its log holds nothing the primary's does: a checkpoint at 8 comes, then 8..12.
    s.receive(0, CheckpointChunk(5, 8, 3, 0, b"abc"), 0.02)
    assert InstallCheckpoint(8) in s.events()
    s.receive(0, _append(8, 11), 0.03)
    assert WriteRecords(8, recs(8, 11)) in s.events()
    s.records_durable(11)
    assert not any(isinstance(e, Recovered) for e in s.events())
    assert s.position().recovering  # 11 < 12: a record it may have acknowledged is missing
    s.receive(0, _append(11, 12), 0.04)
    s.events()
    s.records_durable(12)
    assert Recovered(5, 12) in s.events()
    assert s.position() == Position(5, 12, History.of([(1, 0), (5, 10)]), GROUP, False, ME)


def test_a_sync_queued_before_the_disk_was_lost_does_not_count() -> None:
    # The primary synced replica 1's earlier start when its log ended at 3; that SYNC,
    # queued, reaches the replica after it came back empty. Replica 1 may have
    # acknowledged records up to 11 since: 3 proves nothing.
    s = lost_and_back()
    history = History.of([(1, 0), (5, 0)])
    s.receive(0, Sync(5, history, log_end=3, answers=12), 0.01)
    s.receive(0, _append(0, 3), 0.02)
    s.records_durable(3)
    assert not any(isinstance(e, Recovered) for e in s.events())
    s.receive(0, Sync(5, history, log_end=12, answers=ME), 0.03)  # answers this start
    s.receive(0, _append(3, 12), 0.04)
    s.records_durable(12)
    assert Recovered(5, 12) in s.events()


def test_a_recovering_replica_needs_an_incarnation() -> None:
    with pytest.raises(ReplicationRuleError, match="incarnation other than 0"):
        secondary(0, EMPTY, 0, recovering=True)


def test_a_checkpoint_past_the_synced_end_is_enough() -> None:
    s = lost_and_back()
    s.receive(0, Sync(5, History.of([(1, 0), (5, 10)]), log_end=12, answers=ME), 0.01)
    s.receive(0, CheckpointChunk(5, 20, 2, 0, b"ab"), 0.02)
    events = s.events()
    assert events.index(InstallCheckpoint(20)) < events.index(Recovered(5, 20))


def test_the_synced_end_is_the_epochs_a_newer_term_needs_its_own_sync() -> None:
    s = lost_and_back()
    s.receive(0, Sync(5, History.of([(1, 0), (5, 10)]), log_end=12, answers=ME), 0.01)
    s.receive(0, CheckpointChunk(5, 8, 3, 0, b"abc"), 0.02)
    s.events()
    # Replica 2 takes the role at epoch 6 with a log ending at 9 (it truncated 9..12,
    # never committed): the end to reach is its, said by its SYNC, not 12.
    s.receive(2, Sync(6, History.of([(1, 0), (6, 9)]), log_end=9, answers=ME), 0.03)
    s.receive(2, _append(8, 9, epoch=6), 0.04)
    s.events()
    s.records_durable(9)
    assert Recovered(6, 9) in s.events()


def test_a_replica_that_never_lost_anything_says_nothing_of_it() -> None:
    s = secondary(3, ONE, 5)
    assert not s.position().recovering
    s.receive(0, Sync(4, History.of([(1, 0), (4, 5)]), log_end=5), 0.01)
    s.records_durable(5)
    assert not any(isinstance(e, Recovered) for e in s.events())
    assert sent(s.events()) == []


def _append(first: int, end: int, epoch: int = 5) -> Append:
    return Append(epoch, first, first, recs(first, end))
