"""The connector protocol's frames as frozen values, shared by both dialects.

One class per frame meaning; :mod:`.codec` says which dialect carries which frame and how.
A field that only one dialect has says so in its docstring and holds a neutral default
(empty, None or zero flags) when absent; ``encode`` refuses a frame whose value the
dialect cannot carry instead of dropping it (see :mod:`.codec`, *What a dialect cannot
express*).

Constructors check what holds in every dialect (widths of ids, credits and ports, flag
bits), so a frame that exists is well formed; what depends on the dialect is checked by
``encode``. Text fields are ``str`` (UTF-8 on the wire); the cookie, payloads and keys
are opaque ``bytes``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, TypeAlias

import attrs

__all__ = [
    "Ack",
    "EosMessage",
    "Error",
    "Frame",
    "Hello",
    "Message",
    "MessageFlags",
    "Migrate",
    "MigrationAck",
    "Nack",
    "Notify",
    "NotifyAck",
    "Ok",
    "Restart",
]


class MessageFlags(enum.IntFlag):
    """The MESSAGE bit-flags of the draft (seed 000, *Constants*, *Message Bit-flags*).

    A :class:`Message` holds only the bits a sender chooses: EPHEMERAL, EOS and
    UNSTABLE_REFERENCE. BOUNDARY and EVENT_TIME describe the frame's layout, so they
    follow from ``payload is None`` and ``event_time is not None`` and the draft's
    encoder ORs them in, as the seed's ``message/3`` constructors do. v3 has no flags.
    """

    EPHEMERAL = 1
    BOUNDARY = 2
    EOS = 4
    UNSTABLE_REFERENCE = 8
    EVENT_TIME = 16


LAYOUT_FLAGS = MessageFlags.BOUNDARY | MessageFlags.EVENT_TIME
"""The bits implied by a Message's shape, never held in ``Message.flags``."""

SENDER_FLAGS = MessageFlags.EPHEMERAL | MessageFlags.EOS | MessageFlags.UNSTABLE_REFERENCE
"""The bits a sender sets in ``Message.flags``."""

_U16 = 2**16 - 1
_U32 = 2**32 - 1
_U64 = 2**64 - 1
_U128 = 2**128 - 1
_I64_MIN = -(2**63)


def _where(inst: object, attribute: attrs.Attribute[Any]) -> str:
    return f"{type(inst).__name__}.{attribute.name}"


def _is_int(value: object) -> bool:
    # bool is an int subclass, but True is no stream id.
    return isinstance(value, int) and not isinstance(value, bool)


def _uint(top: int, bits: int) -> Any:
    def check(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not _is_int(value) or not 0 <= value <= top:
            raise ValueError(f"{_where(inst, attribute)} {value!r} is not a u{bits}")

    return check


_u16 = _uint(_U16, 16)
_u32 = _uint(_U32, 32)
_u64 = _uint(_U64, 64)


def _is_str(inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{_where(inst, attribute)} must be str, not {type(value).__name__}")


def _to_bytes(value: bytes | bytearray | memoryview) -> bytes:
    return bytes(value)


def _to_opt_bytes(value: bytes | bytearray | memoryview | None) -> bytes | None:
    return None if value is None else bytes(value)


def _to_pairs(pairs: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple((stream_id, point) for stream_id, point in pairs)


def _u64_pairs(
    inst: object, attribute: attrs.Attribute[tuple[tuple[int, int], ...]], value: Any
) -> None:
    for i, (stream_id, point) in enumerate(value):
        for v in (stream_id, point):
            if not _is_int(v) or not 0 <= v <= _U64:
                raise ValueError(f"{_where(inst, attribute)}[{i}] holds {v!r}, not a u64")


# --- handshake (seed 000, *Handshake*) -------------------------------------------------


def _version(inst: object, attribute: attrs.Attribute[int | str], value: int | str) -> None:
    if isinstance(value, str):
        return
    if not _is_int(value) or not 0 <= value <= _U128:
        raise ValueError(
            f"{_where(inst, attribute)} {value!r} is neither a 128-bit version nor a string"
        )


@attrs.frozen
class Hello:
    """HELLO, connector to worker: the first frame of a session.

    ``version`` is an ``int`` in the draft (the seed's 128-bit version GUID, footnote A1)
    and a ``str`` in v3 (``"0.0.1"``); :data:`.codec.VERSIONS` holds each dialect's.
    ``cookie`` is opaque (the seed's ``iodata()``), empty when none is configured.
    """

    version: int | str = attrs.field(validator=_version)
    cookie: bytes = attrs.field(converter=_to_bytes)
    program_name: str = attrs.field(validator=_is_str)
    instance_name: str = attrs.field(validator=_is_str)


@attrs.frozen
class Ok:
    """OK, worker to connector: the handshake succeeded.

    ``points_of_reference`` is draft only: (stream id, point of reference) pairs from
    prior sessions to resume from (seed 000, footnote C1). v3 carries none; its worker
    answers each NOTIFY with a NOTIFY_ACK instead.
    """

    initial_credits: int = attrs.field(validator=_u32)
    points_of_reference: tuple[tuple[int, int], ...] = attrs.field(
        default=(), converter=_to_pairs, validator=_u64_pairs
    )


@attrs.frozen
class Error:
    """ERROR, either way: a short reason for an operator; the connection then closes."""

    reason: str = attrs.field(validator=_is_str)


# --- streaming (seed 000, *Streaming*) -------------------------------------------------


@attrs.frozen
class Notify:
    """NOTIFY, connector to worker: opens (or reopens) a stream under ``stream_id``.

    ``point_of_reference`` is where the connector resumes; 0 when it has none (the
    seed's ``undefined``).
    """

    stream_id: int = attrs.field(validator=_u64)
    stream_name: str = attrs.field(validator=_is_str)
    point_of_reference: int = attrs.field(default=0, validator=_u64)


@attrs.frozen
class NotifyAck:
    """NOTIFY_ACK, worker to connector: whether the stream is now open here, and the
    point of reference the connector must resume from (``NOTHING_SEEN`` for a stream
    never seen; reference, *What the released worker does*)."""

    success: bool = attrs.field(validator=attrs.validators.instance_of(bool))
    stream_id: int = attrs.field(validator=_u64)
    point_of_reference: int = attrs.field(validator=_u64)


def _sender_flags(inst: object, attribute: attrs.Attribute[MessageFlags], value: int) -> None:
    if value & LAYOUT_FLAGS:
        raise ValueError(
            f"{_where(inst, attribute)} holds {MessageFlags(value & LAYOUT_FLAGS)!r}: "
            "BOUNDARY follows from payload=None and EVENT_TIME from event_time"
        )
    if value & ~int(SENDER_FLAGS):  # an int: ~ on a flag keeps only defined bits
        raise ValueError(f"{_where(inst, attribute)} holds reserved bits 0x{value:04x}")


def _event_time(inst: object, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and (not _is_int(value) or not _I64_MIN <= value <= _U64):
        raise ValueError(f"{_where(inst, attribute)} {value!r} is neither a u64 nor an i64")


@attrs.frozen
class Message:
    """MESSAGE, connector to worker: one message of a stream, or a boundary.

    ``payload`` is None for a boundary (the draft's BOUNDARY flag; in v3 an empty
    payload). ``flags`` is draft only: EPHEMERAL, EOS, UNSTABLE_REFERENCE. In the draft
    an end of stream is a MESSAGE with EOS, with or without a payload (seed 000, *Stream
    State Machine*); v3 sends :class:`EosMessage` instead. ``event_time`` is optional in
    the draft (a u64 behind the EVENT_TIME flag) and always present in v3 (an i64).
    ``key`` is v3 only (None: no key).
    """

    stream_id: int = attrs.field(validator=_u64)
    message_id: int = attrs.field(validator=_u64)
    payload: bytes | None = attrs.field(converter=_to_opt_bytes)
    flags: MessageFlags = attrs.field(
        default=MessageFlags(0), converter=MessageFlags, validator=_sender_flags
    )
    event_time: int | None = attrs.field(default=None, validator=_event_time)
    key: bytes | None = attrs.field(default=None, converter=_to_opt_bytes)

    @property
    def boundary(self) -> bool:
        """True for a boundary: a marker with a message id and no payload."""
        return self.payload is None

    @property
    def eos(self) -> bool:
        """True if this message ends its stream (draft: the EOS flag)."""
        return bool(self.flags & MessageFlags.EOS)

    @property
    def wire_flags(self) -> MessageFlags:
        """The flags as the draft writes them: ``flags`` with the layout bits ORed in."""
        flags = self.flags
        if self.payload is None:
            flags |= MessageFlags.BOUNDARY
        if self.event_time is not None:
            flags |= MessageFlags.EVENT_TIME
        return flags


@attrs.frozen
class EosMessage:
    """EOS_MESSAGE, connector to worker (v3 only): ``stream_id`` has ended.

    The draft has no such frame: there the last MESSAGE carries the EOS flag
    (:func:`.codec.end_of_stream` picks the right form).
    """

    stream_id: int = attrs.field(validator=_u64)


@attrs.frozen
class Ack:
    """ACK, worker to connector: ``credits`` more frames may be sent, and these
    (stream id, point of reference) pairs are processed. In the draft the point is a
    message id (seed 000, *Acks and Nacks*); in v3 the last acknowledged point."""

    credits: int = attrs.field(validator=_u32)
    acks: tuple[tuple[int, int], ...] = attrs.field(
        default=(), converter=_to_pairs, validator=_u64_pairs
    )


@attrs.frozen
class Nack:
    """NACK, worker to connector (draft only): grant ``credits`` and reset ``stream_id``
    to ``point_of_reference`` (0: the seed's ``undefined``); the stream needs a NOTIFY
    before its next MESSAGE. v3 has no NACK."""

    credits: int = attrs.field(validator=_u32)
    stream_id: int = attrs.field(validator=_u64)
    point_of_reference: int = attrs.field(default=0, validator=_u64)


@attrs.frozen
class Restart:
    """RESTART, worker to connector: reconnect to ``address`` (``"host:port"``), say
    HELLO again and re-notify every stream (reference; the draft takes it as tag 7)."""

    address: str = attrs.field(validator=_is_str)


# --- migration (seed 001) --------------------------------------------------------------


@attrs.frozen
class Migrate:
    """MIGRATE, worker to connector (draft only, seed 001): move to ``host``:``port``."""

    host: str = attrs.field(validator=_is_str)
    port: int = attrs.field(validator=_u16)


@attrs.frozen
class MigrationAck:
    """MIGRATION_ACK, connector to worker (draft only, seed 001; its state machine calls
    it MIGRATE_OK): the connector has handshaken with the new address."""


Frame: TypeAlias = (
    Hello
    | Ok
    | Error
    | Notify
    | NotifyAck
    | Message
    | EosMessage
    | Ack
    | Nack
    | Restart
    | Migrate
    | MigrationAck
)
"""Any frame of either dialect."""
