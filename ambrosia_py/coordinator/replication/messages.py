"""The replicated log's messages and their bytes, sans-IO.

Every message travels in one frame::

    frame   := uvarint length | u8 version (1) | u8 kind | fields
    history := uvarint count | (uvarint epoch | uvarint start) * count
    group   := uvarint version | members | ack | changing (0 or 1) [| members | ack]
    members := uvarint count | uvarint replica * count (increasing)
    records := uvarint count | (uvarint size | on-disk record) * count

``length`` counts everything after it. Every integer field is an unsigned LEB128 varint
(:func:`ambrosia_py.wire.varint.encode_uvarint`) of at most 10 bytes and at most
``2**63 - 1``. Positions are *ends*: ``log_end`` is the seq the next record will take,
``commit_end`` the first seq not known committed, so nothing needs a -1. The kinds::

    1 NEW_TERM    primary -> all        epoch | group
    2 POSITION    replica -> primary    epoch | log_end | history (its effective part)
                                        | group | recovering (0 or 1) | incarnation
    3 SYNC        primary -> replica    epoch | history (the primary's, ending in epoch)
                                        | version | since | log_end | answers
    4 APPEND      primary -> replica    epoch | first_seq | commit_end | records
    5 HEARTBEAT   primary -> replica    epoch | log_end | commit_end
    6 ACK         replica -> primary    epoch | durable_end | log_end
    7 RESEND      replica -> primary    epoch | from_seq
    8 REFUSE      anyone -> sender      epoch (the higher one the refuser holds)
    9 CHECKPOINT  primary -> replica    epoch | seq | total | offset | data (to the end)
   10 TRIM        primary -> replica    epoch | count | (uvarint size | name | seq) * count
   11 PROBE       secondary -> others   epoch | round
   12 SILENCE     replica -> prober     epoch | round | silent (0 or 1)
   13 ROLL        primary -> replica    epoch | seq
   14 TAKEN       replica -> primary    epoch | seq | total | offset | data (to the end)
   15 ASK_ROLE    replica -> primary    epoch | log_end
   16 HANDOVER    primary -> all        epoch | to | log_end

An APPEND's records are in their on-disk form (:mod:`ambrosia_py.wire.records`: header
with the length as ``-length-1``, messages, watermarks), numbered ``first_seq``,
``first_seq + 1``, ...: decoding checks each one's header, seq, check bytes and that its
watermarks end exactly at its size, so a secondary writes nothing it could not scan back.
Decoding is strict: a wrong version or kind, a field cut short or too long, an out of
range value, a history out of order, trailing bytes: each is a
:class:`~.errors.ReplicationProtocolError` naming the message, the field and the offset
(from the frame's first byte, or from the stream's in :class:`.frames.FrameReader`).

A TRIM's names are instance names in UTF-8 (at most :data:`MAX_NAME_BYTES` bytes each,
at most :data:`MAX_TRIMS` of them, no name twice); each ``seq`` says that instance has
durably every message below it that this instance sent it.

A SYNC's ``version`` is the instance's version (``run --upgrade-version``) of the records
and checkpoints the term ships from seq ``since`` on; those below ``since``, if it ships
any, are of the version before. A term is of one version: a replica started to upgrade
takes its term at the old version's end and upgrades before it writes a record, so
``since`` is that term's start; any other term says its log's base.

NEW_TERM and POSITION say the group of the sender's term (:mod:`.group`): the store's
number for it (``version``), its members and how many make a record committed (``ack``,
at least 1 and at most the members), and, while a change is under way, the members and
ack it changes from. A term's quorum meets every set of replicas a record was committed
on only if it counts as the group's rules say, so a primary counts no position that
names another group and sends that replica its NEW_TERM; a secondary takes the group of
the term it follows, and stops if a NEW_TERM names another group under its own group's
number (replicas started with different ``--replicas`` or ``--replication-ack``).

A POSITION's ``recovering`` says the replica started with an empty data dir (a new
machine, or one that lost its disk) and has not yet caught up: it may have acknowledged
records before it lost them, so a new term does not count it among the positions it
needs (:mod:`.primary`). It has caught up once its log is durable up to the ``log_end``
of a SYNC it was sent since it started: where the primary's log ended then. Since it
started, not before: a SYNC queued for the replica before it lost its disk may reach it
after, saying where the log ended long ago. So a replica says in each POSITION its
``incarnation``, a number it picks at random each time it starts, and a SYNC says which
incarnation's POSITION it ``answers``; a recovering replica counts only a SYNC that
answers its own.

PROBE and SILENCE are the check before a take-over (Raft's pre-vote): a secondary that
has heard nothing from the primary for ``failover_after`` asks the others, in a numbered
``round``, whether they find it silent too, and takes the role only once enough of them
say so. Their ``epoch`` is the sender's, for the record only: neither is refused for it,
nor makes anyone adopt it (a probe must not disturb a term that is alive).

ROLL and TAKEN keep the primary from pausing to checkpoint: at its size trigger the
primary rolls its log at ``seq`` and asks one secondary (ROLL) for the state before
``seq``; that secondary's binding, which replays the log, takes it, and the secondary
sends it back in chunks (TAKEN, laid out as CHECKPOINT) for the primary to keep as the
checkpoint of the log it started at ``seq``.

ASK_ROLE and HANDOVER hand the role over to a replica started to upgrade, without a
failover's wait: once it holds the primary's whole log it asks (ASK_ROLE, its log's
end); the primary ships nothing more, commits nothing past what it had shipped, and once
that replica has acknowledged all of it durable tells every replica (HANDOVER: to whom,
and where its log ends) and steps down. The others leave the role to ``to`` for a while.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import ClassVar, Final

import attrs

from ...wire import records as wrecords
from ...wire.varint import encode_uvarint, uvarint_size
from .errors import ReplicationProtocolError, ReplicationRuleError
from .fields import MAX_HISTORY, MAX_NAME_BYTES, MAX_RECORDS, MAX_TRIMS, Fields
from .group import Group
from .history import MAX_POSITION, History

__all__ = [
    "DEFAULT_MAX_FRAME",
    "MAX_HISTORY",
    "MAX_NAME_BYTES",
    "MAX_RECORDS",
    "MAX_TRIMS",
    "VERSION",
    "Ack",
    "Append",
    "AskRole",
    "CheckpointChunk",
    "Handover",
    "Heartbeat",
    "Kind",
    "Message",
    "NewTerm",
    "OutboxTrim",
    "Position",
    "Probe",
    "Refuse",
    "Resend",
    "Roll",
    "Silence",
    "Sync",
    "TakenChunk",
    "encode_frame",
    "append_size",
    "decode_body",
    "encode_parts",
]

VERSION: Final = 1
DEFAULT_MAX_FRAME: Final = wrecords.DEFAULT_MAX_RECORD_SIZE + (64 << 20)
"""A frame may hold the largest record AMBROSIA allows and its watermarks."""

Buffer = bytes | memoryview


class Kind(enum.IntEnum):
    """The kind byte of a frame."""

    NEW_TERM = 1
    POSITION = 2
    SYNC = 3
    APPEND = 4
    HEARTBEAT = 5
    ACK = 6
    RESEND = 7
    REFUSE = 8
    CHECKPOINT = 9
    TRIM = 10
    PROBE = 11
    SILENCE = 12
    ROLL = 13
    TAKEN = 14
    ASK_ROLE = 15
    HANDOVER = 16


@attrs.frozen
class NewTerm:
    """The primary of ``epoch`` announces its term, for its ``group``:
    adopt the epoch, answer with a :class:`Position`. Sent to every replica until it
    answers."""

    KIND: ClassVar = Kind.NEW_TERM
    epoch: int
    group: Group


@attrs.frozen
class Position:
    """A replica that holds ``epoch`` tells its primary what its log holds: where it ends,
    the effective part of its epoch history (:meth:`rank` is the Raft order), the
    ``group`` of the term it follows, and whether it is ``recovering`` (started
    empty, not caught up yet: not counted by a new term), and its ``incarnation`` (a
    number picked at random as it started, that the SYNC answering it repeats)."""

    KIND: ClassVar = Kind.POSITION
    epoch: int
    log_end: int
    history: History
    group: Group
    recovering: bool = False
    incarnation: int = 0

    @property
    def last_epoch(self) -> int:
        return self.history.last_epoch(self.log_end)

    def rank(self) -> tuple[int, int]:
        return self.history.rank(self.log_end)


@attrs.frozen
class Sync:
    """The established primary of ``epoch`` gives a replica its history: the replica
    truncates what disagrees with it (:func:`~.history.agreement`) and takes it. What the
    term ships from ``since`` on is of the instance's ``version``; its log ended at
    ``log_end`` as it sent this (a recovering replica has caught up once it holds that
    much); it ``answers`` the POSITION of that incarnation of the replica."""

    KIND: ClassVar = Kind.SYNC
    epoch: int
    history: History
    version: int = 0
    since: int = 0
    # Said by every SYNC (a recovering replica's safety rests on it): no default.
    log_end: int = attrs.field(kw_only=True)
    answers: int = attrs.field(default=0, kw_only=True)


@attrs.frozen
class Append:
    """Records ``first_seq``, ``first_seq + 1``, ... in their on-disk form, and the
    primary's commit point."""

    KIND: ClassVar = Kind.APPEND
    epoch: int
    first_seq: int
    commit_end: int
    records: tuple[Buffer, ...] = attrs.field(repr=lambda r: f"<{len(r)} records>")

    @property
    def end(self) -> int:
        return self.first_seq + len(self.records)


@attrs.frozen
class Heartbeat:
    """The primary is alive; its log ends at ``log_end``, commit at ``commit_end``."""

    KIND: ClassVar = Kind.HEARTBEAT
    epoch: int
    log_end: int
    commit_end: int


@attrs.frozen
class Ack:
    """A synced replica's log: durable (fdatasync'ed) below ``durable_end``, written
    below ``log_end``."""

    KIND: ClassVar = Kind.ACK
    epoch: int
    durable_end: int
    log_end: int


@attrs.frozen
class Resend:
    """A synced replica asks for the records from ``from_seq`` on (its log ends there)."""

    KIND: ClassVar = Kind.RESEND
    epoch: int
    from_seq: int


@attrs.frozen
class Refuse:
    """The answer to a message of a lower epoch: the refuser holds ``epoch``."""

    KIND: ClassVar = Kind.REFUSE
    epoch: int


@attrs.frozen
class CheckpointChunk:
    """Bytes ``offset ..`` of the checkpoint to recover from at ``seq`` (the state before
    record ``seq``), ``total`` bytes in all."""

    KIND: ClassVar = Kind.CHECKPOINT
    epoch: int
    seq: int
    total: int
    offset: int
    data: Buffer = attrs.field(repr=lambda d: f"<{len(d)} bytes>")

    @property
    def last(self) -> bool:
        return self.offset + len(self.data) == self.total


@attrs.frozen
class OutboxTrim:
    """Per destination instance, the seq below which it has confirmed durable what this
    instance sent it: a secondary, whose binding regenerates that output as it replays,
    forgets it as the primary did."""

    KIND: ClassVar = Kind.TRIM
    epoch: int
    points: tuple[tuple[str, int], ...]


@attrs.frozen
class Probe:
    """A secondary of ``epoch`` finds its primary silent: do the others, too? ``round``
    numbers its asking, so an answer is matched to the round it answers."""

    KIND: ClassVar = Kind.PROBE
    epoch: int
    round: int


@attrs.frozen
class Silence:
    """The answer to a :class:`Probe` of ``round``: whether the answering replica, of
    ``epoch``, has heard nothing from a primary for a while (a primary: never)."""

    KIND: ClassVar = Kind.SILENCE
    epoch: int
    round: int
    silent: bool


@attrs.frozen
class Roll:
    """The primary rolled its log at ``seq``: take the state before record ``seq`` (the
    binding's checkpoint, once it has replayed record ``seq - 1``) and send it back."""

    KIND: ClassVar = Kind.ROLL
    epoch: int
    seq: int


@attrs.frozen
class TakenChunk:
    """Bytes ``offset ..`` of the checkpoint a secondary took for a :class:`Roll` at
    ``seq``, ``total`` bytes in all."""

    KIND: ClassVar = Kind.TAKEN
    epoch: int
    seq: int
    total: int
    offset: int
    data: Buffer = attrs.field(repr=lambda d: f"<{len(d)} bytes>")


@attrs.frozen
class AskRole:
    """A replica started to upgrade holds the primary's log to ``log_end``, durably:
    hand it the role."""

    KIND: ClassVar = Kind.ASK_ROLE
    epoch: int
    log_end: int


@attrs.frozen
class Handover:
    """The primary of ``epoch`` steps down for replica ``to``, which holds its log to
    ``log_end``: leave the role to it."""

    KIND: ClassVar = Kind.HANDOVER
    epoch: int
    to: int
    log_end: int


Message = (
    NewTerm
    | Position
    | Sync
    | Append
    | Heartbeat
    | Ack
    | Resend
    | Refuse
    | CheckpointChunk
    | OutboxTrim
    | Probe
    | Silence
    | Roll
    | TakenChunk
    | AskRole
    | Handover
)


# --- encoding --------------------------------------------------------------------------


def _uint(value: int, name: str) -> bytes:
    if not 0 <= value <= MAX_POSITION:
        raise ReplicationRuleError(f"{name} {value} is not in 0..{MAX_POSITION}")
    return encode_uvarint(value)


def _history(history: History) -> bytes:
    if len(history) > MAX_HISTORY:
        raise ReplicationRuleError(f"history of {len(history)} entries, over {MAX_HISTORY}")
    out = [encode_uvarint(len(history))]
    for entry in history.entries:
        out += (encode_uvarint(entry.epoch), encode_uvarint(entry.start))
    return b"".join(out)


def _trims(points: tuple[tuple[str, int], ...]) -> bytes:
    if len(points) > MAX_TRIMS:
        raise ReplicationRuleError(f"{len(points)} trim points, over {MAX_TRIMS}")
    if len({name for name, _ in points}) != len(points):
        raise ReplicationRuleError("a destination named twice in one trim")
    out = [encode_uvarint(len(points))]
    for name, seq in points:
        raw = name.encode()
        if not raw or len(raw) > MAX_NAME_BYTES:
            raise ReplicationRuleError(f"destination name of {len(raw)} bytes in a trim")
        out += (encode_uvarint(len(raw)), raw, _uint(seq, "seq"))
    return b"".join(out)


def _group(group: Group) -> bytes:
    def members(g: Group) -> bytes:
        out = [encode_uvarint(g.n), *(_uint(r, "member") for r in sorted(g.replicas))]
        return b"".join(out) + _uint(g.k, "ack")

    out = _uint(group.version, "group version") + members(group)
    if group.previous is None:
        return out + b"\x00"
    return out + b"\x01" + members(group.previous)


def encode_parts(msg: Message) -> list[Buffer]:
    """``msg`` as one frame, in buffers for ``writev``: records and checkpoint data are
    not copied."""
    head = bytearray((VERSION, msg.KIND))
    head += _uint(msg.epoch, "epoch")
    tail: list[Buffer] = []
    match msg:
        case NewTerm():
            head += _group(msg.group)
        case Refuse():
            pass
        case Position():
            head += _uint(msg.log_end, "log_end") + _history(msg.history)
            head += _group(msg.group) + encode_uvarint(int(msg.recovering))
            head += _uint(msg.incarnation, "incarnation")
        case Sync():
            head += _history(msg.history) + _uint(msg.version, "version")
            head += _uint(msg.since, "since") + _uint(msg.log_end, "log_end")
            head += _uint(msg.answers, "answers")
        case Append():
            if len(msg.records) > MAX_RECORDS:
                raise ReplicationRuleError(f"{len(msg.records)} records, over {MAX_RECORDS}")
            head += _uint(msg.first_seq, "first_seq") + _uint(msg.commit_end, "commit_end")
            head += encode_uvarint(len(msg.records))
            for record in msg.records:
                tail += (encode_uvarint(len(record)), record)
        case Heartbeat():
            head += _uint(msg.log_end, "log_end") + _uint(msg.commit_end, "commit_end")
        case Ack():
            head += _uint(msg.durable_end, "durable_end") + _uint(msg.log_end, "log_end")
        case Resend():
            head += _uint(msg.from_seq, "from_seq")
        case CheckpointChunk() | TakenChunk():
            head += _uint(msg.seq, "seq") + _uint(msg.total, "total")
            head += _uint(msg.offset, "offset")
            tail.append(msg.data)
        case OutboxTrim():
            head += _trims(msg.points)
        case Probe():
            head += _uint(msg.round, "round")
        case Roll():
            head += _uint(msg.seq, "seq")
        case AskRole():
            head += _uint(msg.log_end, "log_end")
        case Handover():
            head += _uint(msg.to, "to") + _uint(msg.log_end, "log_end")
        case Silence():
            head += _uint(msg.round, "round") + encode_uvarint(int(msg.silent))
    size = len(head) + sum(len(t) for t in tail)
    return [encode_uvarint(size) + head, *tail]


def encode_frame(msg: Message) -> bytes:
    """``msg`` as one frame, joined."""
    return b"".join(encode_parts(msg))


# --- decoding --------------------------------------------------------------------------


_NAMES = {kind: kind.name for kind in Kind}


def decode_body(body: memoryview, base: int = 0) -> Message:
    """The message in a frame's ``body`` (from its version byte on); ``base`` is the
    body's offset, for errors."""
    if len(body) < 2:
        raise ReplicationProtocolError(
            f"frame of {len(body)} bytes: a version and a kind byte needed", offset=base
        )
    if body[0] != VERSION:
        raise ReplicationProtocolError(
            f"frame version {body[0]}, only {VERSION} is known", offset=base
        )
    try:
        kind = Kind(body[1])
    except ValueError:
        raise ReplicationProtocolError(f"unknown frame kind {body[1]}", offset=base + 1) from None
    f = Fields(body, base, _NAMES[kind])
    f.pos = 2
    epoch = f.uint("epoch")
    msg: Message
    match kind:
        case Kind.NEW_TERM:
            msg = NewTerm(epoch, f.group())
        case Kind.REFUSE:
            msg = Refuse(epoch)
        case Kind.POSITION:
            end_at = f.pos
            log_end = f.uint("log_end")
            history = f.history("history")
            if history.entries and history.entries[-1].start > log_end:
                f.fail(f"history starts an epoch past log_end {log_end}", end_at)
            group, recovering = f.group(), f.flag("recovering")
            msg = Position(epoch, log_end, history, group, recovering, f.uint("incarnation"))
        case Kind.SYNC:
            at = f.pos
            history = f.history("history")
            if not history.entries or history.entries[-1].epoch != epoch:
                f.fail(f"history does not end in the sender's epoch {epoch}", at)
            version, since_at = f.uint("version"), f.pos
            since, end_at = f.uint("since"), f.pos
            log_end = f.uint("log_end")
            answers = f.uint("answers")
            if since > log_end:
                f.fail(f"since {since} is past log_end {log_end}", since_at)
            if history.entries[-1].start > log_end:
                f.fail(f"history starts epoch {epoch} past log_end {log_end}", end_at)
            msg = Sync(epoch, history, version, since, log_end=log_end, answers=answers)
        case Kind.APPEND:
            first_seq = f.uint("first_seq")
            commit_end = f.uint("commit_end")
            records = f.records(first_seq)
            if first_seq + len(records) > MAX_POSITION:
                f.fail("records run past the largest seq")
            msg = Append(epoch, first_seq, commit_end, records)
        case Kind.HEARTBEAT:
            log_end, at = f.uint("log_end"), f.pos
            commit_end = f.uint("commit_end")
            if commit_end > log_end:
                f.fail(f"commit_end {commit_end} past log_end {log_end}", at)
            msg = Heartbeat(epoch, log_end, commit_end)
        case Kind.ACK:
            durable_end = f.uint("durable_end")
            at = f.pos
            log_end = f.uint("log_end")
            if durable_end > log_end:
                f.fail(f"durable_end {durable_end} past log_end {log_end}", at)
            msg = Ack(epoch, durable_end, log_end)
        case Kind.RESEND:
            msg = Resend(epoch, f.uint("from_seq"))
        case Kind.CHECKPOINT | Kind.TAKEN:
            seq = f.uint("seq")
            total = f.uint("total")
            at = f.pos
            offset = f.uint("offset")
            data = f.rest()
            if offset + len(data) > total:
                f.fail(f"{len(data)} bytes at offset {offset} run past total {total}", at)
            if not data and total:
                f.fail("a chunk without data", at)
            chunk = CheckpointChunk if kind is Kind.CHECKPOINT else TakenChunk
            msg = chunk(epoch, seq, total, offset, data)
        case Kind.TRIM:
            msg = OutboxTrim(epoch, f.trims())
        case Kind.PROBE:
            msg = Probe(epoch, f.uint("round"))
        case Kind.SILENCE:
            msg = Silence(epoch, f.uint("round"), f.flag("silent"))
        case Kind.ROLL:
            msg = Roll(epoch, f.uint("seq"))
        case Kind.ASK_ROLE:
            msg = AskRole(epoch, f.uint("log_end"))
        case Kind.HANDOVER:
            msg = Handover(epoch, f.uint("to"), f.uint("log_end"))
    f.end()
    return msg


def append_size(records: Sequence[Buffer]) -> int:
    """About the bytes records take in an APPEND: to cut batches below a frame limit."""
    return sum(len(r) + uvarint_size(len(r)) for r in records)
