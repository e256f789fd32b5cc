"""A live primary hands the role to replicas started to upgrade, on cores driven by hand:
they ask (ASK_ROLE) once they hold its whole log; once ``k`` of them have, it ships and
commits nothing past that moment, and steps down for the one that acknowledged the most
once it holds everything shipped (HANDOVER), or ships on if that one does not catch up.
The others leave the role to that one for a while."""

from __future__ import annotations

from ambrosia_py.coordinator.replication import (
    Ack,
    Append,
    AskRole,
    CommitAdvanced,
    Group,
    Handover,
    History,
    PrimaryLost,
    Probe,
    ReadLog,
    RoleHandedOver,
    Secondary,
    SteppedDown,
    Sync,
)
from tests.test_replication_rules import ONE, TIMING, established, recs, secondary, sent

TERM = History.of([(1, 0), (5, 10)])


def asking(*, version: int = 0, term_version: int = 0) -> Secondary:
    """Replica 1, started to upgrade, synced at 10 to the primary of epoch 5 (replica 0)."""
    s = secondary(5, ONE, 10, version=version, upgrade_to=version + 1)
    s.group = Group.of({s.replica})  # alone: no probe before the report
    s.receive(0, Sync(5, TERM, term_version, 0, log_end=10), 0.0)
    s.events()
    return s


def test_a_replica_started_to_upgrade_asks_once_it_holds_the_whole_log() -> None:
    s = asking()
    s.receive(0, Append(5, 10, 10, recs(10, 12)), 0.01)
    s.events()
    s.tick(0.02)
    assert sent(s.events()) == []  # written, not yet durable
    s.records_durable(12)
    s.events()
    s.tick(0.03)
    assert sent(s.events()) == [(0, AskRole(5, 12))]
    s.tick(0.04)
    assert sent(s.events()) == []  # not again within retry_after
    s.tick(0.03 + TIMING.retry_after)
    assert sent(s.events()) == [(0, AskRole(5, 12))]


def test_it_does_not_ask_behind_the_primary_or_of_a_term_of_another_version() -> None:
    s = asking()
    s.receive(0, Append(5, 12, 10, recs(12, 13)), 0.01)  # a gap: the primary is ahead
    s.events()
    s.tick(0.02)
    assert not [m for _, m in sent(s.events()) if isinstance(m, AskRole)]
    upgraded = asking(version=0, term_version=1)  # the term is of the new version already
    upgraded.tick(0.02)
    assert not [m for _, m in sent(upgraded.events()) if isinstance(m, AskRole)]
    plain = asking()
    plain.upgrade_to = None
    plain.tick(0.02)
    assert sent(plain.events()) == []


def test_the_primary_hands_over_once_k_have_asked_and_ships_nothing_after() -> None:
    p = established()  # epoch 5 from seq 10, replicas 1 and 2 synced at 10, k = 2
    p.append(recs(10, 12), 0.01)
    p.records_durable(12)
    p.receive(1, Ack(5, 11, 12), 0.02)
    p.events()
    p.receive(1, AskRole(5, 12), 0.03)
    assert sent(p.events()) == []  # one of the k = 2 needed
    p.receive(2, AskRole(5, 12), 0.04)
    assert p.events() == []  # to replica 1, which acknowledged the most: once it holds 12
    # Appended from now on: written here, shipped to nobody, never committed.
    p.append(recs(12, 14), 0.05)
    p.records_durable(14)
    assert p.events() == []
    p.receive(1, Ack(5, 12, 12), 0.06)
    events = p.events()
    assert events[0] == CommitAdvanced(12)  # what was shipped commits, and no more
    assert sent(events) == [(1, Handover(5, 1, 12)), (2, Handover(5, 1, 12))]
    assert events[-1] == SteppedDown(
        5, "handed the role to replica 1, which holds its log to 12", 1, True
    )
    assert p.commit_end == 12


def test_the_chosen_replica_must_hold_everything_shipped_first() -> None:
    p = established()
    p.append(recs(10, 13), 0.01)
    p.receive(2, Ack(5, 13, 13), 0.02)
    p.receive(1, Ack(5, 11, 13), 0.02)
    p.events()
    p.receive(1, AskRole(5, 11), 0.03)
    p.receive(2, AskRole(5, 13), 0.03)
    events = p.events()
    # Replica 2 acknowledged the most: handed to it at once.
    assert sent(events) == [(1, Handover(5, 2, 13)), (2, Handover(5, 2, 13))]
    assert SteppedDown(5, "handed the role to replica 2, which holds its log to 13", 2, True) in (
        events
    )


def test_of_replicas_tied_the_lowest_number_is_handed_the_role() -> None:
    p = established()
    p.receive(2, AskRole(5, 10), 0.01)
    p.receive(1, AskRole(5, 10), 0.01)
    p.receive(2, Ack(5, 10, 10), 0.02)
    assert sent(p.events()) == []
    p.receive(1, Ack(5, 10, 10), 0.02)
    assert [m for _, m in sent(p.events())] == [Handover(5, 1, 10), Handover(5, 1, 10)]


def test_a_stalled_hand_over_is_given_up_and_the_records_shipped() -> None:
    p = established()
    p.append(recs(10, 12), 0.01)
    p.events()
    p.receive(1, AskRole(5, 10), 0.02)
    p.receive(2, AskRole(5, 10), 0.02)
    p.append(recs(12, 14), 0.03)
    p.records_durable(14)
    assert not [e for e in p.events() if isinstance(e, ReadLog)]
    p.tick(0.02 + TIMING.establish_within)
    events = p.events()
    assert ReadLog(1, 12) in events and ReadLog(2, 12) in events
    p.receive(1, Ack(5, 12, 12), 0.7)
    p.records_read(1, 12, list(recs(12, 14)), 0.7)
    p.receive(1, Ack(5, 14, 14), 0.71)
    assert p.commit_end == 14


def test_the_replica_handed_the_role_takes_it_and_the_others_leave_it() -> None:
    s = asking()
    s.receive(0, Handover(5, 1, 10), 0.01)
    assert RoleHandedOver(5, 0) in s.events()

    other = secondary(5, ONE, 10)
    other.receive(0, Sync(5, TERM, log_end=10), 0.0)
    other.events()
    other.receive(0, Handover(5, 2, 10), 0.01)
    assert other.events() == []
    assert other.leaves_role(0.02)
    # Silent past failover_after, it neither probes nor reports the primary lost...
    other.group = Group.of({other.replica})  # alone: no probe before the report
    other.tick(0.01 + TIMING.failover_after)
    assert not [e for e in other.events() if isinstance(e, PrimaryLost | Probe)]
    # ... until the role was left long enough.
    later = 0.01 + 2 * TIMING.failover_after
    assert not other.leaves_role(later)
    other.tick(later)
    assert PrimaryLost(5, 0) in other.events()


def test_a_late_ask_reaching_a_replica_no_longer_primary_is_ignored() -> None:
    """Meant for a primary: a secondary (the old primary, once it stepped down) drops it
    rather than take its sender for a second primary of the epoch."""
    s = secondary(5, ONE, 10)
    s.receive(0, Sync(5, TERM, log_end=10), 0.0)
    s.events()
    s.receive(2, AskRole(5, 10), 0.01)
    assert s.events() == []
