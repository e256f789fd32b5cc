"""A term's group, on cores driven by hand: NEW_TERM and POSITION say the group of the
sender's term; a primary counts no position of another group and sends that replica its
NEW_TERM; a secondary takes the group of the term it follows, and stops if it names
another group under its own group's number.

While the group changes, a term needs a quorum of positions from each of the old and
the new members, and commits on ``k`` of the new members only.

With 3 replicas committing on 2 a term needs 2 positions; a replica that ran as one of
3 committing on 3 would need only its own, and could take a term that lacks a record
the other two hold. Each side must count as the other does."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    Ack,
    CommitAdvanced,
    Established,
    Group,
    GroupMismatchError,
    NewTerm,
    Position,
    PrimaryLost,
    Probe,
    ReplicationRuleError,
    SaveEpoch,
    Send,
    Silence,
    SteppedDown,
    Sync,
)
from tests.test_replication_rules import GROUP, ONE, TIMING, H, primary, recs, secondary

OLD = Group.of({0, 1, 2}, 2, version=4)
# Replicas 1 and 2 leave, 3 and 4 join: each part needs 2 positions, 0's own counted.
CHANGING = Group.of({0, 3, 4}, 2, version=5, previous=OLD)


def test_a_position_of_another_group_is_not_counted_and_told_the_term() -> None:
    p = primary()  # replica 0 of 3 committing on 2, epoch 5
    p.events()
    p.receive(1, Position(5, 8, ONE, Group.of({0, 1, 2}, 3)), 0.01)
    assert p.events() == [Send(1, NewTerm(5, GROUP))]
    assert p.state.name == "GATHERING"
    p.receive(2, Position(5, 8, ONE, GROUP), 0.02)
    assert Established(5, 10) in p.events()


def test_a_new_term_of_another_group_under_the_same_number_stops_the_replica() -> None:
    s = secondary(3, ONE, 5)  # replica 1 of 3 committing on 2, group 0
    with pytest.raises(GroupMismatchError) as caught:
        s.receive(2, NewTerm(7, Group.of(range(5), 3)), 0.01)
    assert str(caught.value).startswith(
        "replica 2, primary of epoch 7, runs in a group of replicas 0,1,2,3,4 committing "
        "on 3; this replica was started in one of replicas 0,1,2 committing on 2 "
        "(--replicas, --replication-ack)"
    )
    assert s.epoch == 3 and s.events() == []  # no SaveEpoch(7), no POSITION


def test_a_replica_takes_the_group_of_the_term_it_follows() -> None:
    s = secondary(3, ONE, 5)
    s.receive(2, NewTerm(7, GROUP), 0.01)
    assert s.events() == [SaveEpoch(7), Send(2, Position(7, 5, ONE, GROUP))]
    # A later term, begun once the store's group changed: its group, whatever it is.
    s.receive(0, NewTerm(9, CHANGING), 0.02)
    assert s.events() == [SaveEpoch(9), Send(0, Position(9, 5, ONE, CHANGING))]
    assert s.group == CHANGING


def test_a_changing_term_needs_a_quorum_of_the_old_and_of_the_new_members() -> None:
    for first, second in ((1, 3), (3, 1)):
        p = primary(group=CHANGING)
        assert {m.to for m in p.events() if isinstance(m, Send)} == {1, 2, 3, 4}
        p.receive(first, Position(5, 8, ONE, CHANGING), 0.01)
        assert p.state.name == "GATHERING"  # 0 and one of them: one part short
        p.receive(second, Position(5, 8, ONE, CHANGING), 0.02)
        assert Established(5, 10) in p.events()
    # Both new members alone make the new quorum, and leave the old one short.
    p = primary(group=CHANGING)
    p.receive(3, Position(5, 8, ONE, CHANGING), 0.01)
    p.receive(4, Position(5, 8, ONE, CHANGING), 0.02)
    assert p.state.name == "GATHERING"


def test_a_changing_term_steps_down_once_either_part_is_out_of_reach() -> None:
    ahead = H([(1, 0), (4, 6)])  # logs of a later epoch: they rank above 0's
    p = primary(group=CHANGING)
    p.receive(1, Position(5, 12, ahead, CHANGING), 0.01)
    assert p.state.name == "GATHERING"
    p.receive(2, Position(5, 12, ahead, CHANGING), 0.02)  # two old members of three
    assert any(isinstance(e, SteppedDown) for e in p.events())


def test_a_changing_term_commits_on_the_new_members_only() -> None:
    p = primary(group=CHANGING)
    for r in (1, 2, 3, 4):
        p.receive(r, Position(5, 10, ONE, CHANGING), 0.01)
    p.events()
    p.append(recs(10, 12), 0.02)
    p.records_durable(12)
    p.receive(1, Ack(5, 12, 12), 0.03)
    p.receive(2, Ack(5, 12, 12), 0.03)
    assert not any(isinstance(e, CommitAdvanced) for e in p.events())  # old ones only
    p.receive(4, Ack(5, 12, 12), 0.04)
    assert CommitAdvanced(12) in p.events()


def test_a_position_from_a_replica_of_no_part_of_the_group_is_ignored() -> None:
    p = primary(group=CHANGING)
    p.events()
    p.receive(7, Position(5, 10, ONE, CHANGING), 0.01)  # following an earlier group
    assert p.events() == [] and p.state.name == "GATHERING"


def test_a_changing_group_is_probed_for_a_quorum_of_each_part() -> None:
    s = secondary(5, ONE, 5, replica=3)
    s.receive(0, NewTerm(5, CHANGING), 0.0)
    s.receive(0, Sync(5, H([(1, 0), (5, 5)]), log_end=5), 0.0)
    s.events()
    s.tick(TIMING.failover_after + 0.1)
    asked = [e.to for e in s.events() if isinstance(e, Send) and isinstance(e.message, Probe)]
    assert asked == [0, 1, 2, 4]
    now = TIMING.failover_after + 0.2
    s.receive(4, Silence(5, 1, True), now)  # the new part: 3 and 4
    assert not any(isinstance(e, PrimaryLost) for e in s.events())
    s.receive(1, Silence(5, 1, True), now)
    s.receive(2, Silence(5, 1, True), now)  # the old part: 1 and 2 (3 is not of it)
    assert any(isinstance(e, PrimaryLost) for e in s.events())


def test_a_leaving_replica_may_be_primary_and_commits_on_k_new_members_alone() -> None:
    # Replica 1 holds the best log as the change begins: it takes the term (its own
    # position counts toward the old part only) and commits once 2 of 0, 3, 4 hold it.
    p = primary(group=CHANGING, replica=1)
    for r in (0, 3):
        p.receive(r, Position(5, 10, ONE, CHANGING), 0.01)
    assert p.state.name == "ESTABLISHED"
    p.events()
    p.append(recs(10, 12), 0.02)
    p.records_durable(12)
    p.receive(0, Ack(5, 12, 12), 0.03)
    assert not any(isinstance(e, CommitAdvanced) for e in p.events())  # 1 of k = 2
    p.receive(3, Ack(5, 12, 12), 0.04)
    assert CommitAdvanced(12) in p.events()


def test_a_replica_not_of_the_group_probes_nobody_and_reports_nothing() -> None:
    s = secondary(3, ONE, 5, replica=7)  # started before a change adds it
    s.events()
    s.tick(TIMING.failover_after * 3)
    assert s.events() == []


def test_a_replica_of_neither_part_cannot_be_a_term_primary() -> None:
    with pytest.raises(ReplicationRuleError, match="replica 7 is not one of"):
        primary(group=CHANGING, replica=7)
