"""AMBROSIA messages: the types of seed 002 (Message Formats) and their codec.

A framed message is ``ZigZagInt size | type byte | data`` where size counts the type
byte and the data. Message type 0 (RPC) has two layouts, told apart by who sends it:
the binding sends *outgoing* RPCs (destination name in front), the coordinator delivers
*incoming* ones (destination stripped). :class:`Direction` names the two.

Decoding is zero-copy: arguments, return values, initial-message bytes and checkpoint
blobs are ``memoryview`` slices of the buffer they were read from. Encoding produces a
list of buffers (:func:`encode_message_parts`) so large payloads go to the socket or file
without being copied; :func:`encode_message` joins them when one ``bytes`` is wanted.
"""

from __future__ import annotations

import enum
from typing import TypeAlias

import attrs

from .errors import (
    BatchCountError,
    InvalidNameError,
    MalformedMessageError,
    TruncatedError,
    UnknownMessageTypeError,
)
from .varint import (
    decode_zigzag_int,
    decode_zigzag_long,
    encode_zigzag_int,
    encode_zigzag_long,
)

__all__ = [
    "AttachTo",
    "BecomingPrimary",
    "Checkpoint",
    "CheckpointHeader",
    "Commit",
    "CountReplayableRpcBatch",
    "Direction",
    "IncomingReturnValue",
    "IncomingRpc",
    "InitialMessage",
    "Message",
    "MessageType",
    "OutgoingReturnValue",
    "OutgoingRpc",
    "Payload",
    "RpcMessage",
    "Ping",
    "PingReturn",
    "ReplayFrom",
    "ReturnType",
    "RpcBatch",
    "RpcType",
    "TakeBecomingPrimaryCheckpoint",
    "TakeCheckpoint",
    "TrimTo",
    "UpgradeService",
    "UpgradeTakeCheckpoint",
    "decode_message",
    "decode_messages",
    "encode_message",
    "encode_message_parts",
    "frame_parts",
]

Payload: TypeAlias = bytes | bytearray | memoryview
Buffer: TypeAlias = bytes | bytearray | memoryview


class MessageType(enum.IntEnum):
    """Message type bytes (seed 002 Message Formats; reference ambrosia.md table)."""

    RPC = 0
    ATTACH_TO = 1
    TAKE_CHECKPOINT = 2
    COMMIT = 3
    REPLAY_FROM = 4
    RPC_BATCH = 5
    PING = 6
    PING_RETURN = 7
    CHECKPOINT = 8
    INITIAL_MESSAGE = 9
    UPGRADE_TAKE_CHECKPOINT = 10
    TAKE_BECOMING_PRIMARY_CHECKPOINT = 11
    UPGRADE_SERVICE = 12
    COUNT_REPLAYABLE_RPC_BATCH = 13
    TRIM_TO = 14
    BECOMING_PRIMARY = 15


class RpcType(enum.IntEnum):
    """The RPC type byte of a call (seed 002, Incoming RPC)."""

    ASYNC_AWAIT = 0
    FORK = 1
    IMPULSE = 2


class ReturnType(enum.IntEnum):
    """Byte 0 of an RPC body: 0 is a call, 1-3 are return values (reference ambrosia.md)."""

    CALL = 0
    VALUE = 1
    NO_VALUE = 2
    EXCEPTION = 3


class Direction(enum.Enum):
    """Which way a stream of messages flows; it decides the layout of type 0 (RPC)."""

    TO_BINDING = "to-binding"  # coordinator -> binding: incoming RPCs, inside log records
    TO_COORDINATOR = "to-coordinator"  # binding -> coordinator: outgoing RPCs, bare messages


def _payload_repr(value: Payload) -> str:
    data = bytes(value[:16])
    more = "..." if len(value) > 16 else ""
    return f"<{len(value)} bytes {data.hex()}{more}>"


def _payload_field() -> Payload:
    return attrs.field(default=b"", repr=_payload_repr, hash=False)


# --- the message classes ---------------------------------------------------------------


@attrs.frozen
class IncomingRpc:
    """A call as the binding receives it. ``sender``/``call_seq`` only for async/await."""

    method_id: int
    rpc_type: RpcType
    args: Payload = _payload_field()
    sender: str = ""
    call_seq: int = 0

    TYPE = MessageType.RPC


@attrs.frozen
class IncomingReturnValue:
    """The result of an async/await call, delivered to its caller.

    ``sender`` is the instance that ran the call; ``call_seq`` the caller's sequence number
    for it; ``value`` the serialized value or exception (empty for ``NO_VALUE``).
    """

    return_type: ReturnType
    sender: str
    call_seq: int
    value: Payload = _payload_field()

    TYPE = MessageType.RPC


@attrs.frozen
class OutgoingRpc:
    """A call as the binding sends it; ``destination`` "" is a self-call."""

    destination: str
    method_id: int
    rpc_type: RpcType
    args: Payload = _payload_field()
    sender: str = ""
    call_seq: int = 0

    TYPE = MessageType.RPC


@attrs.frozen
class OutgoingReturnValue:
    """A return value as the callee's binding sends it back towards ``destination``."""

    destination: str
    return_type: ReturnType
    sender: str
    call_seq: int
    value: Payload = _payload_field()

    TYPE = MessageType.RPC


@attrs.frozen
class AttachTo:
    """Binding asks its coordinator to connect to ``destination`` (sent once per name)."""

    destination: str
    TYPE = MessageType.ATTACH_TO


@attrs.frozen
class TakeCheckpoint:
    """Coordinator asks for a checkpoint; from a binding, asks to roll the log."""

    TYPE = MessageType.TAKE_CHECKPOINT


@attrs.frozen
class Commit:
    """Coordinator to coordinator: input up to these sequence numbers is durable."""

    seq: int
    replayable_seq: int
    TYPE = MessageType.COMMIT


@attrs.frozen
class ReplayFrom:
    """Coordinator to coordinator: resend your output from these sequence numbers."""

    seq: int
    replayable_seq: int
    TYPE = MessageType.REPLAY_FROM


@attrs.frozen
class Ping:
    """Coordinator-internal liveness probe; its data is opaque."""

    data: Payload = _payload_field()
    TYPE = MessageType.PING


@attrs.frozen
class PingReturn:
    """Answer to :class:`Ping`; its data is opaque."""

    data: Payload = _payload_field()
    TYPE = MessageType.PING_RETURN


@attrs.frozen
class CheckpointHeader:
    """A Checkpoint message on its own: the blob of ``length`` bytes follows the frame.

    :func:`decode_message` returns this for type 8; the readers replace it with a
    :class:`Checkpoint` once the blob has arrived.
    """

    length: int
    TYPE = MessageType.CHECKPOINT


@attrs.frozen
class Checkpoint:
    """A checkpoint and its blob; on the wire the blob follows the framed message."""

    blob: Payload = _payload_field()
    TYPE = MessageType.CHECKPOINT


@attrs.frozen
class InitialMessage:
    """Opaque bytes the coordinator logs as record 0 and echoes back on first start."""

    data: Payload = _payload_field()
    TYPE = MessageType.INITIAL_MESSAGE


@attrs.frozen
class UpgradeTakeCheckpoint:
    """Recovery done with the old code: upgrade, then send a checkpoint."""

    TYPE = MessageType.UPGRADE_TAKE_CHECKPOINT


@attrs.frozen
class TakeBecomingPrimaryCheckpoint:
    """Recovery (or first start) done: send a checkpoint, then process normally."""

    TYPE = MessageType.TAKE_BECOMING_PRIMARY_CHECKPOINT


@attrs.frozen
class UpgradeService:
    """What-if test: upgrade now, then the logged records follow."""

    TYPE = MessageType.UPGRADE_SERVICE


@attrs.frozen
class BecomingPrimary:
    """An active/active secondary becomes primary."""

    TYPE = MessageType.BECOMING_PRIMARY


@attrs.frozen
class TrimTo:
    """Coordinator to coordinator: output was trimmed up to ``seq``."""

    seq: int
    TYPE = MessageType.TRIM_TO


RpcMessage: TypeAlias = IncomingRpc | IncomingReturnValue | OutgoingRpc | OutgoingReturnValue


@attrs.frozen
class RpcBatch:
    """Several RPC messages framed as one (seed 002, type 5)."""

    messages: tuple[RpcMessage, ...] = attrs.field()
    TYPE = MessageType.RPC_BATCH


@attrs.frozen
class CountReplayableRpcBatch:
    """An RPC batch that also states how many of its messages are not impulses."""

    messages: tuple[RpcMessage, ...] = attrs.field()
    replayable_count: int = 0
    TYPE = MessageType.COUNT_REPLAYABLE_RPC_BATCH


Message: TypeAlias = (
    IncomingRpc
    | IncomingReturnValue
    | OutgoingRpc
    | OutgoingReturnValue
    | AttachTo
    | TakeCheckpoint
    | Commit
    | ReplayFrom
    | RpcBatch
    | Ping
    | PingReturn
    | CheckpointHeader
    | Checkpoint
    | InitialMessage
    | UpgradeTakeCheckpoint
    | TakeBecomingPrimaryCheckpoint
    | UpgradeService
    | CountReplayableRpcBatch
    | TrimTo
    | BecomingPrimary
)


# --- encoding ----------------------------------------------------------------------------

_TYPE_BYTES = [bytes([t]) for t in range(256)]


def _name(value: str) -> bytes:
    raw = value.encode("utf-8")
    return encode_zigzag_int(len(raw)) + raw


def _call_head(method_id: int, rpc_type: RpcType, sender: str, call_seq: int) -> bytes:
    head = b"\x00" + encode_zigzag_int(method_id) + _TYPE_BYTES[rpc_type]
    if rpc_type == RpcType.ASYNC_AWAIT:
        head += _name(sender) + encode_zigzag_long(call_seq)
    elif sender or call_seq:
        # Only async/await calls carry them on the wire: refuse rather than drop them.
        raise ValueError(f"a {rpc_type.name} call carries no sender or call sequence number")
    return head


def _return_parts(
    return_type: ReturnType, sender: str, call_seq: int, value: Payload
) -> list[Buffer]:
    head = _TYPE_BYTES[return_type] + _name(sender) + encode_zigzag_long(call_seq)
    if return_type == ReturnType.NO_VALUE:
        if len(value):
            raise ValueError("a NO_VALUE return carries no value")
        return [head]
    if return_type not in (ReturnType.VALUE, ReturnType.EXCEPTION):
        raise ValueError(f"not a return type: {return_type!r}")
    return [head + encode_zigzag_int(len(value)), value]


def _replayable(messages: tuple[RpcMessage, ...]) -> int:
    """Messages that replay regenerates: everything but impulse calls."""
    return sum(
        1
        for m in messages
        if not (isinstance(m, IncomingRpc | OutgoingRpc) and m.rpc_type == RpcType.IMPULSE)
    )


def _data_parts(msg: Message) -> list[Buffer]:
    """The data of ``msg`` (everything after the type byte, before any checkpoint blob)."""
    if isinstance(msg, IncomingRpc):
        return [_call_head(msg.method_id, msg.rpc_type, msg.sender, msg.call_seq), msg.args]
    if isinstance(msg, OutgoingRpc):
        head = _name(msg.destination) + _call_head(
            msg.method_id, msg.rpc_type, msg.sender, msg.call_seq
        )
        return [head, msg.args]
    if isinstance(msg, IncomingReturnValue):
        return _return_parts(msg.return_type, msg.sender, msg.call_seq, msg.value)
    if isinstance(msg, OutgoingReturnValue):
        ret = _return_parts(msg.return_type, msg.sender, msg.call_seq, msg.value)
        return [_name(msg.destination), *ret]
    if isinstance(msg, AttachTo):
        return [msg.destination.encode("utf-8")]
    if isinstance(msg, Commit | ReplayFrom):
        return [encode_zigzag_long(msg.seq) + encode_zigzag_long(msg.replayable_seq)]
    if isinstance(msg, TrimTo):
        return [encode_zigzag_long(msg.seq)]
    if isinstance(msg, Ping | PingReturn | InitialMessage):
        return [msg.data]
    if isinstance(msg, Checkpoint):
        return [encode_zigzag_long(len(msg.blob))]
    if isinstance(msg, CheckpointHeader):
        return [encode_zigzag_long(msg.length)]
    if isinstance(msg, RpcBatch):
        parts: list[Buffer] = [encode_zigzag_int(len(msg.messages))]
        for inner in msg.messages:
            parts.extend(frame_parts(inner))
        return parts
    if isinstance(msg, CountReplayableRpcBatch):
        counted: list[Buffer] = [
            encode_zigzag_int(len(msg.messages)) + encode_zigzag_int(msg.replayable_count)
        ]
        if msg.replayable_count != _replayable(msg.messages):
            raise ValueError(
                f"replayable count {msg.replayable_count}, but the batch holds "
                f"{_replayable(msg.messages)} non-impulse messages"
            )
        for inner in msg.messages:
            counted.extend(frame_parts(inner))
        return counted
    # The remaining types carry no data.
    return []


def frame_parts(msg: Message) -> list[Buffer]:
    """The framed message (size, type, data) as buffers; a Checkpoint's blob is not included."""
    parts = _data_parts(msg)
    size = 1 + sum(len(p) for p in parts)
    parts.insert(0, encode_zigzag_int(size) + _TYPE_BYTES[msg.TYPE])
    return parts


def encode_message_parts(msg: Message) -> list[Buffer]:
    """The bytes of ``msg`` on the wire, as buffers; a Checkpoint's blob comes last."""
    parts = frame_parts(msg)
    if isinstance(msg, Checkpoint):
        parts.append(msg.blob)
    return parts


def encode_message(msg: Message) -> bytes:
    """The bytes of ``msg`` on the wire, joined (a Checkpoint's blob included)."""
    return b"".join(encode_message_parts(msg))


# --- decoding ----------------------------------------------------------------------------


def _read_name(mv: memoryview, pos: int, end: int, field: str) -> tuple[str, int]:
    n, pos2 = decode_zigzag_int(mv, pos)
    if n < 0:
        raise MalformedMessageError(f"negative {field} length {n}", offset=pos)
    if pos2 + n > end:
        raise TruncatedError(f"{field} of {n} bytes runs past the message end", offset=pos2)
    try:
        return str(mv[pos2 : pos2 + n], "utf-8"), pos2 + n
    except UnicodeDecodeError as exc:
        raise InvalidNameError(f"{field} is not valid UTF-8: {exc.reason}", offset=pos2) from None


def _varint(mv: memoryview, pos: int, end: int, long: bool) -> tuple[int, int]:
    # Decode within [pos, end): a varint must not run past the end of its message.
    view = mv[:end]
    return decode_zigzag_long(view, pos) if long else decode_zigzag_int(view, pos)


def _decode_rpc(mv: memoryview, pos: int, end: int, outgoing: bool) -> Message:
    destination = ""
    if outgoing:
        destination, pos = _read_name(mv, pos, end, "destination name")
    if pos >= end:
        raise TruncatedError("RPC body is empty", offset=pos)
    kind = mv[pos]
    pos += 1
    if kind == 0:
        method_id, pos = _varint(mv, pos, end, False)
        if pos >= end:
            raise TruncatedError("RPC type byte missing", offset=pos)
        raw_type = mv[pos]
        if raw_type > 2:
            raise MalformedMessageError(f"unknown RPC type {raw_type}", offset=pos)
        rpc_type = RpcType(raw_type)
        pos += 1
        sender = ""
        call_seq = 0
        if raw_type == 0:
            sender, pos = _read_name(mv, pos, end, "sender name")
            call_seq, pos = _varint(mv, pos, end, True)
        args = mv[pos:end]
        if outgoing:
            return OutgoingRpc(destination, method_id, rpc_type, args, sender, call_seq)
        return IncomingRpc(method_id, rpc_type, args, sender, call_seq)
    if kind > 3:
        raise MalformedMessageError(f"unknown RPC return type {kind}", offset=pos - 1)
    return_type = ReturnType(kind)
    sender, pos = _read_name(mv, pos, end, "sender name")
    call_seq, pos = _varint(mv, pos, end, True)
    value: Payload = b""
    if return_type != ReturnType.NO_VALUE:
        n, pos = _varint(mv, pos, end, False)
        if n < 0:
            raise MalformedMessageError(f"negative return value length {n}", offset=pos)
        if pos + n > end:
            raise TruncatedError(f"return value of {n} bytes runs past the message end", offset=pos)
        value = mv[pos : pos + n]
        pos += n
    if pos != end:
        raise MalformedMessageError(f"{end - pos} trailing bytes after return value", offset=pos)
    if outgoing:
        return OutgoingReturnValue(destination, return_type, sender, call_seq, value)
    return IncomingReturnValue(return_type, sender, call_seq, value)


def _decode_batch(
    mv: memoryview, pos: int, end: int, direction: Direction, counted: bool
) -> Message:
    start = pos
    count, pos = _varint(mv, pos, end, False)
    replayable = 0
    if counted:
        replayable, pos = _varint(mv, pos, end, False)
    if count < 0:
        raise BatchCountError(f"negative batch count {count}", offset=start)
    items: list[RpcMessage] = []
    while pos < end:
        if len(items) == count:
            raise BatchCountError(
                f"batch states {count} messages but holds more ({end - pos} bytes left)",
                offset=pos,
            )
        inner_start = pos
        # Refuse a nested batch before decoding it: decoding recurses, and a record can
        # hold enough nesting levels to exhaust the stack (RecursionError).
        size, p = _varint(mv, pos, end, False)
        if size >= 1 and p < end and mv[p] in _BATCH_TYPES:
            raise MalformedMessageError("batch holds a batch", offset=inner_start)
        inner, pos = decode_message(mv, pos, direction, end=end)
        if not isinstance(
            inner, IncomingRpc | IncomingReturnValue | OutgoingRpc | OutgoingReturnValue
        ):
            raise MalformedMessageError(f"batch holds a {type(inner).__name__}", offset=inner_start)
        items.append(inner)
    if len(items) != count:
        raise BatchCountError(f"batch states {count} messages but holds {len(items)}", offset=start)
    if counted:
        actual = _replayable(tuple(items))
        if replayable != actual:
            raise BatchCountError(
                f"batch states {replayable} replayable messages but holds {actual}",
                offset=start,
            )
        return CountReplayableRpcBatch(tuple(items), replayable)
    return RpcBatch(tuple(items))


_BATCH_TYPES = (MessageType.RPC_BATCH, MessageType.COUNT_REPLAYABLE_RPC_BATCH)

_EMPTY: dict[MessageType, Message] = {
    MessageType.TAKE_CHECKPOINT: TakeCheckpoint(),
    MessageType.UPGRADE_TAKE_CHECKPOINT: UpgradeTakeCheckpoint(),
    MessageType.TAKE_BECOMING_PRIMARY_CHECKPOINT: TakeBecomingPrimaryCheckpoint(),
    MessageType.UPGRADE_SERVICE: UpgradeService(),
    MessageType.BECOMING_PRIMARY: BecomingPrimary(),
}


def decode_message(
    buf: Payload,
    pos: int = 0,
    direction: Direction = Direction.TO_BINDING,
    *,
    end: int | None = None,
) -> tuple[Message, int]:
    """Decode one framed message at ``pos``; return it and the position after it.

    ``end`` bounds the message (a record's or batch's end; default the buffer's end).
    A type 8 message decodes to a :class:`CheckpointHeader`; its blob is not consumed.
    """
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    # An ``end`` past the buffer must not let an IndexError out: the data is truncated.
    limit = len(mv) if end is None else min(end, len(mv))
    start = pos
    size, pos = _varint(mv, pos, limit, False)
    if size < 1:
        raise MalformedMessageError(f"message size {size} (must be at least 1)", offset=start)
    stop = pos + size
    if stop > limit:
        raise TruncatedError(
            f"message of {size} bytes runs {stop - limit} bytes past the available data",
            offset=start,
        )
    t = mv[pos]
    pos += 1
    try:
        mtype = MessageType(t)
    except ValueError:
        raise UnknownMessageTypeError(f"unknown message type {t}", offset=pos - 1) from None
    msg: Message
    if mtype == MessageType.RPC:
        msg = _decode_rpc(mv, pos, stop, direction is Direction.TO_COORDINATOR)
    elif mtype in _EMPTY:
        if pos != stop:
            raise MalformedMessageError(
                f"{mtype.name} carries {stop - pos} unexpected bytes", offset=pos
            )
        msg = _EMPTY[mtype]
    elif mtype == MessageType.ATTACH_TO:
        try:
            msg = AttachTo(str(mv[pos:stop], "utf-8"))
        except UnicodeDecodeError as exc:
            raise InvalidNameError(
                f"AttachTo name is not valid UTF-8: {exc.reason}", offset=pos
            ) from None
    elif mtype in (MessageType.COMMIT, MessageType.REPLAY_FROM):
        a, p2 = _varint(mv, pos, stop, True)
        b, p2 = _varint(mv, p2, stop, True)
        if p2 != stop:
            raise MalformedMessageError(f"{stop - p2} trailing bytes in {mtype.name}", offset=p2)
        msg = Commit(a, b) if mtype == MessageType.COMMIT else ReplayFrom(a, b)
    elif mtype in (MessageType.TRIM_TO, MessageType.CHECKPOINT):
        a, p2 = _varint(mv, pos, stop, True)
        if p2 != stop:
            raise MalformedMessageError(f"{stop - p2} trailing bytes in {mtype.name}", offset=p2)
        if mtype == MessageType.CHECKPOINT:
            if a < 0:
                raise MalformedMessageError(f"negative checkpoint length {a}", offset=pos)
            msg = CheckpointHeader(a)
        else:
            msg = TrimTo(a)
    elif mtype == MessageType.INITIAL_MESSAGE:
        msg = InitialMessage(mv[pos:stop])
    elif mtype == MessageType.PING:
        msg = Ping(mv[pos:stop])
    elif mtype == MessageType.PING_RETURN:
        msg = PingReturn(mv[pos:stop])
    else:  # RPC_BATCH, COUNT_REPLAYABLE_RPC_BATCH
        counted = mtype == MessageType.COUNT_REPLAYABLE_RPC_BATCH
        msg = _decode_batch(mv, pos, stop, direction, counted)
    return msg, stop


def decode_messages(
    buf: Payload, pos: int, end: int, direction: Direction = Direction.TO_BINDING
) -> list[Message]:
    """Decode the messages packed in ``buf[pos:end]`` (a record body)."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end > len(mv):
        raise TruncatedError(f"messages end at {end}, past the {len(mv)}-byte buffer", offset=pos)
    out: list[Message] = []
    append = out.append
    incoming = direction is Direction.TO_BINDING
    while pos < end:
        # Fast path: a size of one or two varint bytes and an incoming fork or impulse call
        # with a one-byte method id, which is what high-rate traffic looks like.
        if incoming:
            b0 = mv[pos]
            if b0 < 0x80:
                raw_size, hdr = b0, 1
            elif pos + 1 < end and mv[pos + 1] < 0x80:
                raw_size, hdr = (b0 & 0x7F) | (mv[pos + 1] << 7), 2
            else:
                raw_size, hdr = 1, 0  # odd: falls through to the general path
            if not raw_size & 1 and raw_size >= 8:
                stop = pos + hdr + (raw_size >> 1)
                p = pos + hdr
                if stop <= end and mv[p] == 0 and mv[p + 1] == 0:
                    m = mv[p + 2]
                    r = mv[p + 3]
                    if m < 0x80 and (r == 1 or r == 2):
                        append(IncomingRpc((m >> 1) ^ -(m & 1), _RPC_TYPES[r], mv[p + 4 : stop]))
                        pos = stop
                        continue
        msg, pos = decode_message(mv, pos, direction, end=end)
        append(msg)
    return out


_RPC_TYPES = (RpcType.ASYNC_AWAIT, RpcType.FORK, RpcType.IMPULSE)
