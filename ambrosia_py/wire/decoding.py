"""Decoding AMBROSIA messages (seed 002, Message Formats): bytes in, message objects out.

The counterpart of the encoder in :mod:`.messages`, which defines the message classes.
Decoding is zero-copy: arguments, return values, initial-message bytes and checkpoint
blobs are ``memoryview`` slices of the buffer they were read from (but for the small
incoming payloads :func:`decode_messages` copies). Every rejection raises a
:class:`~.errors.ProtocolError` subclass naming what was wrong and at which offset.

The code here is the one pure-Python reference: ``_cdecode.c`` decodes the common runs
of incoming calls and return values in C where it is built (chosen once, at import), and
leaves every other message to it.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import accel
from .errors import (
    BatchCountError,
    InvalidNameError,
    MalformedMessageError,
    TruncatedInputError,
    UnknownMessageTypeError,
)
from .messages import (
    AttachTo,
    BecomingPrimary,
    CheckpointHeader,
    Commit,
    CountReplayableRpcBatch,
    Direction,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    Message,
    MessageType,
    OutgoingReturnValue,
    OutgoingRpc,
    Payload,
    Ping,
    PingReturn,
    ReplayFrom,
    ReturnType,
    RpcBatch,
    RpcMessage,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    TrimTo,
    UpgradeService,
    UpgradeTakeCheckpoint,
    _replayable,
    slot_descriptors,
)
from .varint import decode_zigzag_int, decode_zigzag_long

__all__ = ["calls_decoder", "decode_message", "decode_messages"]


def _read_name(mv: memoryview, pos: int, end: int, field: str) -> tuple[str, int]:
    n, pos2 = decode_zigzag_int(mv, pos, end)
    if n < 0:
        raise MalformedMessageError(f"negative {field} length {n}", offset=pos)
    if pos2 + n > end:
        raise TruncatedInputError(f"{field} of {n} bytes runs past the message end", offset=pos2)
    try:
        return str(mv[pos2 : pos2 + n], "utf-8"), pos2 + n
    except UnicodeDecodeError as exc:
        raise InvalidNameError(f"{field} is not valid UTF-8: {exc.reason}", offset=pos2) from None


def _decode_rpc(mv: memoryview, pos: int, end: int, outgoing: bool, copy: bool) -> Message:
    """An RPC's data at ``mv[pos:end]``; ``copy``: its arguments or value as ``bytes``."""
    destination = ""
    if outgoing:
        destination, pos = _read_name(mv, pos, end, "destination name")
    if pos >= end:
        raise TruncatedInputError("RPC body is empty", offset=pos)
    kind = mv[pos]
    pos += 1
    if kind == 0:
        method_id, pos = decode_zigzag_int(mv, pos, end)
        if pos >= end:
            raise TruncatedInputError("RPC type byte missing", offset=pos)
        raw_type = mv[pos]
        if raw_type > 2:
            raise MalformedMessageError(f"unknown RPC type {raw_type}", offset=pos)
        rpc_type = _RPC_TYPES[raw_type]
        pos += 1
        sender = ""
        call_seq = 0
        if raw_type == 0:
            sender, pos = _read_name(mv, pos, end, "sender name")
            call_seq, pos = decode_zigzag_long(mv, pos, end)
        args: Payload = mv[pos:end].tobytes() if copy else mv[pos:end]
        if outgoing:
            return OutgoingRpc(destination, method_id, rpc_type, args, sender, call_seq)
        return IncomingRpc(method_id, rpc_type, args, sender, call_seq)
    if kind > 3:
        raise MalformedMessageError(f"unknown RPC return type {kind}", offset=pos - 1)
    return_type = _RETURN_TYPES[kind - 1]
    sender, pos = _read_name(mv, pos, end, "sender name")
    call_seq, pos = decode_zigzag_long(mv, pos, end)
    value: Payload = b""
    if return_type != ReturnType.NO_VALUE:
        n, pos = decode_zigzag_int(mv, pos, end)
        if n < 0:
            raise MalformedMessageError(f"negative return value length {n}", offset=pos)
        if pos + n > end:
            raise TruncatedInputError(
                f"return value of {n} bytes runs past the message end", offset=pos
            )
        value = mv[pos : pos + n].tobytes() if copy else mv[pos : pos + n]
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
    count, pos = decode_zigzag_int(mv, pos, end)
    replayable = 0
    if counted:
        replayable, pos = decode_zigzag_int(mv, pos, end)
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
        size, p = decode_zigzag_int(mv, pos, end)
        if size >= 1 and p < end and mv[p] in _BATCH_TYPES:
            raise MalformedMessageError("batch holds a batch", offset=inner_start)
        inner, pos = _decode(mv, pos, end, direction, False)
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

# Messages under this size that :func:`decode_messages` reads in the incoming form own
# their arguments or value (``bytes``): cheaper to make than a view and to collect, and
# they do not keep the record alive (a binding's checkpoint tail holds calls a while).
_COPY_BELOW = 8 * 1024


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
    return _decode(mv, pos, limit, direction, False)


def _decode(
    mv: memoryview, pos: int, limit: int, direction: Direction, copy: bool
) -> tuple[Message, int]:
    """:func:`decode_message` within ``mv[:limit]``; ``copy``: an incoming call's arguments
    or return value's value under :data:`_COPY_BELOW` as ``bytes`` of its own."""
    start = pos
    size, pos = decode_zigzag_int(mv, pos, limit)
    if size < 1:
        raise MalformedMessageError(f"message size {size} (must be at least 1)", offset=start)
    stop = pos + size
    if stop > limit:
        raise TruncatedInputError(
            f"message of {size} bytes runs {stop - limit} bytes past the available data",
            offset=start,
        )
    t = mv[pos]
    pos += 1
    if t == 0:  # an RPC: the common case, ahead of the table
        outgoing = direction is Direction.TO_COORDINATOR
        return _decode_rpc(mv, pos, stop, outgoing, copy and size < _COPY_BELOW), stop
    mtype = _MESSAGE_TYPES.get(t)
    if mtype is None:
        raise UnknownMessageTypeError(f"unknown message type {t}", offset=pos - 1)
    msg: Message
    if mtype in _EMPTY:
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
        a, p2 = decode_zigzag_long(mv, pos, stop)
        b, p2 = decode_zigzag_long(mv, p2, stop)
        if p2 != stop:
            raise MalformedMessageError(f"{stop - p2} trailing bytes in {mtype.name}", offset=p2)
        msg = Commit(a, b) if mtype == MessageType.COMMIT else ReplayFrom(a, b)
    elif mtype in (MessageType.TRIM_TO, MessageType.CHECKPOINT):
        a, p2 = decode_zigzag_long(mv, pos, stop)
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


_MESSAGE_TYPES = {int(t): t for t in MessageType}  # a lookup, not an enum call per message

CallsDecoder = Callable[[memoryview, int, int, list[Message]], int]


def decode_messages(
    buf: Payload, pos: int, end: int, direction: Direction = Direction.TO_BINDING
) -> list[Message]:
    """Decode the messages packed in ``buf[pos:end]`` (a record body).

    Payloads are views of ``buf``, except, in the incoming form, the arguments of calls
    and the values of return values in messages under 8 KiB, which are ``bytes`` of
    their own: cheaper to make than a view and to collect, and they do not keep ``buf``
    alive (a binding's checkpoint tail holds calls for a while). Where the C accelerator
    is built it decodes the runs of incoming calls and return values (the same messages:
    ``tests/test_cdecode.py``); everything else is :func:`_decode_messages_py`'s.
    """
    return _decode_all(buf, pos, end, direction, _decode_calls)


def _decode_messages_py(
    buf: Payload, pos: int, end: int, direction: Direction = Direction.TO_BINDING
) -> list[Message]:
    """:func:`decode_messages` in Python alone, message by message: the reference that
    its C accelerator (``_cdecode.decode_calls``) is held to."""
    return _decode_all(buf, pos, end, direction, None)


def _decode_all(
    buf: Payload, pos: int, end: int, direction: Direction, calls: CallsDecoder | None
) -> list[Message]:
    """The messages at ``buf[pos:end]``, each by :func:`_decode`, but for the runs of
    incoming calls and replies that ``calls`` (the C loop) decodes the same way."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end > len(mv):
        raise TruncatedInputError(
            f"messages end at {end}, past the {len(mv)}-byte buffer", offset=pos
        )
    incoming = direction is Direction.TO_BINDING
    out: list[Message] = []
    if calls is not None and incoming:
        at = calls(mv, pos, end, out)  # the run of calls and replies at pos, decoded in C
        if at >= 0:
            while at < end:
                msg, at = _decode(mv, at, end, direction, True)  # what C leaves
                out.append(msg)
                at = calls(mv, at, end, out)
            return out
        # a buffer the C loop is not written for (not flat bytes): nothing was done
    append = out.append
    while pos < end:
        msg, pos = _decode(mv, pos, end, direction, incoming)
        append(msg)
    return out


_RPC_TYPES = (RpcType.ASYNC_AWAIT, RpcType.FORK, RpcType.IMPULSE)
_INCOMING_RPC_DESCRIPTORS = slot_descriptors(
    IncomingRpc,
    ("method_id", "rpc_type", "args", "sender", "call_seq"),
    "_cdecode.c",
)
_RETURN_TYPES = (ReturnType.VALUE, ReturnType.NO_VALUE, ReturnType.EXCEPTION)
_RETURN_DESCRIPTORS = slot_descriptors(
    IncomingReturnValue,
    ("return_type", "sender", "call_seq", "value"),
    "_cdecode.c",
)


def _load_decode_calls() -> CallsDecoder | None:
    """The C loop (``_cdecode.decode_calls``), given what it builds; None where it is not
    built or ``AMBROSIA_PURE_PYTHON`` is set."""
    if accel.load("ambrosia_py.wire._cdecode") is None:
        return None
    from . import _cdecode

    _cdecode.init(IncomingRpc, _INCOMING_RPC_DESCRIPTORS, _RPC_TYPES)
    _cdecode.init_returns(IncomingReturnValue, _RETURN_DESCRIPTORS, _RETURN_TYPES)
    return _cdecode.decode_calls


_decode_calls = _load_decode_calls()


def calls_decoder() -> CallsDecoder | None:
    """The C loop :func:`decode_messages` runs over incoming calls and return values: given
    ``(view, pos, end, out)`` it appends the calls it reads to ``out`` and returns where it
    stopped (``end`` when the calls are all there is). None where it is not built."""
    return _decode_calls
