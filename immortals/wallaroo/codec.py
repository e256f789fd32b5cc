"""The connector protocol's two dialects: one table per dialect, and frames <-> bytes.

Owns the wire facts of seed 000 (the draft), seed 001 (MIGRATE, MIGRATION_ACK) and the
reference's released revision (v3): per dialect one table of rows ``tag, frame class,
body layout``, its byte order and its string length widths. :func:`encode` and
:func:`decode` read that table, so a tag or a field order is written down once.

Every frame is ``u32 length | u8 tag | body``; the length counts the tag and the body
(seed 000, *Wire Format*). The draft is little-endian with ASCII tags; v3 big-endian with
tags 0..8. Short strings are a u16 length and the bytes, RESTART's address and MIGRATE's
host a u32 length (the ``*_length_bytes`` of :class:`DialectSpec`). :func:`split_frames`
cuts a byte stream at those lengths, and refuses a length over the limit as soon as its
four bytes are in, before any of its body is held (footnote B1): that is all the edges
do to the bytes; the cores decode each frame's tag and body with :func:`decode_tagged`.

Where the seed is vague we chose, and say so here once:

- The draft's HELLO ``version(Revision)`` is never defined; footnote A1 calls it a
  version GUID and B0 "a truncated 128bit part" of a commit hash, and the worker reads it
  "in fixed locations at the start". We write it as a fixed 16-byte little-endian
  integer; :data:`DRAFT_VERSION` is the first 128 bits of the SHA-256 of the seed's
  title, as B0 suggests a truncated hash.
- The draft's ``message/3`` writes no stream id, yet the text says message frames carry
  the id a NOTIFY set (seed 000, *Overview*, footnote A6, *Streaming*). We put a u64
  stream id first, as in NOTIFY and as v3 does: ``stream_id u64 | flags u16 | message_id
  u64 | [event_time u64] | payload``.
- Draft flags: bits outside the five the seed defines are refused (a future bit may
  change the layout); BOUNDARY with EVENT_TIME is refused (footnote D1 gives boundaries
  no event time). A boundary has no payload, so bytes after its message id are trailing.
- The addendum's tags 8 and 9, and the reference's 4 (NOTIFY_ACK) and 7 (RESTART) in the
  draft, are those byte values, not ASCII digits.

*What a dialect cannot express*: :func:`encode` raises :class:`~.errors.EncodeError`
naming the frame, the field and the dialect, never drops or invents data. A frame class
absent from the dialect's table (NACK, MIGRATE, MIGRATION_ACK in v3; EOS_MESSAGE in the
draft), a field the dialect lacks holding anything but its default (OK's points of
reference in v3; a message key in the draft; message flags in v3), and values with no
encoding: in v3 an absent event time, an empty key or an empty payload (v3 reads length
0 as "none"); in the draft a boundary with an event time or a negative event time.
"""

from __future__ import annotations

import enum
import hashlib
import struct
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, Literal

import attrs

from . import primitives as p
from .errors import (
    EncodeError,
    FrameTooLargeError,
    InvalidFlagsError,
    TrailingBytesError,
    TruncatedFrameError,
    TruncatedStreamError,
    UnknownTagError,
)
from .frames import (
    LAYOUT_FLAGS,
    SENDER_FLAGS,
    Ack,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "DIALECTS",
    "DRAFT_VERSION",
    "LENGTH_PREFIX_BYTES",
    "NOTHING_SEEN",
    "V3_VERSION",
    "Dialect",
    "DialectSpec",
    "decode",
    "encode",
    "end_of_stream",
    "split_frames",
    "stream_id_for",
]


class Dialect(enum.StrEnum):
    """Which revision of the protocol a connection speaks."""

    DRAFT = "draft"
    """Seed 000 with the addendum 001: little-endian, ASCII tags. The default."""
    V3 = "v3"
    """What released Wallaroo connectors and workers speak: big-endian, tags 0..8."""


DRAFT_VERSION: Final = 0xB8705CB40466E34C1CDCAF574B42F3C9
"""The draft HELLO's 128-bit version: sha256(b"Wallaroo Connector Protocol: source-only,
async, credit based flow") truncated to 128 bits (our choice; seed 000, A1 and B0)."""

V3_VERSION: Final = "0.0.1"
"""The version string the released worker requires in HELLO (reference, *Handshake*)."""

DEFAULT_MAX_FRAME_BYTES: Final = 4 * 1024 * 1024
"""The largest length prefix (tag + body) accepted by default (seed 000, footnote B1)."""

LENGTH_PREFIX_BYTES: Final = 4
"""Every frame starts with a u32 length of the bytes after it."""

NOTHING_SEEN: Final = 2**64 - 1
"""NOTIFY_ACK's point of reference for a stream the worker has never seen (reference)."""

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_KNOWN_FLAGS: Final = int(SENDER_FLAGS | LAYOUT_FLAGS)  # int: ~ on a flag drops unknown bits


# --- MESSAGE: its layout depends on the dialect and, in the draft, on its flags ----------


def _unfit(field: str, spec: DialectSpec, reason: str) -> EncodeError:
    return EncodeError("Message", field, spec.dialect.value, reason)


def _encode_message_draft(m: Message, spec: DialectSpec) -> bytes:
    if m.key is not None:
        raise _unfit("key", spec, "the draft's MESSAGE has no key")
    if m.event_time is not None:
        if m.payload is None:
            raise _unfit("event_time", spec, "a boundary carries no event time (seed 000, D1)")
        if m.event_time < 0:
            raise _unfit("event_time", spec, f"{m.event_time} is not a u64")
    order = spec.byte_order
    parts = [
        m.stream_id.to_bytes(8, order),
        int(m.wire_flags).to_bytes(2, order),
        m.message_id.to_bytes(8, order),
    ]
    if m.event_time is not None:
        parts.append(m.event_time.to_bytes(8, order))
    if m.payload is not None:
        parts.append(m.payload)
    return b"".join(parts)


def _decode_message_draft(cur: p.Cursor, spec: DialectSpec) -> Message:
    stream_id = cur.uint(8, "stream_id")
    at = cur.pos
    raw = cur.uint(2, "flags")
    if raw & ~_KNOWN_FLAGS:
        reason = f"reserved bits 0x{raw & ~_KNOWN_FLAGS:04x} set (flags 0x{raw:04x})"
        raise cur.error(InvalidFlagsError, "flags", at, reason)
    flags = MessageFlags(raw)
    if flags & LAYOUT_FLAGS == LAYOUT_FLAGS:
        reason = "BOUNDARY with EVENT_TIME: a boundary carries no event time (seed 000, D1)"
        raise cur.error(InvalidFlagsError, "flags", at, reason)
    message_id = cur.uint(8, "message_id")
    event_time = cur.uint(8, "event_time") if flags & MessageFlags.EVENT_TIME else None
    payload: bytes | None = None
    if flags & MessageFlags.BOUNDARY:
        cur.end()
    else:
        payload = cur.rest()
    return Message(stream_id, message_id, payload, flags & SENDER_FLAGS, event_time)


def _encode_message_v3(m: Message, spec: DialectSpec) -> bytes:
    if m.flags:
        raise _unfit(
            "flags", spec, f"v3's MESSAGE has no flags, got {m.flags!r} (EOS: an EosMessage)"
        )
    if m.event_time is None:
        raise _unfit("event_time", spec, "v3's MESSAGE always carries an event time (an i64)")
    if not _I64_MIN <= m.event_time <= _I64_MAX:
        raise _unfit("event_time", spec, f"{m.event_time} is not an i64")
    # v3 reads a zero length as "no key" and an empty rest as "no payload", so the empty
    # values have no encoding of their own.
    if m.key == b"":
        raise _unfit("key", spec, "an empty key reads back as no key (None) in v3")
    if m.payload == b"":
        raise _unfit("payload", spec, "an empty payload reads back as a boundary (None) in v3")
    try:
        key = p.sized(m.key or b"", spec.short_length_bytes, spec)
    except p.Unfit as exc:
        raise _unfit("key", spec, str(exc)) from None
    order = spec.byte_order
    return b"".join(
        (
            m.stream_id.to_bytes(8, order),
            m.message_id.to_bytes(8, order),
            m.event_time.to_bytes(8, order, signed=True),
            key,
            m.payload or b"",
        )
    )


def _decode_message_v3(cur: p.Cursor, spec: DialectSpec) -> Message:
    stream_id = cur.uint(8, "stream_id")
    message_id = cur.uint(8, "message_id")
    event_time = cur.i64("event_time")
    key = cur.blob(spec.short_length_bytes, "key")
    payload = cur.rest()
    return Message(stream_id, message_id, payload or None, event_time=event_time, key=key or None)


# --- the tables -------------------------------------------------------------------------


@attrs.frozen
class _Row:
    """One frame of a dialect: its tag, its class, how its body is written and read."""

    tag: int
    cls: type[Any]
    encode: Callable[[Any, DialectSpec], bytes]
    decode: Callable[[p.Cursor, DialectSpec], Frame]


def _fields(tag: int | str, cls: type[Any], *fields: tuple[str, p.Kind]) -> _Row:
    """A row whose body is ``fields`` in order. A field of ``cls`` not listed is one the
    dialect does not have: encoding requires it to hold its default."""
    listed = {name for name, _ in fields}
    absent = tuple((a.name, a.default) for a in attrs.fields(cls) if a.name not in listed)

    def encode_body(frame: Any, spec: DialectSpec) -> bytes:
        d = spec.dialect.value
        for name, default in absent:
            if getattr(frame, name) != default:
                reason = f"{d}'s {cls.__name__} has no {name}; it must be {default!r}"
                raise EncodeError(cls.__name__, name, d, reason)
        parts = []
        for name, kind in fields:
            try:
                parts.append(kind.write(getattr(frame, name), spec))
            except p.Unfit as exc:
                raise EncodeError(cls.__name__, name, d, str(exc)) from None
        return b"".join(parts)

    def decode_body(cur: p.Cursor, spec: DialectSpec) -> Frame:
        values = {name: kind.read(cur, spec, name) for name, kind in fields}
        cur.end()
        return cls(**values)  # type: ignore[no-any-return]

    return _Row(ord(tag) if isinstance(tag, str) else tag, cls, encode_body, decode_body)


_POINT = ("point_of_reference", p.U64)

# Seed 000 (*Constants*, *Handshake*, *Streaming*), seed 001 (*Frame formats*), and the
# reference for NOTIFY_ACK and RESTART, which the addendum names without bytes.
_DRAFT_TABLE: Final = (
    _fields(
        "H",
        Hello,
        ("version", p.U128),
        ("cookie", p.SHORT_BYTES),
        ("program_name", p.SHORT_TEXT),
        ("instance_name", p.SHORT_TEXT),
    ),
    _fields("O", Ok, ("initial_credits", p.U32), ("points_of_reference", p.PAIRS_TO_END)),
    _fields("E", Error, ("reason", p.SHORT_TEXT)),
    _fields("N", Notify, ("stream_id", p.U64), ("stream_name", p.SHORT_TEXT), _POINT),
    _Row(ord("M"), Message, _encode_message_draft, _decode_message_draft),
    _fields("A", Ack, ("credits", p.U32), ("acks", p.PAIRS_TO_END)),
    _fields("!", Nack, ("credits", p.U32), ("stream_id", p.U64), _POINT),
    _fields(4, NotifyAck, ("success", p.BOOL), ("stream_id", p.U64), _POINT),
    _fields(7, Restart, ("address", p.LONG_TEXT)),
    _fields(8, Migrate, ("host", p.LONG_TEXT), ("port", p.U16)),
    _fields(9, MigrationAck),
)

# The reference, *Dialect v3*.
_V3_TABLE: Final = (
    _fields(
        0,
        Hello,
        ("version", p.SHORT_TEXT),
        ("cookie", p.SHORT_BYTES),
        ("program_name", p.SHORT_TEXT),
        ("instance_name", p.SHORT_TEXT),
    ),
    _fields(1, Ok, ("initial_credits", p.U32)),
    _fields(2, Error, ("reason", p.SHORT_TEXT)),
    _fields(3, Notify, ("stream_id", p.U64), ("stream_name", p.SHORT_TEXT), _POINT),
    _fields(4, NotifyAck, ("success", p.BOOL), ("stream_id", p.U64), _POINT),
    _Row(5, Message, _encode_message_v3, _decode_message_v3),
    _fields(6, Ack, ("credits", p.U32), ("acks", p.COUNTED_PAIRS)),
    _fields(7, Restart, ("address", p.LONG_TEXT)),
    _fields(8, EosMessage, ("stream_id", p.U64)),
)


@attrs.frozen
class DialectSpec:
    """What distinguishes a dialect on the wire (derived from its one table)."""

    dialect: Dialect
    byte_order: Literal["little", "big"]
    """The order of the length prefix and of every integer."""
    version: int | str
    """What HELLO's version must be: :data:`DRAFT_VERSION` or :data:`V3_VERSION`."""
    short_length_bytes: int
    """Width of a short string's length: cookie, names, reasons, a message key."""
    long_length_bytes: int
    """Width of RESTART's address and MIGRATE's host length."""
    tags: Mapping[type[Any], int]
    """Frame class -> tag, for the frames this dialect has."""
    classes: Mapping[int, type[Any]]
    """Tag -> frame class."""


def _spec(
    dialect: Dialect, order: Literal["little", "big"], version: int | str, table: tuple[_Row, ...]
) -> DialectSpec:
    return DialectSpec(
        dialect,
        order,
        version,
        short_length_bytes=2,
        long_length_bytes=4,
        tags=MappingProxyType({row.cls: row.tag for row in table}),
        classes=MappingProxyType({row.tag: row.cls for row in table}),
    )


_TABLES: Final[Mapping[Dialect, tuple[_Row, ...]]] = MappingProxyType(
    {Dialect.DRAFT: _DRAFT_TABLE, Dialect.V3: _V3_TABLE}
)

DIALECTS: Final[Mapping[Dialect, DialectSpec]] = MappingProxyType(
    {
        Dialect.DRAFT: _spec(Dialect.DRAFT, "little", DRAFT_VERSION, _DRAFT_TABLE),
        Dialect.V3: _spec(Dialect.V3, "big", V3_VERSION, _V3_TABLE),
    }
)
"""Each dialect's byte order, HELLO version, string length widths and tags."""

_BY_TAG: Final = {d: {row.tag: row for row in table} for d, table in _TABLES.items()}
_BY_CLASS: Final = {d: {row.cls: row for row in table} for d, table in _TABLES.items()}
_FRAME_CLASSES: Final = frozenset(row.cls for table in _TABLES.values() for row in table)

# Why a frame is missing from a dialect, where a hint helps the sender.
_MISSING: Final[Mapping[tuple[Dialect, type[Any]], str]] = MappingProxyType(
    {
        (Dialect.DRAFT, EosMessage): "the draft ends a stream with a MESSAGE flagged EOS "
        "(end_of_stream() builds the right frame)",
        (Dialect.V3, Nack): "v3 has no NACK (its worker rewinds a stream through ACK)",
        (Dialect.V3, Migrate): "v3 has no MIGRATE (its worker sends RESTART)",
        (Dialect.V3, MigrationAck): "v3 has no MIGRATION_ACK (seed 001 is draft only)",
    }
)


# --- encoding and decoding --------------------------------------------------------------


def encode(
    frame: Frame,
    dialect: Dialect | str = Dialect.DRAFT,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> bytes:
    """``frame`` as ``dialect`` writes it, length prefix included.

    Raises :class:`~.errors.EncodeError` naming the frame, field and dialect if the
    dialect cannot express the frame (see the module docstring) or if the frame (tag and
    body) is over ``max_frame_bytes``; TypeError for what is not a frame.
    """
    d = Dialect(dialect)
    cls = type(frame)
    row = _BY_CLASS[d].get(cls)
    if row is None:
        if cls not in _FRAME_CLASSES:
            raise TypeError(f"{cls.__name__} is not a connector frame")
        reason = _MISSING.get((d, cls), f"{d} has no {cls.__name__} frame")
        raise EncodeError(cls.__name__, None, d.value, reason)
    spec = DIALECTS[d]
    body = row.encode(frame, spec)
    size = 1 + len(body)
    if size > max_frame_bytes:
        reason = f"a frame of {size} bytes is over the limit of {max_frame_bytes} (seed 000, B1)"
        raise EncodeError(cls.__name__, None, d.value, reason)
    return size.to_bytes(LENGTH_PREFIX_BYTES, spec.byte_order) + bytes((row.tag,)) + body


# MESSAGE is nearly every frame a worker reads, and the general path (a cursor per field,
# an IntFlag built per frame, attrs validators) was more than half of its time. The fast
# path reads a well-formed MESSAGE with one struct; anything else (short, reserved or
# contradictory flags, bytes after a boundary) goes down the general path, which raises
# the error that names it. The values are valid by construction (fixed-width fields), so
# the instance is built without re-running the validators.
_DRAFT_HEAD: Final = struct.Struct("<BQHQ")  # tag, stream id, flags, message id
_V3_HEAD: Final = struct.Struct(">BQQqH")  # tag, stream id, message id, event time, key len
_DRAFT_EVENT_TIME: Final = struct.Struct("<Q")
_SENDER: Final = {raw: MessageFlags(raw) & SENDER_FLAGS for raw in range(_KNOWN_FLAGS + 1)}
_EVENT_TIME_BIT: Final = int(MessageFlags.EVENT_TIME)
_BOUNDARY_BIT: Final = int(MessageFlags.BOUNDARY)
_MESSAGE_FIELDS: Final = tuple(f.name for f in attrs.fields(Message))


def _message(*values: Any) -> Message:
    m = object.__new__(Message)
    for name, value in zip(_MESSAGE_FIELDS, values, strict=True):
        object.__setattr__(m, name, value)
    return m


def _fast_message(data: bytes, dialect: Dialect) -> Message | None:
    if dialect is Dialect.V3:
        if len(data) < _V3_HEAD.size:
            return None
        _, stream_id, message_id, event_time, key_len = _V3_HEAD.unpack_from(data)
        start = _V3_HEAD.size + key_len
        if start > len(data):
            return None
        key = data[_V3_HEAD.size : start] or None
        payload = data[start:] or None
        return _message(stream_id, message_id, payload, _SENDER[0], event_time, key)
    if len(data) < _DRAFT_HEAD.size:
        return None
    _, stream_id, raw, message_id = _DRAFT_HEAD.unpack_from(data)
    if raw & ~_KNOWN_FLAGS or raw & LAYOUT_FLAGS == LAYOUT_FLAGS:
        return None
    start, event_time = _DRAFT_HEAD.size, None
    if raw & _EVENT_TIME_BIT:
        if len(data) < start + 8:
            return None
        (event_time,) = _DRAFT_EVENT_TIME.unpack_from(data, start)
        start += 8
    if raw & _BOUNDARY_BIT:
        if len(data) != start:
            return None
        payload = None
    else:
        payload = data[start:]
    return _message(stream_id, message_id, payload, _SENDER[raw], event_time, None)


_MESSAGE_TAG: Final = {Dialect.DRAFT: ord("M"), Dialect.V3: 5}


def decode_tagged(data: bytes, dialect: Dialect, offset: int = 0) -> Frame:
    """One frame from ``data`` = its tag and body (no length prefix), exactly.

    ``offset`` is the stream offset of the tag, so errors name stream offsets. The cores
    read the frames :func:`split_frames` cut with it; not re-exported.
    """
    if data and data[0] == _MESSAGE_TAG[dialect]:
        fast = _fast_message(bytes(data), dialect)
        if fast is not None:
            return fast
    if not data:
        raise TruncatedFrameError(dialect.value, "Frame", "tag", offset, "a frame of 0 bytes")
    row = _BY_TAG[dialect].get(data[0])
    if row is None:
        raise UnknownTagError(dialect.value, offset, data[0])
    spec = DIALECTS[dialect]
    return row.decode(p.Cursor(data, offset, spec, row.cls.__name__), spec)


def decode(
    data: bytes | bytearray | memoryview,
    dialect: Dialect | str = Dialect.DRAFT,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> Frame:
    """The one frame ``data`` holds, length prefix included; offsets count from 0.

    Strict: a prefix over ``max_frame_bytes``, fewer or more bytes than the prefix says,
    and every malformed field raise a :class:`~.errors.ProtocolError` subclass.
    """
    d = Dialect(dialect)
    spec = DIALECTS[d]
    data = bytes(data)
    if len(data) < LENGTH_PREFIX_BYTES:
        raise TruncatedStreamError(d.value, 0, len(data), None, LENGTH_PREFIX_BYTES)
    size = int.from_bytes(data[:LENGTH_PREFIX_BYTES], spec.byte_order)
    if size > max_frame_bytes:
        raise FrameTooLargeError(d.value, 0, size, max_frame_bytes)
    present = len(data) - LENGTH_PREFIX_BYTES
    if present < size:
        raise TruncatedStreamError(d.value, 0, len(data), LENGTH_PREFIX_BYTES + size)
    if present > size:
        end = LENGTH_PREFIX_BYTES + size
        reason = f"{present - size} bytes after a frame of {size}"
        raise TrailingBytesError(d.value, "Frame", None, end, reason)
    return decode_tagged(data[LENGTH_PREFIX_BYTES:], d, LENGTH_PREFIX_BYTES)


def split_frames(
    buf: bytearray, byte_order: Literal["little", "big"], limit: int, most: int | None = None
) -> tuple[list[bytes], int, tuple[int, int] | None]:
    """The whole frames at the start of ``buf`` (tag and body each; at most ``most``),
    the bytes they take, and ``(offset in buf, length)`` of a length prefix over
    ``limit``, if one came before them."""
    frames: list[bytes] = []
    at, end, prefix = 0, len(buf), LENGTH_PREFIX_BYTES
    view = memoryview(buf)
    try:
        while end - at >= prefix and (most is None or len(frames) < most):
            size = int.from_bytes(view[at : at + prefix], byte_order)
            if size > limit:
                return frames, at, (at, size)
            if end - at - prefix < size:
                break
            frames.append(bytes(view[at + prefix : at + prefix + size]))
            at += prefix + size
    finally:
        view.release()
    return frames, at, None


# --- helpers ----------------------------------------------------------------------------


def end_of_stream(dialect: Dialect | str, stream_id: int, message_id: int) -> Message | EosMessage:
    """The frame that ends ``stream_id`` in ``dialect``.

    Draft: a boundary MESSAGE flagged EOS at ``message_id`` (seed 000, footnote D0: a
    boundary marks the end when no message is left to carry the flag). v3: an
    EOS_MESSAGE, which carries no message id.
    """
    if Dialect(dialect) is Dialect.V3:
        return EosMessage(stream_id)
    return Message(stream_id, message_id, None, MessageFlags.EOS)


def stream_id_for(name: str | bytes) -> int:
    """The stream id the released Python connector derives from a stream name: the
    first 16 hex digits of SHA-256 of the name (UTF-8 for text), as a u64."""
    raw = name.encode("utf-8") if isinstance(name, str) else bytes(name)
    return int.from_bytes(hashlib.sha256(raw).digest()[:8], "big")
