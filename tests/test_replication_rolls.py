"""A primary that never pauses to checkpoint, on cores driven by hand: at a roll it asks
one secondary (ROLL) for the state there, that secondary sends back what its binding
took (TAKEN) in chunks, and the primary keeps it once whole; stale or unasked chunks
are not kept."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    Ack,
    CheckpointTaken,
    Group,
    History,
    NewTerm,
    ReplicationRuleError,
    Roll,
    Secondary,
    StoreCheckpointChunk,
    Sync,
    TakeCheckpointFor,
    TakenChunk,
    Timing,
)
from ambrosia_py.coordinator.replication.states import UnexpectedEventError
from tests.test_replication_rules import GROUP, ONE, established, primary, recs, secondary, sent

TIMING = Timing(checkpoint_chunk=4)  # a secondary's: its checkpoints go in 4-byte chunks


def streaming(epoch: int = 5) -> Secondary:
    """Replica 1, synced to replica 0, primary of ``epoch`` since seq 10."""
    s = secondary(epoch, ONE, 10)
    s.timing = TIMING
    s.receive(0, Sync(epoch, History.of([(1, 0), (epoch, 10)]), log_end=10), 0.0)
    s.events()
    return s


def test_a_roll_asks_the_secondary_that_acknowledged_the_most() -> None:
    p = established()
    p.append(recs(10, 14), 0.02)
    p.receive(1, Ack(5, 12, 14), 0.03)
    p.receive(2, Ack(5, 13, 14), 0.03)
    p.events()
    assert p.rolled(14, 0.04) == 2
    assert sent(p.events()) == [(2, Roll(5, 14))]


def test_of_secondaries_tied_the_lowest_number_is_asked() -> None:
    p = established()
    assert p.rolled(10, 0.02) == 1
    assert sent(p.events()) == [(1, Roll(5, 10))]


def test_nobody_is_asked_before_the_term_is_established_or_with_none_keeping_up() -> None:
    p = primary()
    p.events()
    assert p.rolled(10, 0.01) is None
    assert p.events() == []
    alone = primary(group=Group.of({0, 1, 2}, k=3))
    alone.events()
    assert alone.state.name == "ESTABLISHED"  # k = n: a term needs itself alone
    assert alone.rolled(10, 0.01) is None  # no secondary has answered: none streams
    assert alone.events() == []


def test_a_roll_anywhere_but_the_log_end_is_an_error() -> None:
    p = established()
    with pytest.raises(ReplicationRuleError, match="rolled at 9, not at the log's end 10"):
        p.rolled(9, 0.02)


def test_chunks_in_any_order_are_kept_once_and_the_whole_is_taken() -> None:
    p = established()
    p.rolled(10, 0.02)
    p.events()
    p.receive(1, TakenChunk(5, 10, 10, 4, b"4567"), 0.03)
    assert p.events() == [StoreCheckpointChunk(10, 10, 4, b"4567", True)]
    p.receive(1, TakenChunk(5, 10, 10, 4, b"4567"), 0.03)  # again: nothing new
    assert p.events() == []
    p.receive(1, TakenChunk(5, 10, 10, 0, b"0123"), 0.04)
    assert p.events() == [StoreCheckpointChunk(10, 10, 0, b"0123", False)]
    p.receive(1, TakenChunk(5, 10, 10, 8, b"89"), 0.05)
    assert p.events() == [StoreCheckpointChunk(10, 10, 8, b"89", False), CheckpointTaken(10)]
    p.receive(1, TakenChunk(5, 10, 10, 8, b"89"), 0.06)  # after the whole: not asked now
    assert p.events() == []


def test_chunks_not_asked_for_are_not_kept() -> None:
    p = established()
    p.append(recs(10, 12), 0.02)
    p.events()
    p.rolled(12, 0.03)
    p.events()
    p.receive(2, TakenChunk(5, 12, 2, 0, b"ab"), 0.04)  # not the replica asked
    p.receive(1, TakenChunk(5, 10, 2, 0, b"ab"), 0.04)  # not the seq asked
    p.receive(1, TakenChunk(4, 12, 2, 0, b"ab"), 0.04)  # a term before this one
    assert p.events() == []
    p.append(recs(12, 13), 0.05)
    p.rolled(13, 0.05)  # a new roll: the one before it is not waited for any more
    p.events()
    p.receive(1, TakenChunk(5, 12, 2, 0, b"ab"), 0.06)
    assert p.events() == []
    p.receive(1, TakenChunk(5, 13, 2, 0, b"ab"), 0.07)
    assert p.events() == [StoreCheckpointChunk(13, 2, 0, b"ab", True), CheckpointTaken(13)]


def test_a_chunk_of_this_epoch_before_the_term_is_established_breaks_the_rules() -> None:
    p = primary()
    p.events()
    with pytest.raises(UnexpectedEventError, match="TAKEN is not valid in state GATHERING"):
        p.receive(1, TakenChunk(5, 10, 2, 0, b"ab"), 0.01)


def test_a_streaming_secondary_takes_the_checkpoint_and_sends_it_back_in_chunks() -> None:
    s = streaming()
    s.receive(0, Roll(5, 12), 0.01)
    assert s.events() == [TakeCheckpointFor(12)]
    s.checkpoint_taken(12, b"0123456789")
    assert sent(s.events()) == [
        (0, TakenChunk(5, 12, 10, 0, b"0123")),
        (0, TakenChunk(5, 12, 10, 4, b"4567")),
        (0, TakenChunk(5, 12, 10, 8, b"89")),
    ]
    s.checkpoint_taken(12, b"0123456789")  # sent once
    assert s.events() == []


def test_a_secondary_not_streaming_or_in_a_new_term_sends_nothing_back() -> None:
    joining = Secondary(
        replica=1, epoch=5, history=ONE, log_base=0, log_end=10, commit_end=0, now=0.0
    )
    joining.receive(0, Roll(5, 12), 0.01)
    assert [e for e in joining.events() if isinstance(e, TakeCheckpointFor)] == []
    joining.checkpoint_taken(12, b"ab")
    assert sent(joining.events()) == []
    s = streaming()
    s.receive(0, Roll(5, 12), 0.01)
    s.events()
    s.receive(2, NewTerm(6, GROUP), 0.02)  # replica 2 took over: 0 asked, 2 did not
    s.events()
    s.checkpoint_taken(12, b"ab")
    assert s.events() == []


def test_a_secondary_ignores_taken_chunks_meant_for_a_primary() -> None:
    s = streaming()
    s.receive(2, TakenChunk(5, 12, 2, 0, b"ab"), 0.01)
    assert s.events() == []


def test_from_roll_to_taken_between_the_cores_the_bytes_arrive_whole() -> None:
    p, s = established(), streaming()
    data = bytes(range(256)) * 3
    p.rolled(10, 0.02)
    for to, msg in sent(p.events()):
        assert to == 1
        s.receive(0, msg, 0.03)
    assert s.events() == [TakeCheckpointFor(10)]
    s.checkpoint_taken(10, data)
    for to, msg in sent(s.events()):
        assert to == 0
        p.receive(1, msg, 0.04)
    got = bytearray(len(data))
    events = p.events()
    for e in events:
        if isinstance(e, StoreCheckpointChunk):
            got[e.offset : e.offset + len(e.data)] = e.data
    assert events[-1] == CheckpointTaken(10)
    assert bytes(got) == data
