"""Versions of an instance in the replicated log, on cores driven by hand: a term's SYNC
says which version it ships from which seq; a secondary whose binding runs another says
so, and never installs a checkpoint its binding cannot load."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replication import (
    CheckpointChunk,
    History,
    InstallCheckpoint,
    Position,
    Primary,
    ReplicationRuleError,
    Secondary,
    StoreCheckpointChunk,
    Sync,
    VersionFrom,
    WriteRecords,
)
from tests.test_replication_rules import GROUP, ONE, TIMING, Append, recs, secondary, sent

TERM = History.of([(1, 0), (5, 10)])


def synced(version: int, *, term_version: int, since: int, end: int = 10) -> Secondary:
    """Replica 1, its binding at ``version``, synced to the primary of epoch 5."""
    s = secondary(5, ONE, end, version=version)
    s.receive(0, Sync(5, TERM, term_version, since, log_end=10), 0.0)
    return s


def test_a_sync_of_another_version_is_said_and_the_records_still_taken() -> None:
    s = synced(0, term_version=1, since=10)
    assert VersionFrom(5, 1, 10) in s.events()
    # The records are bytes to it: written and acknowledged as ever.
    s.receive(0, Append(5, 10, 10, recs(10, 12)), 0.01)
    assert WriteRecords(10, recs(10, 12)) in s.events()


def test_a_sync_of_its_own_version_says_nothing() -> None:
    s = synced(1, term_version=1, since=10)
    assert not [e for e in s.events() if isinstance(e, VersionFrom)]


def test_a_checkpoint_of_the_version_before_is_not_installed_by_the_new_code() -> None:
    """An upgrading primary's checkpoint before its term's start is of the old version:
    a replica of the new code waits for one of its own version."""
    s = synced(1, term_version=1, since=10, end=0)
    s.events()
    s.receive(0, CheckpointChunk(5, 8, 3, 0, b"old"), 0.01)
    events = s.events()
    assert not [e for e in events if isinstance(e, StoreCheckpointChunk | InstallCheckpoint)]
    s.receive(0, CheckpointChunk(5, 12, 3, 0, b"new"), 0.02)
    assert InstallCheckpoint(12) in s.events()


def test_a_checkpoint_of_the_new_version_is_reported_once_and_not_installed() -> None:
    s = synced(0, term_version=1, since=10, end=0)
    s.events()
    s.receive(0, CheckpointChunk(5, 12, 3, 0, b"new"), 0.01)
    events = s.events()
    assert VersionFrom(5, 1, 12, offered=True) in events
    assert not [e for e in events if isinstance(e, StoreCheckpointChunk | InstallCheckpoint)]
    s.receive(0, CheckpointChunk(5, 12, 3, 0, b"new"), 0.2)
    assert not [e for e in s.events() if isinstance(e, VersionFrom)]
    # One of its own version, before the term's turn, is installed.
    s.receive(0, CheckpointChunk(5, 8, 3, 0, b"old"), 0.3)
    assert InstallCheckpoint(8) in s.events()


def test_once_upgraded_in_place_the_new_version_is_its_own() -> None:
    s = synced(0, term_version=1, since=10, end=0)
    s.upgraded(1)
    s.events()
    s.receive(0, CheckpointChunk(5, 12, 3, 0, b"new"), 0.01)
    assert InstallCheckpoint(12) in s.events()


def test_a_higher_epoch_forgets_the_terms_version() -> None:
    s = synced(0, term_version=1, since=10)
    s.events()
    s.receive(2, Sync(6, TERM.extended(6, 10), 0, 0, log_end=10), 0.01)
    assert not [e for e in s.events() if isinstance(e, VersionFrom)]
    assert s.term_version == (0, 0)


def primary(**kw: int) -> Primary:
    return Primary(
        replica=0,
        group=GROUP,
        epoch=5,
        history=ONE,
        log_base=4,
        log_end=10,
        durable_end=10,
        commit_end=0,
        now=0.0,
        timing=TIMING,
        **kw,
    )


@pytest.mark.parametrize(("kw", "since"), [({"version": 2}, 4), ({"version": 3, "since": 10}, 10)])
def test_the_primarys_sync_says_its_version_from_its_base_or_as_given(
    kw: dict[str, int], since: int
) -> None:
    p = primary(**kw)
    p.receive(1, Position(5, 10, ONE, GROUP), 0.01)
    syncs = [m for _, m in sent(p.events()) if isinstance(m, Sync)]
    assert syncs == [Sync(5, TERM, kw["version"], since, log_end=10)]


def test_a_version_from_outside_the_log_is_refused() -> None:
    with pytest.raises(ReplicationRuleError, match="outside the log"):
        primary(version=1, since=11)
