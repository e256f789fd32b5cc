"""The check before a take-over (pre-vote), on cores driven by hand: a secondary that
finds its primary silent asks the others before it reports the primary lost, and only
as many agreeing as a new term would need make it report; a probe disturbs no term."""

from __future__ import annotations

from ambrosia_py.coordinator.replication import (
    Group,
    Heartbeat,
    History,
    Primary,
    PrimaryLost,
    Probe,
    Secondary,
    Send,
    Silence,
    Sync,
    Timing,
)

TIMING = Timing()
AFTER = TIMING.failover_after
ONE = History.of([(1, 0)])


def secondary(replica: int, group: Group | None, epoch: int = 3) -> Secondary:
    return Secondary(
        replica=replica,
        epoch=epoch,
        history=ONE,
        log_base=0,
        log_end=5,
        commit_end=0,
        now=0.0,
        timing=TIMING,
        group=group,
    )


def streaming(replica: int = 1, group: Group | None = None, epoch: int = 3) -> Secondary:
    """A secondary of a group of three, synced to replica 0, primary of ``epoch``."""
    s = secondary(replica, Group.of({0, 1, 2}) if group is None else group, epoch)
    s.receive(0, Sync(epoch, History.of([(1, 0), (epoch, 5)]), log_end=5), 0.0)
    s.events()
    return s


def test_silence_is_probed_first_and_reported_once_another_replica_agrees() -> None:
    s = streaming()
    s.tick(AFTER - 0.01)
    assert s.events() == []
    s.tick(AFTER)
    assert s.events() == [Send(0, Probe(3, 1)), Send(2, Probe(3, 1))]
    s.receive(0, Silence(3, 1, False), AFTER + 0.001)  # the primary, if it hears: no
    assert s.events() == []
    s.receive(2, Silence(3, 1, True), AFTER + 0.002)
    assert s.events() == [PrimaryLost(3, 0)]
    s.receive(0, Silence(3, 1, True), AFTER + 0.003)  # late: the round is over
    assert s.events() == []
    # Reported again only after another failover_after of silence, after a new round.
    s.tick(AFTER * 1.9)
    assert s.events() == []
    s.tick(AFTER * 2 + 0.002)
    assert s.events() == [Send(0, Probe(3, 2)), Send(2, Probe(3, 2))]


def test_a_secondary_nobody_agrees_with_never_reports_and_asks_again() -> None:
    s = streaming()
    s.tick(AFTER)
    assert s.events() == [Send(0, Probe(3, 1)), Send(2, Probe(3, 1))]
    s.receive(2, Silence(3, 1, False), AFTER + 0.001)  # it hears the primary
    s.tick(AFTER * 1.49)
    assert s.events() == []
    s.tick(AFTER * 1.5 + 0.001)  # a new round every failover_after / 2 while silent
    assert s.events() == [Send(0, Probe(3, 2)), Send(2, Probe(3, 2))]
    s.receive(2, Silence(3, 1, True), AFTER * 1.5 + 0.002)  # of the old round: not counted
    assert s.events() == []
    s.receive(2, Silence(3, 2, True), AFTER * 1.5 + 0.003)
    assert s.events() == [PrimaryLost(3, 0)]


def test_hearing_from_the_primary_ends_the_round() -> None:
    s = streaming()
    s.tick(AFTER)
    s.events()
    s.receive(0, Heartbeat(3, 5, 0), AFTER + 0.001)
    s.events()
    s.receive(2, Silence(3, 1, True), AFTER + 0.002)
    assert s.events() == []


def test_as_many_agreeing_as_a_term_needs() -> None:
    # Five replicas, k = 2: a term needs 4, so three others must agree.
    s = streaming(group=Group.of({0, 1, 2, 3, 4}, 2))
    s.tick(AFTER)
    assert [e.to for e in s.events() if isinstance(e, Send)] == [0, 2, 3, 4]
    for other in (2, 3):
        s.receive(other, Silence(3, 1, True), AFTER + 0.001)
        assert s.events() == []
    s.receive(4, Silence(3, 1, True), AFTER + 0.002)
    assert s.events() == [PrimaryLost(3, 0)]


def test_where_no_other_replica_is_needed_the_report_is_at_once() -> None:
    # k = n: a term needs its own replica only; a core with no group asks nobody.
    for group in (Group.of({0, 1, 2}, 3), None):
        s = secondary(1, group)
        s.follow(3, 0, 0.0)
        s.events()
        s.tick(AFTER)
        assert s.events() == [PrimaryLost(3, 0)]


def test_a_secondary_answers_from_its_own_silence_and_takes_no_epoch_from_a_probe() -> None:
    s = streaming(replica=2)
    s.receive(1, Probe(9, 4), AFTER / 2 - 0.01)  # heard from the primary at 0
    assert s.events() == [Send(1, Silence(3, 4, False))]
    s.receive(1, Probe(9, 5), AFTER / 2)
    assert s.events() == [Send(1, Silence(3, 5, True))]
    assert s.epoch == 3 and s.primary == 0  # a higher epoch in a probe changes nothing
    s.receive(0, Heartbeat(3, 5, 0), AFTER)
    s.events()
    s.receive(1, Probe(9, 6), AFTER + 0.01)
    assert s.events() == [Send(1, Silence(3, 6, False))]


def test_a_primary_says_it_is_not_silent_and_is_not_deposed_by_a_probe() -> None:
    s = streaming()
    p = Primary.taking_over(s, group=Group.of({0, 1, 2}), epoch=4, now=0.0, timing=TIMING)
    p.events()
    p.receive(2, Probe(7, 1), 0.01)
    assert p.events() == [Send(2, Silence(4, 1, False))]
    p.receive(2, Silence(7, 1, True), 0.02)  # an answer meant for it as a secondary
    assert p.events() == []
    assert p.epoch == 4
