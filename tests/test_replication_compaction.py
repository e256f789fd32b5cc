"""Epoch histories compacted below a checkpoint, on cores driven by hand: a new primary
keeps only the terms since its checkpoint; a secondary whose log its history no longer
vouches for (no epoch in common, records below its first entry) changes nothing and
starts over from the primary's checkpoint, whatever its seq."""

from __future__ import annotations

from ambrosia_py.coordinator.replication import (
    Ack,
    CheckpointChunk,
    History,
    InstallCheckpoint,
    Position,
    Primary,
    SaveHistory,
    SendCheckpoint,
    Sync,
    TruncateLog,
)
from ambrosia_py.coordinator.replication.states import SecondaryState
from tests.test_replication_rules import GROUP, TIMING, secondary, sent

H = History.of


def test_a_new_primary_keeps_the_terms_since_its_checkpoint() -> None:
    p = Primary(
        replica=0,
        group=GROUP,
        epoch=9,
        history=H([(1, 0), (3, 5), (4, 12), (7, 30)]),
        log_base=20,
        log_end=40,
        durable_end=40,
        commit_end=20,
        now=0.0,
        timing=TIMING,
    )
    p.receive(1, Position(9, 40, H([(1, 0), (3, 5), (4, 12), (7, 30)]), GROUP), 0.01)
    compacted = H([(4, 12), (7, 30), (9, 40)])
    assert SaveHistory(compacted) in p.events()
    assert p.history == compacted


def test_a_log_the_primary_cannot_vouch_for_is_replaced_by_its_checkpoint() -> None:
    # Replica 1 holds 0..12 of terms 1 and 2; the primary's history starts at 20.
    s = secondary(9, H([(1, 0), (2, 6)]), 12, commit_end=8)
    primary_history = H([(4, 20), (9, 40)])
    s.receive(0, Sync(9, primary_history, log_end=40), 0.0)
    events = s.events()
    # Nothing truncated, saved or acknowledged: it waits for the checkpoint.
    assert not [e for e in events if isinstance(e, TruncateLog | SaveHistory)]
    assert not [m for _, m in sent(events) if isinstance(m, Ack)]
    assert s.state is SecondaryState.INSTALLING
    # The checkpoint, at 25, installs over the whole log (even one reaching past it).
    s.receive(0, CheckpointChunk(9, 25, 2, 0, b"cp"), 0.01)
    events = s.events()
    assert events.index(InstallCheckpoint(25)) < events.index(SaveHistory(primary_history))
    assert (s.log_base, s.log_end, s.history) == (25, 25, primary_history)
    assert s.state is SecondaryState.STREAMING


def test_a_log_sharing_no_epoch_but_wholly_past_the_first_entry_is_truncated() -> None:
    """No record below the primary's first entry: those of terms it never heard of are
    not committed, as before compaction."""
    s = secondary(9, H([(2, 20)]), 30, log_base=22, commit_end=22)
    s.receive(0, Sync(9, H([(4, 20), (9, 40)]), log_end=40), 0.0)
    assert TruncateLog(22) in s.events()
    assert s.state is SecondaryState.STREAMING


def test_the_primary_sends_its_checkpoint_to_a_log_sharing_no_epoch() -> None:
    """Even one below which its own log reaches: it got its history, compacted, from a
    primary with a later checkpoint than its own, and cannot say from where they agree."""
    p = Primary(
        replica=0,
        group=GROUP,
        epoch=9,
        history=H([(4, 20)]),
        log_base=0,
        log_end=40,
        durable_end=40,
        commit_end=20,
        now=0.0,
        timing=TIMING,
    )
    p.receive(1, Position(9, 40, H([(4, 20)]), GROUP), 0.01)
    p.events()
    p.receive(2, Position(9, 12, H([(1, 0), (2, 6)]), GROUP), 0.02)
    assert SendCheckpoint(2) in p.events()


def test_a_secondary_keeps_its_own_entries_below_the_primarys_first() -> None:
    """Its history must reach every record of its log above its checkpoint, so that as a
    primary it compacts only below a checkpoint of its own."""
    s = secondary(9, H([(1, 0), (3, 5), (4, 12)]), 30, log_base=2, commit_end=2)
    s.receive(0, Sync(9, H([(4, 12), (9, 30)]), log_end=30), 0.0)
    joined = H([(1, 0), (3, 5), (4, 12), (9, 30)])
    assert SaveHistory(joined) in s.events()
    assert s.history == joined
