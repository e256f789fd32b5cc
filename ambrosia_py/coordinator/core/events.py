"""What :class:`~.intake.Intake` hands the coordinator's asyncio side: frozen events.

Two kinds, as the two consumers want them. Control events (:class:`CheckpointRequested`,
:class:`CheckpointArrived`, :class:`InitialArrived`) come from the binding's stream, in its
order, through :meth:`Intake.next_event`. A :class:`RecordReady` is the next log record,
numbered and in both its forms, cut from the input pending when the committer asks for
it (:meth:`Intake.next_record`): asked for late, a record takes in everything that
arrived while the one before it was written (group commit).
"""

from __future__ import annotations

import attrs

from ... import wire
from ...wire.messages import slot_descriptors
from .checkpoint import OutboxState

__all__ = [
    "CheckpointArrived",
    "CheckpointRequested",
    "ControlEvent",
    "InitialArrived",
    "RecordReady",
    "new_record_ready",
]


@attrs.frozen
class CheckpointRequested:
    """The binding asked to roll the log and take a checkpoint (TakeCheckpoint)."""


@attrs.frozen
class CheckpointArrived:
    """The binding sent a checkpoint (its blob).

    ``binding_outputs`` is the index of the binding's next replayable output at that
    point; ``enqueued`` how many messages had been queued for logging before it: the
    checkpoint may only be committed once all of those are durable, since replay from it
    will not regenerate them (``Intake.next_record(..., upto=enqueued)``). ``attached``:
    the instances attached to by then (None: not recorded, see
    :meth:`Intake.restore_attached`).
    """

    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    binding_outputs: int = 0
    enqueued: int = 0
    outboxes: dict[str, OutboxState] = attrs.field(factory=dict)
    attached: frozenset[str] | None = None


@attrs.frozen
class InitialArrived:
    """The binding sent its InitialMessage (``frame``, framed). It is the first record
    :meth:`Intake.next_record` returns after this, alone in it (record 0 of a first
    start)."""

    frame: bytes


ControlEvent = CheckpointRequested | CheckpointArrived | InitialArrived


@attrs.frozen
class RecordReady:
    """The next log record: what to append, what to forward and what to confirm.

    ``disk_parts`` is appended to the log (header, messages, watermarks). Once it is
    durable, and only then, ``wire_parts`` (header and the same messages) is forwarded to
    the binding, and each link sender in ``marks`` (its seq after its last message here)
    is told its messages up to there are durable (:meth:`Intake.made_durable`, then a
    Commit on its link). ``size`` is the disk form's length in bytes.
    """

    seq: int
    disk_parts: list[wire.Payload] = attrs.field(repr=False)
    wire_parts: list[wire.Payload] = attrs.field(repr=False)
    marks: dict[str, int]
    size: int


_RECORD_SLOTS = tuple(
    d.__set__
    for d in slot_descriptors(
        RecordReady, ("seq", "disk_parts", "wire_parts", "marks", "size"), "new_record_ready"
    )
)


def new_record_ready(
    seq: int,
    disk_parts: list[wire.Payload],
    wire_parts: list[wire.Payload],
    marks: dict[str, int],
    size: int,
) -> RecordReady:
    """``RecordReady(...)`` with its slots set directly: one is made per record, and an
    awaited call and its reply are two records; the frozen class's ``__init__`` costs
    several times more."""
    record = object.__new__(RecordReady)
    put_seq, put_disk, put_wire, put_marks, put_size = _RECORD_SLOTS
    put_seq(record, seq)
    put_disk(record, disk_parts)
    put_wire(record, wire_parts)
    put_marks(record, marks)
    put_size(record, size)
    return record
