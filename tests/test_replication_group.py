"""One group per instance, on cores driven by hand: NEW_TERM and POSITION say the
sender's group (replicas, ack); a primary counts no position of another group and sends
that replica its NEW_TERM, and a replica sent a NEW_TERM of another group stops, having
adopted nothing.

With 3 replicas committing on 2 a term needs 2 positions; a replica that ran as one of
3 committing on 3 would need only its own, and could take a term that lacks a record
the other two hold. Each side must count as the other does."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    Established,
    GroupMismatchError,
    NewTerm,
    Position,
    SaveEpoch,
    Send,
)
from tests.test_replication_rules import GROUP, ONE, primary, secondary


def test_a_position_of_another_group_is_not_counted_and_told_the_term() -> None:
    p = primary()  # replica 0 of 3 committing on 2, epoch 5
    p.events()
    p.receive(1, Position(5, 8, ONE, (3, 3)), 0.01)
    assert p.events() == [Send(1, NewTerm(5, (3, 2)))]
    assert p.state.name == "GATHERING"
    p.receive(2, Position(5, 8, ONE, GROUP.shape), 0.02)
    assert Established(5, 10) in p.events()


def test_a_replica_sent_a_new_term_of_another_group_stops_adopting_nothing() -> None:
    s = secondary(3, ONE, 5)  # replica 1 of 3 committing on 2
    with pytest.raises(GroupMismatchError) as caught:
        s.receive(2, NewTerm(7, (5, 3)), 0.01)
    assert str(caught.value).startswith(
        "replica 2, primary of epoch 7, runs a group of 5 replicas committing on 3; this "
        "replica was started with 3 and 2 (--replicas, --replication-ack)"
    )
    assert s.epoch == 3 and s.events() == []  # no SaveEpoch(7), no POSITION


def test_a_replica_of_the_same_group_answers_with_it() -> None:
    s = secondary(3, ONE, 5)
    s.receive(2, NewTerm(7, (3, 2)), 0.01)
    assert s.events() == [SaveEpoch(7), Send(2, Position(7, 5, ONE, (3, 2)))]
