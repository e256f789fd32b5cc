"""The replicated log's rules, one at a time: the epoch history and where two logs agree,
a secondary's answers, a primary's term start, feeding and commit point, and the rule
for the tail on a new term, on cores driven by hand (no network, no clock)."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    Ack,
    Append,
    CheckpointChunk,
    CommitAdvanced,
    Established,
    Event,
    Group,
    Heartbeat,
    History,
    InstallCheckpoint,
    Message,
    NewTerm,
    OutboxTrim,
    Position,
    Primary,
    PrimaryLost,
    ReadLog,
    Refuse,
    Replayable,
    ReplicationRuleError,
    Resend,
    SaveEpoch,
    SaveHistory,
    Secondary,
    Send,
    SendCheckpoint,
    SteppedDown,
    StoreCheckpointChunk,
    Sync,
    Timing,
    TrimOutboxes,
    TruncateLog,
    WriteRecords,
    agreement,
)
from ambrosia_py.coordinator.replication.messages import append_size
from ambrosia_py.coordinator.replication.states import (
    SECONDARY,
    TERM,
    SecondaryEvent,
    SecondaryState,
    TermEvent,
    TermState,
    UnexpectedEventError,
    step,
)
from ambrosia_py.wire.records import encode_disk_record

H = History.of
TIMING = Timing()
GROUP = Group.of({0, 1, 2})


def rec(seq: int, tag: str = "") -> bytes:
    return encode_disk_record(1, seq, f"{tag}{seq}".encode())


def recs(first: int, end: int, tag: str = "") -> tuple[bytes, ...]:
    return tuple(rec(s, tag) for s in range(first, end))


def sent(events: list[Event]) -> list[tuple[int, Message]]:
    return [(e.to, e.message) for e in events if isinstance(e, Send)]


ONE = H([(1, 0)])


def secondary(epoch: int = 3, history: History = ONE, end: int = 5, **kw: int) -> Secondary:
    args = {"replica": 1, "log_base": 0, "commit_end": 0, **kw}
    return Secondary(
        epoch=epoch, history=history, log_end=end, now=0.0, timing=TIMING, group=GROUP, **args
    )


def streaming(epoch: int = 3, end: int = 5) -> Secondary:
    """A secondary synced to replica 0, primary of ``epoch`` since seq 5."""
    s = secondary(epoch, H([(1, 0)]), end)
    s.receive(0, Sync(epoch, H([(1, 0), (epoch, 5)]), log_end=5), 0.0)
    s.events()
    return s


# --- the history -------------------------------------------------------------------------


def test_effective_entries_last_epoch_and_rank() -> None:
    h = H([(1, 0), (3, 10), (4, 10), (6, 20)])
    assert h.effective(15) == H([(1, 0), (3, 10), (4, 10)])
    assert h.last_epoch(9) == 1 and h.last_epoch(10) == 4 and h.last_epoch(25) == 6
    assert h.rank(12) == (4, 12)
    assert [h.epoch_at(s) for s in (0, 9, 10, 19, 20)] == [1, 1, 4, 4, 6]
    assert History().rank(0) == (0, 0)


@pytest.mark.parametrize(
    ("mine", "my_end", "theirs", "their_end", "expected"),
    [
        # the same history: the shorter log
        ([(1, 0)], 8, [(1, 0)], 12, 8),
        # an old tail of epoch 1 past where the primary's epoch 2 began
        ([(1, 0)], 12, [(1, 0), (2, 8)], 15, 8),
        # a term that never reached this log's end changes nothing
        ([(1, 0), (2, 8)], 8, [(1, 0), (2, 8), (4, 10)], 12, 8),
        # diverged at the epoch both hold last: 3 wrote from 10 on one, 4 from 10 on other
        ([(1, 0), (3, 10)], 14, [(1, 0), (4, 10)], 16, 10),
        # nothing in common
        ([(2, 0)], 5, [(1, 0)], 5, None),
        ([], 0, [(1, 0)], 5, None),
        # compacted: only the entries both still hold are compared
        ([(1, 0), (3, 5), (4, 9)], 12, [(3, 5), (4, 9), (6, 11)], 14, 11),
        ([(1, 0), (3, 5)], 12, [(4, 9), (6, 11)], 14, None),
        # the primary's current term is open-ended: a secondary keeps what it has of it
        ([(1, 0), (5, 6)], 30, [(1, 0), (5, 6)], None, 30),
        ([(1, 0)], 7, [(1, 0), (5, 6)], None, 6),
        # an entry past the log's end says nothing
        ([(1, 0), (3, 20)], 12, [(1, 0), (4, 12)], 15, 12),
    ],
)
def test_agreement(
    mine: list[tuple[int, int]],
    my_end: int,
    theirs: list[tuple[int, int]],
    their_end: int | None,
    expected: int | None,
) -> None:
    assert agreement(H(mine), my_end, H(theirs), their_end) == expected
    if their_end is not None:
        assert agreement(H(theirs), their_end, H(mine), my_end) == expected


def test_agreement_refuses_histories_that_fork_before_a_shared_epoch() -> None:
    with pytest.raises(ReplicationRuleError, match="histories disagree up to epoch 3"):
        agreement(H([(1, 0), (3, 5)]), 9, H([(1, 0), (3, 6)]), 9)
    with pytest.raises(ReplicationRuleError, match="histories disagree up to epoch 3"):
        agreement(H([(1, 0), (3, 5)]), 9, H([(2, 0), (3, 5)]), 9)
    # Compacted, a history still cannot lack a term the other holds after its first.
    with pytest.raises(ReplicationRuleError, match="histories disagree up to epoch 4"):
        agreement(H([(1, 0), (4, 8)]), 9, H([(3, 5), (4, 8)]), 9)


def test_a_history_is_compacted_below_a_committed_seq() -> None:
    h = H([(1, 0), (3, 5), (4, 9), (6, 9), (7, 20)])
    assert h.compacted(0) == h
    assert h.compacted(8) == H([(3, 5), (4, 9), (6, 9), (7, 20)])
    assert h.compacted(9) == H([(6, 9), (7, 20)])  # (4, 9) covers no record
    assert h.compacted(30) == H([(7, 20)])
    assert H([(2, 4)]).compacted(1) == H([(2, 4)])  # nothing wholly below


# --- the tables --------------------------------------------------------------------------


def test_a_secondary_takes_every_message_of_its_primary_in_every_state() -> None:
    """The network delays and reorders: nothing its primary sends is out of place."""
    arriving = set(SecondaryEvent) - {SecondaryEvent.STALLED}
    for state, row in SECONDARY.items():
        assert arriving <= set(row), state
    assert set(SECONDARY[SecondaryState.JOINING].values()) <= {
        SecondaryState.JOINING,
        SecondaryState.STREAMING,
        SecondaryState.INSTALLING,
    }  # only a SYNC gets it out
    leaving = {
        e for e, to in SECONDARY[SecondaryState.JOINING].items() if to is not SecondaryState.JOINING
    }
    assert leaving == {SecondaryEvent.SYNC, SecondaryEvent.SYNC_APART}


def test_the_term_table_names_what_each_state_refuses() -> None:
    assert step("primary", TERM, TermState.ESTABLISHED, TermEvent.ACK) is TermState.ESTABLISHED
    for event in TermEvent:
        with pytest.raises(UnexpectedEventError, match=f"primary: {event.name} is not valid"):
            step("primary", TERM, TermState.DEPOSED, event)
    for event in (TermEvent.ACK, TermEvent.RESEND, TermEvent.APPEND, TermEvent.READ):
        with pytest.raises(UnexpectedEventError, match="in state GATHERING"):
            step("primary", TERM, TermState.GATHERING, event)


# --- a secondary -------------------------------------------------------------------------


def test_a_lower_epoch_is_refused_with_the_epoch_held() -> None:
    s = secondary(epoch=3)
    s.receive(2, Append(2, 5, 0, recs(5, 6)), 0.1)
    assert s.events() == [Send(2, Refuse(3))]


def test_a_higher_epoch_is_saved_before_the_position_goes_out() -> None:
    s = secondary(epoch=3)
    s.receive(2, NewTerm(4, GROUP), 0.1)
    assert s.events() == [SaveEpoch(4), Send(2, Position(4, 5, H([(1, 0)]), GROUP))]
    assert s.primary == 2


def test_joining_it_writes_acknowledges_and_learns_nothing() -> None:
    s = secondary(epoch=3)
    s.receive(0, Append(3, 5, 7, recs(5, 7)), 0.1)
    assert s.events() == [Send(0, Position(3, 5, H([(1, 0)]), GROUP))]
    s.receive(0, Heartbeat(3, 7, 7), 0.12)  # within retry_after: not asked again
    s.records_durable(5)
    assert s.events() == []
    assert s.commit_end == 0


def test_sync_truncates_the_disagreeing_tail_then_takes_the_history() -> None:
    s = secondary(epoch=4, history=H([(1, 0), (2, 5)]), end=9)
    s.receive(0, Sync(4, H([(1, 0), (3, 6), (4, 8)]), log_end=8), 0.1)
    # Record 5 is of epoch 2 here, of epoch 1 there: the logs agree below 5.
    assert s.events() == [
        TruncateLog(5),
        SaveHistory(H([(1, 0), (3, 6), (4, 8)])),
        Send(0, Resend(4, 5)),
        Send(0, Ack(4, 5, 5)),
    ]
    assert (s.log_end, s.durable_end) == (5, 5)


def test_a_late_or_repeated_sync_truncates_nothing_more() -> None:
    s = streaming(epoch=3)
    s.receive(0, Append(3, 5, 0, recs(5, 9)), 0.1)
    s.events()
    s.receive(0, Sync(3, H([(1, 0), (3, 5)]), log_end=5), 0.2)
    assert not any(isinstance(e, TruncateLog | SaveHistory) for e in s.events())
    assert s.log_end == 9


def test_sync_never_truncates_what_it_knows_committed() -> None:
    s = secondary(epoch=4, history=H([(1, 0), (2, 5)]), end=9, commit_end=8)
    with pytest.raises(ReplicationRuleError, match="known committed"):
        s.receive(0, Sync(4, H([(1, 0), (4, 6)]), log_end=6), 0.1)


def test_a_log_agrees_with_every_history_below_its_checkpoint() -> None:
    """A new replica installed a checkpoint (the state before seq 40) and holds no history
    yet; a SYNC then finds no epoch in common. What lies below the checkpoint is committed,
    so the log agrees there: nothing is truncated, nothing refused."""
    s = secondary(epoch=3, history=H([]), end=40, log_base=40, commit_end=40)
    s.receive(0, Sync(3, H([(1, 0), (3, 30)]), log_end=30), 0.1)
    events = s.events()
    assert not any(isinstance(e, TruncateLog) for e in events)
    assert SaveHistory(H([(1, 0), (3, 30)])) in events
    assert (s.log_base, s.log_end) == (40, 40)


def test_appends_in_order_skip_what_is_held_and_ask_again_after_a_gap() -> None:
    s = streaming()
    s.receive(0, Append(3, 5, 0, recs(5, 8)), 0.1)
    assert s.events() == [WriteRecords(5, recs(5, 8))]
    s.receive(0, Append(3, 6, 0, recs(6, 10)), 0.11)  # overlaps: 8 and 9 are new
    assert s.events() == [WriteRecords(8, recs(8, 10))]
    s.receive(0, Append(3, 5, 0, recs(5, 7)), 0.12)  # all held: say where the log is
    assert s.events() == [Send(0, Ack(3, 5, 10))]
    s.receive(0, Append(3, 12, 0, recs(12, 13)), 0.13)  # 10 and 11 lost
    assert s.events() == [Send(0, Resend(3, 10))]
    s.receive(0, Append(3, 13, 0, recs(13, 14)), 0.14)  # the same request, too soon
    assert s.events() == []
    s.receive(0, Append(3, 13, 0, recs(13, 14)), 0.14 + TIMING.retry_after)
    assert s.events() == [Send(0, Resend(3, 10))]


def test_acks_follow_durability_and_replay_follows_commit_within_the_log() -> None:
    s = streaming()
    s.receive(0, Append(3, 5, 4, recs(5, 8)), 0.1)
    assert s.events() == [WriteRecords(5, recs(5, 8)), Replayable(4)]
    s.records_durable(7)
    assert s.events() == [Send(0, Ack(3, 7, 8))]
    s.receive(0, Heartbeat(3, 12, 10), 0.2)  # commit past the log's end; behind
    assert s.events() == [Replayable(8), Send(0, Ack(3, 7, 8)), Send(0, Resend(3, 8))]


def test_a_silent_primary_is_reported_lost_and_again_while_silence_lasts() -> None:
    s = streaming()
    s.group = Group.of({s.replica})  # alone: no probe before the report (test_..._prevote)
    s.tick(TIMING.failover_after - 0.01)
    assert s.events() == []
    s.tick(TIMING.failover_after)
    assert s.events() == [PrimaryLost(3, 0)]
    s.tick(TIMING.failover_after * 1.5)
    assert s.events() == []
    s.tick(TIMING.failover_after * 2)
    assert s.events() == [PrimaryLost(3, 0)]
    s.receive(0, Heartbeat(3, 5, 0), TIMING.failover_after * 2.1)
    s.events()
    s.tick(TIMING.failover_after * 2.5)
    assert s.events() == []


def test_two_primaries_of_one_epoch_are_an_error() -> None:
    s = streaming()
    with pytest.raises(ReplicationRuleError, match="both act as primary of epoch 3"):
        s.receive(2, Heartbeat(3, 5, 0), 0.1)


def test_a_checkpoint_in_chunks_in_any_order_is_installed_once_whole() -> None:
    s = streaming()
    data = b"0123456789"
    s.receive(0, CheckpointChunk(3, 40, 10, 6, data[6:]), 0.1)
    s.receive(0, CheckpointChunk(3, 40, 10, 0, data[:3]), 0.11)
    s.receive(0, CheckpointChunk(3, 40, 10, 0, data[:3]), 0.12)  # twice: nothing new
    assert s.state.name == "INSTALLING"
    s.receive(0, CheckpointChunk(3, 40, 10, 3, data[3:6]), 0.13)
    assert s.events() == [
        StoreCheckpointChunk(40, 10, 6, data[6:], True),
        StoreCheckpointChunk(40, 10, 0, data[:3], False),
        StoreCheckpointChunk(40, 10, 3, data[3:6], False),
        InstallCheckpoint(40),
        Send(0, Resend(3, 40)),
    ]
    assert (s.log_base, s.log_end, s.state.name) == (40, 40, "STREAMING")
    s.receive(0, CheckpointChunk(3, 40, 10, 0, data[:3]), 0.14)  # not needed any more
    assert s.events() == []


def test_a_stalled_transfer_is_given_up_for_a_new_sync() -> None:
    s = streaming()
    s.receive(0, CheckpointChunk(3, 40, 10, 0, b"012"), 0.1)
    s.events()
    s.tick(0.1 + TIMING.retry_after)
    assert s.events() == [Send(0, Position(3, 5, H([(1, 0), (3, 5)]), GROUP))]
    assert s.state.name == "JOINING"


# --- a primary ---------------------------------------------------------------------------


def primary(
    *,
    epoch: int = 5,
    history: History = ONE,
    end: int = 10,
    durable: int | None = None,
    commit: int = 0,
    group: Group = GROUP,
    founding: bool = False,
    replica: int = 0,
) -> Primary:
    return Primary(
        replica=replica,
        group=group,
        epoch=epoch,
        history=history,
        log_base=0,
        log_end=end,
        durable_end=end if durable is None else durable,
        commit_end=commit,
        now=0.0,
        timing=TIMING,
        founding=founding,
    )


def test_a_term_starts_with_the_epoch_saved_and_new_term_sent_no_history_yet() -> None:
    p = primary()
    assert p.events() == [
        SaveEpoch(5),
        Send(1, NewTerm(5, GROUP)),
        Send(2, NewTerm(5, GROUP)),
    ]


def test_established_by_a_quorum_not_ahead_then_syncs() -> None:
    p = primary()
    p.events()
    p.receive(1, Position(5, 12, H([(1, 0)]), GROUP), 0.01)  # ahead: not enough alone
    assert p.events() == [] and p.state.name == "GATHERING"
    p.receive(2, Position(5, 8, H([(1, 0)]), GROUP), 0.02)
    term = H([(1, 0), (5, 10)])
    assert p.events() == [
        SaveHistory(term),
        Established(5, 10),
        Send(1, Sync(5, term, log_end=10)),  # where the primary's log ends
        Send(2, Sync(5, term, log_end=10)),
        ReadLog(2, 8),
    ]
    assert p.feed_state(1).name == "STREAMING"  # its tail past 10 is cut by the sync


def test_outranked_by_too_many_it_steps_down_naming_the_best() -> None:
    p = primary(group=Group.of({0, 1, 2}, k=1))  # every replica's position is needed
    p.events()
    p.receive(2, Position(5, 3, H([(1, 0), (4, 2)]), Group.of({0, 1, 2}, k=1)), 0.01)
    assert p.events() == [SteppedDown(5, "1 replicas hold logs ahead of this one's", 2)]
    assert p.history == H([(1, 0)])  # the term that never was left no entry


def test_no_quorum_in_time_steps_down() -> None:
    p = primary()
    p.events()
    p.tick(TIMING.establish_within)
    assert p.events() == [SteppedDown(5, "no quorum of positions within 0.6 s", None)]


def test_a_higher_epoch_anywhere_deposes_the_primary() -> None:
    p = primary()
    p.events()
    p.receive(1, Refuse(7), 0.01)
    assert p.events() == [SaveEpoch(7), SteppedDown(7, "replica 1 holds epoch 7", None)]
    p.receive(2, Position(5, 1, History(), GROUP), 0.02)  # deposed: takes nothing more
    assert p.events() == []


def test_a_deposed_primary_goes_on_as_a_secondary_with_its_log_as_it_was() -> None:
    p = established()
    p.append(recs(10, 12), 0.02)
    p.receive(1, Refuse(7), 0.03)
    assert p.events()[-1] == SteppedDown(7, "replica 1 holds epoch 7", None)
    s = Secondary.following(p, epoch=7, now=0.03, timing=TIMING, group=GROUP)
    assert (s.epoch, s.log_end, s.durable_end, s.history) == (7, 12, 10, H([(1, 0), (5, 10)]))
    s.receive(2, NewTerm(7, GROUP), 0.04)
    assert s.events() == [Send(2, Position(7, 12, H([(1, 0), (5, 10)]), GROUP))]
    s.records_durable(12)
    assert s.events() == []  # not synced to the primary of 7: no acknowledgement


def test_a_lower_epoch_primary_is_refused_and_the_same_epoch_is_an_error() -> None:
    p = primary()
    p.events()
    p.receive(1, Heartbeat(4, 3, 3), 0.01)
    assert p.events() == [Send(1, Refuse(5))]
    with pytest.raises(ReplicationRuleError, match="two primaries in one epoch"):
        p.receive(1, Heartbeat(5, 3, 3), 0.02)


def test_nobody_may_acknowledge_before_the_term_is_established() -> None:
    p = primary()
    p.events()
    with pytest.raises(UnexpectedEventError, match="ACK is not valid in state GATHERING"):
        p.receive(1, Ack(5, 3, 3), 0.01)


def established(k: int | None = None) -> Primary:
    """Primary of epoch 5 since seq 10, both others synced and caught up at 10."""
    p = primary(group=Group.of({0, 1, 2}, k))
    for r in (1, 2):
        p.receive(r, Position(5, 10, H([(1, 0)]), GROUP), 0.01)
    p.events()
    return p


def test_commit_needs_the_primary_durable_and_k_minus_one_acknowledgements() -> None:
    p = established()
    p.append(recs(10, 13), 0.02)
    assert sent(p.events()) == [(r, Append(5, 10, 0, recs(10, 13))) for r in (1, 2)]
    p.receive(1, Ack(5, 12, 13), 0.03)
    # The primary's own log is durable to 10, the term start: the earlier terms' records.
    assert p.events() == [CommitAdvanced(10)]
    p.records_durable(13)
    assert p.events() == [CommitAdvanced(12)]
    p.receive(2, Ack(5, 13, 13), 0.04)
    assert p.events() == [CommitAdvanced(13)]


def test_a_lagging_replica_is_fed_from_the_log_within_the_inflight_bound() -> None:
    p = primary(end=10)
    p.timing = Timing(max_inflight=4)
    p.receive(1, Position(5, 2, H([(1, 0)]), GROUP), 0.01)
    assert p.events()[-1] == ReadLog(1, 2)
    p.receive(1, Ack(5, 2, 2), 0.015)  # what a synced replica says first
    p.records_read(1, 2, recs(2, 5), 0.02)
    assert p.events() == [Send(1, Append(5, 2, 0, recs(2, 5))), ReadLog(1, 5)]
    p.records_read(1, 5, recs(5, 7), 0.03)
    assert p.events() == [Send(1, Append(5, 5, 0, recs(5, 7)))]  # 5 in flight: waits
    p.receive(1, Ack(5, 6, 7), 0.04)
    assert p.events() == [ReadLog(1, 7)]
    p.records_read(1, 7, recs(7, 10), 0.05)
    assert p.events() == [Send(1, Append(5, 7, 0, recs(7, 10)))]
    assert p.feed_state(1).name == "STREAMING"


def test_what_is_in_flight_to_a_replica_is_bounded_in_bytes_too() -> None:
    """Large records: fewer than ``max_inflight`` of them fill what waits for a slow
    replica; past ``max_inflight_bytes`` the primary reads them from its log later."""
    p = established()
    big = [rec(s, "x" * 100) for s in range(10, 14)]
    # Room for the first two APPENDs (records 10-11, then 12), not for a third.
    p.timing = Timing(max_inflight_bytes=append_size(big[:2]) + append_size(big[2:3]))
    p.append(big[:2], 0.01)
    p.append(big[2:3], 0.01)
    assert len(sent(p.events())) == 4  # to both replicas, twice
    p.append(big[3:], 0.02)
    events = p.events()
    assert not sent(events) and ReadLog(1, 13) not in events  # the bound: it waits
    p.receive(1, Ack(5, 12, 14), 0.03)  # room again for replica 1: from its log
    assert ReadLog(1, 13) in p.events()
    # A replica that asks again for what was sent frees what it said it lacks.
    p.receive(2, Resend(5, 11), 0.04)
    assert ReadLog(2, 11) in p.events()


def test_a_replica_behind_the_pruned_log_is_sent_the_checkpoint() -> None:
    p = established()
    p.append(recs(10, 12), 0.02)
    p.records_durable(12)
    p.receive(1, Ack(5, 12, 12), 0.03)
    p.log_pruned(11)
    p.events()
    p.receive(2, Position(5, 4, H([(1, 0)]), GROUP), 0.04)  # restarted, with less
    assert p.events()[-1] == SendCheckpoint(2)
    p.checkpoint_read(2, 11, b"x" * (TIMING.checkpoint_chunk + 1), 0.05)
    chunks = [m for _, m in sent(p.events())]
    assert [(c.offset, len(c.data)) for c in chunks if isinstance(c, CheckpointChunk)] == [
        (0, TIMING.checkpoint_chunk),
        (TIMING.checkpoint_chunk, 1),
    ]
    p.receive(2, Resend(5, 11), 0.06)  # installed
    assert p.events() == [ReadLog(2, 11)]


def test_an_idle_primary_sends_heartbeats() -> None:
    p = established()
    p.tick(0.01 + TIMING.heartbeat_every)
    assert sent(p.events()) == [(r, Heartbeat(5, 10, 0)) for r in (1, 2)]


def test_trim_points_go_to_synced_replicas_and_come_out_of_every_secondary_state() -> None:
    points = (("bank", 7),)
    p = primary()  # gathering: it has no synced replica to tell
    p.events()
    p.share_trims(points, 0.01)
    assert p.events() == []
    p = established()
    p.share_trims(points, 0.02)
    assert sent(p.events()) == [(r, OutboxTrim(5, points)) for r in (1, 2)]
    for s in (secondary(), streaming()):
        before = s.state
        s.receive(0, OutboxTrim(s.epoch, points), 0.03)
        assert s.events() == [TrimOutboxes(points)]
        assert s.state is before


# --- the rule for the tail on a new term --------------------------------------------------


def _figure_8() -> tuple[Primary, Secondary]:
    """Replica 0 holds 5 and 6 of epoch 2 (shipped by the primary of 2, acknowledged by
    too few); replica 1 became primary of 3 with its log at 5 and wrote its own 5;
    replica 2 adopted 3 but was never synced by it. Replica 0 takes term 4 with replica 2
    (ranks (2, 7) and (1, 5)) and brings it up to 6, which it acknowledges."""
    a = primary(epoch=4, history=H([(1, 0), (2, 5)]), end=7, commit=5)
    a.events()
    a.receive(2, Position(4, 5, H([(1, 0)]), GROUP), 0.01)
    assert a.events()[-1] == ReadLog(2, 5)
    a.records_read(2, 5, (rec(5, "e2-"),), 0.02)
    append = sent(a.events())[-1][1]
    c = secondary(epoch=3, history=H([(1, 0)]), end=5, commit_end=5, replica=2)
    c.receive(0, Sync(4, a.history, log_end=a.log_end), 0.03)
    c.receive(0, append, 0.03)
    c.records_durable(6)
    acks = [m for _, m in sent(c.events()) if isinstance(m, Ack)]
    assert acks[-1] == Ack(4, 6, 6)
    a.receive(2, acks[-1], 0.04)
    return a, c


def _primary_of_3_again(epoch: int) -> Primary:
    return Primary(
        replica=1,
        group=GROUP,
        epoch=epoch,
        history=H([(1, 0), (3, 5)]),
        log_base=0,
        log_end=6,
        durable_end=6,
        commit_end=5,
        now=0.05,
        timing=TIMING,
    )


def test_earlier_terms_records_are_not_committed_by_counting_them() -> None:
    """Raft's figure 8: counting replica 2's acknowledgement would commit record 5 of
    epoch 2; yet replica 1 outranks replica 2 ((3, 6) against (2, 6)), can take the next
    term with it, and its sync truncates that record."""
    a, c = _figure_8()
    assert not any(isinstance(e, CommitAdvanced) for e in a.events())
    b = _primary_of_3_again(5)
    b.events()
    c.receive(1, NewTerm(5, GROUP), 0.06)
    b.receive(2, sent(c.events())[-1][1], 0.06)
    assert b.state.name == "ESTABLISHED"
    c.receive(1, Sync(5, b.history, log_end=b.log_end), 0.07)
    assert TruncateLog(5) in c.events()


def test_they_are_committed_with_the_first_record_of_the_new_term() -> None:
    """Once replica 2 reaches the term start (7) the commit point moves, and replica 2
    ranks (4, 7): no term can start with it that lacks record 5."""
    a, c = _figure_8()
    a.events()
    a.records_read(2, 6, (rec(6, "e2-"),), 0.08)
    c.receive(0, sent(a.events())[-1][1], 0.08)
    c.records_durable(7)
    a.receive(2, [m for _, m in sent(c.events()) if isinstance(m, Ack)][-1], 0.09)
    assert a.events() == [CommitAdvanced(7)]
    assert c.position().rank() == (4, 7)
    b = _primary_of_3_again(5)
    c.receive(1, NewTerm(5, GROUP), 0.1)
    b.receive(2, sent(c.events())[-1][1], 0.1)
    assert b.state.name == "GATHERING"
