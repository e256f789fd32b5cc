"""AMBROSIA messages: the types of seed 002 (Message Formats) and their codec.

A framed message is ``ZigZagInt size | type byte | data`` where size counts the type
byte and the data. Message type 0 (RPC) has two layouts, told apart by who sends it:
the binding sends *outgoing* RPCs (destination name in front), the coordinator delivers
*incoming* ones (destination stripped). :class:`Direction` names the two.

This module holds the message classes and the encoder; decoding lives in
:mod:`.decoding`, which imports the classes from here (never the other way round).
Encoding produces a list of buffers (:func:`encode_message_parts`) so large payloads go
to the socket or file without being copied; :func:`encode_message` joins them when one
``bytes`` is wanted.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Any, TypeAlias

import attrs

from .varint import encode_zigzag_int, encode_zigzag_long

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
    "Ping",
    "PingReturn",
    "ReplayFrom",
    "ReturnType",
    "RpcBatch",
    "RpcMessage",
    "RpcType",
    "TakeBecomingPrimaryCheckpoint",
    "TakeCheckpoint",
    "TrimTo",
    "UpgradeService",
    "UpgradeTakeCheckpoint",
    "encode_message",
    "encode_message_parts",
    "frame_parts",
    "new_outgoing_rpc",
    "slot_descriptors",
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


def slot_descriptors(cls: type, fields: tuple[str, ...], user: str) -> tuple[Any, ...]:
    """The member descriptors of a frozen (slotted) attrs class's fields, in ``fields``'
    order, for code that sets them directly (``user``), which must name them all."""
    if tuple(a.name for a in attrs.fields(cls)) != fields:  # pragma: no cover
        raise ImportError(f"{cls.__name__}'s fields changed: update {user}")
    return tuple(cls.__dict__[name] for name in fields)


_OUTGOING_RPC_SLOTS = tuple(
    d.__set__
    for d in slot_descriptors(
        OutgoingRpc,
        ("destination", "method_id", "rpc_type", "args", "sender", "call_seq"),
        "new_outgoing_rpc",
    )
)


def new_outgoing_rpc(
    destination: str, method_id: int, rpc_type: RpcType, args: Payload, sender: str, call_seq: int
) -> OutgoingRpc:
    """``OutgoingRpc(...)`` with its slots set directly: the frozen class's ``__init__``
    is about a quarter of the sending binding's instructions per fork (every call a
    handler makes is one)."""
    msg = object.__new__(OutgoingRpc)
    put_destination, put_method, put_type, put_args, put_sender, put_seq = _OUTGOING_RPC_SLOTS
    put_destination(msg, destination)
    put_method(msg, method_id)
    put_type(msg, rpc_type)
    put_args(msg, args)
    put_sender(msg, sender)
    put_seq(msg, call_seq)
    return msg


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

    :func:`.decoding.decode_message` returns this for type 8; the readers replace it with a
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


# Names as framed on the wire, by name: a binding names the same few instances over and
# over (each reply names its caller twice).
_NAMES: dict[str, bytes] = {}
_NAMES_MAX = 4096


def _name(value: str) -> bytes:
    framed = _NAMES.get(value)
    if framed is None:
        raw = value.encode("utf-8")
        framed = encode_zigzag_int(len(raw)) + raw
        if len(_NAMES) >= _NAMES_MAX:
            _NAMES.clear()
        _NAMES[value] = framed
    return framed


def _call_head(method_id: int, rpc_type: RpcType, sender: str, call_seq: int) -> bytes:
    head = b"\x00" + encode_zigzag_int(method_id) + _TYPE_BYTES[rpc_type]
    if rpc_type == RpcType.ASYNC_AWAIT:
        head += _name(sender) + encode_zigzag_long(call_seq)
    elif sender or call_seq:
        # Only async/await calls carry them on the wire: refuse rather than drop them.
        raise ValueError(f"a {rpc_type.name} call carries no sender or call sequence number")
    return head


# The bytes before an outgoing call's arguments depend, but for an async/await call's
# sequence number, on (destination, method, type, sender) only: a binding sends the same
# few heads over and over, and a method id is a five-byte varint to compute each time.
_HEADS: dict[tuple[str, int, RpcType, str], bytes] = {}
_HEADS_MAX = 4096


def _outgoing_head(msg: OutgoingRpc) -> bytes:
    key = (msg.destination, msg.method_id, msg.rpc_type, msg.sender)
    head = _HEADS.get(key)
    if head is None:
        if len(_HEADS) >= _HEADS_MAX:
            _HEADS.clear()
        head = _name(msg.destination) + _call_head(msg.method_id, msg.rpc_type, msg.sender, 0)
        if msg.rpc_type == RpcType.ASYNC_AWAIT:
            head = head[:-1]  # the call sequence number (here 0, one byte) is added per call
        _HEADS[key] = head
    if msg.rpc_type == RpcType.ASYNC_AWAIT:
        return head + encode_zigzag_long(msg.call_seq)
    if msg.call_seq:
        raise ValueError(f"a {msg.rpc_type.name} call carries no sender or call sequence number")
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
        return [_outgoing_head(msg), msg.args]
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


_JOIN_MAX = 4096  # arguments up to this size are copied behind their head: one buffer


def encode_messages_parts(msgs: Iterable[Message]) -> list[Buffer]:
    """``encode_message_parts`` of each message, in order, in one list.

    The bytes are the same; an outgoing call (what high-rate traffic is, and an awaited
    call) is framed inline with its cached head, and a reply with its head, each joined
    to its arguments or value into one buffer when they are small (a view of large ones
    is left as it is: no copy).
    """
    out: list[Buffer] = []
    append = out.append
    for msg in msgs:
        if type(msg) is OutgoingRpc:
            head = _outgoing_head(msg)
            args = msg.args
        elif type(msg) is OutgoingReturnValue:  # the destination, its head, its value
            *heads, args = _data_parts(msg)
            head = b"".join(heads)
        else:
            out.extend(encode_message_parts(msg))
            continue
        prefix = encode_zigzag_int(1 + len(head) + len(args)) + b"\x00" + head
        if len(args) <= _JOIN_MAX:
            append(prefix + args)
        else:
            append(prefix)
            append(args)
    return out


def encode_message(msg: Message) -> bytes:
    """The bytes of ``msg`` on the wire, joined (a Checkpoint's blob included)."""
    return b"".join(encode_message_parts(msg))
