"""What the replication cores ask of their adapter, and how they are configured.

The cores (:class:`~.primary.Primary`, :class:`~.secondary.Secondary`) return frozen
events; the adapter carries them out **in order**, each one that says *durably* made
durable before it carries out the next (a :class:`SaveEpoch` before the
:class:`Send` of the position that follows it, a :class:`TruncateLog` before the
:class:`SaveHistory` after it). :class:`WriteRecords` is the exception: the adapter
writes at once and reports durability later, with ``records_durable``; acknowledgements
wait for that report.
"""

from __future__ import annotations

from collections import deque

import attrs

from .group import Group
from .history import History
from .messages import Buffer, Message

__all__ = [
    "CheckpointTaken",
    "CommitAdvanced",
    "Established",
    "Event",
    "EventQueue",
    "Group",
    "InstallCheckpoint",
    "PrimaryLost",
    "ReadLog",
    "Recovered",
    "Replayable",
    "RoleHandedOver",
    "SaveEpoch",
    "SaveHistory",
    "Send",
    "SendCheckpoint",
    "SteppedDown",
    "StoreCheckpointChunk",
    "TakeCheckpointFor",
    "Timing",
    "TrimOutboxes",
    "TruncateLog",
    "VersionFrom",
    "WriteRecords",
]


@attrs.frozen
class Timing:
    """The cores' time rules, in seconds of the adapter's monotonic clock (it passes
    ``now`` in; the cores read no clock).

    ``heartbeat_every``: the primary sends a replica a heartbeat when it has sent it
    nothing for this long. ``failover_after``: a secondary that has heard nothing from
    its primary for this long reports it lost. ``retry_after``: a secondary repeats the
    same resend request or position no sooner, and gives up a checkpoint transfer that
    brought nothing for this long. ``establish_within``: a new primary that has not
    gathered its quorum by then steps down. ``max_inflight``: records sent a replica and
    not yet acknowledged durable, at most, before the primary waits;
    ``max_inflight_bytes``: their bytes, likewise (one read from the log, at most
    ``max_append_bytes``, may pass it), so that what waits for a slow replica fits the
    transport's queue for it (64 MiB) instead of being dropped there and sent again.
    ``max_append_bytes``: the records one APPEND carries, at most (one larger record goes
    alone).
    ``checkpoint_chunk``: the bytes of one checkpoint chunk."""

    heartbeat_every: float = 0.05
    failover_after: float = 0.3
    retry_after: float = 0.1
    establish_within: float = 0.6
    max_inflight: int = 4096
    max_inflight_bytes: int = 32 << 20
    max_append_bytes: int = 8 << 20
    checkpoint_chunk: int = 1 << 20


# --- both sides ------------------------------------------------------------------------


@attrs.frozen
class Send:
    """Send ``message`` to replica ``to``."""

    to: int
    message: Message


@attrs.frozen
class SaveEpoch:
    """Durably: this replica holds ``epoch`` now, and refuses anything lower, also after
    a restart."""

    epoch: int


@attrs.frozen
class SaveHistory:
    """Durably: the log's epoch history is ``history`` now."""

    history: History


# --- the primary's ---------------------------------------------------------------------


@attrs.frozen
class Established:
    """The term is established: the log is the one to continue. Records below
    ``term_start`` come from earlier terms; they are committed with the first commit
    of this term, and the binding must have replayed them before it takes new input."""

    epoch: int
    term_start: int


@attrs.frozen
class CommitAdvanced:
    """Records below ``commit_end`` are committed: forward them to the binding,
    acknowledge them to other instances, answer them on the ingress."""

    commit_end: int


@attrs.frozen
class ReadLog:
    """Read records from ``from_seq`` on (as many as suit one APPEND) and hand them to
    ``Primary.records_read(replica, from_seq, records)``."""

    replica: int
    from_seq: int


@attrs.frozen
class SendCheckpoint:
    """Read the latest checkpoint and hand it over with ``Primary.checkpoint_read``."""

    replica: int


@attrs.frozen
class CheckpointTaken:
    """Durably: the checkpoint kept aside (:class:`StoreCheckpointChunk`), which a
    secondary took for this primary's roll at ``seq``, is the state before record
    ``seq``: keep it as the checkpoint of the log that starts there."""

    seq: int


@attrs.frozen
class SteppedDown:
    """This replica is primary no more: it met ``epoch`` (higher than its own), could
    not gather its quorum, or is outranked (``better``: the replica with the most
    up-to-date log it heard of, the one to take over, when it knows one), or handed the
    role to ``better`` (``handed``: it asked, and holds the whole log shipped). Carry on
    as a secondary holding ``epoch``."""

    epoch: int
    reason: str
    better: int | None = None
    handed: bool = False


# --- the secondary's -------------------------------------------------------------------


@attrs.frozen
class TruncateLog:
    """Durably: keep the records below ``end``, drop the rest (an uncommitted tail that
    disagrees with the primary's log)."""

    end: int


@attrs.frozen
class WriteRecords:
    """Write these on-disk records, ``first_seq`` on, at the log's end; fdatasync, then
    report with ``Secondary.records_durable``."""

    first_seq: int
    records: tuple[Buffer, ...] = attrs.field(repr=lambda r: f"<{len(r)} records>")


@attrs.frozen
class Replayable:
    """Records below ``end`` are committed and in the log: replay them to the binding
    (continuous recovery)."""

    end: int


@attrs.frozen
class TrimOutboxes:
    """Per destination instance, the seq below which it has what this instance sent it:
    drop that output from the outboxes the binding's replay fills (and what it will
    regenerate below it)."""

    points: tuple[tuple[str, int], ...]


@attrs.frozen
class PrimaryLost:
    """Nothing came from the primary of ``epoch`` (replica ``primary``, if known) for
    ``failover_after``: try to take the role over from that term."""

    epoch: int
    primary: int | None


@attrs.frozen
class RoleHandedOver:
    """The primary of ``epoch`` (replica ``primary``) stepped down for this replica,
    which asked: take the role from that term now."""

    epoch: int
    primary: int


@attrs.frozen
class TakeCheckpointFor:
    """The primary rolled its log at ``seq``: have the binding, once it has replayed
    record ``seq - 1``, take its checkpoint, and hand it over with
    ``Secondary.checkpoint_taken``; or nothing, if the replay is past ``seq`` already or
    another checkpoint is under way (the primary asks again at its next roll)."""

    seq: int


@attrs.frozen
class StoreCheckpointChunk:
    """Keep bytes ``offset ..`` of the checkpoint at ``seq`` (``total`` in all) aside,
    at their offset (chunks come in any order); ``starts_over``: drop whatever was kept
    of another transfer first."""

    seq: int
    total: int
    offset: int
    data: Buffer = attrs.field(repr=lambda d: f"<{len(d)} bytes>")
    starts_over: bool = False


@attrs.frozen
class InstallCheckpoint:
    """Durably: the checkpoint kept aside is the one to recover from, the state before
    record ``seq``; the log starts over, empty, at ``seq``; reload the binding from it."""

    seq: int


@attrs.frozen
class VersionFrom:
    """The term of ``epoch`` ships the instance's ``version``, not the one this replica's
    binding runs, from record ``since`` on: the binding must replay nothing from there
    with its code. It upgrades in place there (a replica started to upgrade to
    ``version``, holding the log up to ``since``) or this replica stops. ``offered``:
    the primary offers a checkpoint of that version, at ``since``, which the binding
    cannot load (the primary's log no longer holds the records this one lacks), so no
    upgrade in place can follow; it is not installed."""

    epoch: int
    version: int
    since: int
    offered: bool = False


@attrs.frozen
class Recovered:
    """A replica started with an empty data dir has caught up: its log is durable up to
    ``end``, where the primary of ``epoch`` said its log ended when it synced it. Its
    positions count toward new terms from now on; save that before saying so."""

    epoch: int
    end: int


Event = (
    Send
    | SaveEpoch
    | SaveHistory
    | Established
    | CommitAdvanced
    | ReadLog
    | SendCheckpoint
    | SteppedDown
    | TruncateLog
    | WriteRecords
    | Replayable
    | TrimOutboxes
    | PrimaryLost
    | StoreCheckpointChunk
    | InstallCheckpoint
    | TakeCheckpointFor
    | CheckpointTaken
    | VersionFrom
    | RoleHandedOver
    | Recovered
)


class EventQueue:
    """What a core has for its adapter, in order: :meth:`next_event` one at a time, or
    :meth:`events` all at once."""

    def __init__(self) -> None:
        self._events: deque[Event] = deque()

    def next_event(self) -> Event | None:
        """The next thing to do, or None."""
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        """Every event pending."""
        out = list(self._events)
        self._events.clear()
        return out
