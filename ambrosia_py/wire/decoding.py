"""Decoding AMBROSIA messages (seed 002, Message Formats): bytes in, message objects out.

The counterpart of the encoder in :mod:`.messages`, which defines the message classes.
Decoding is zero-copy: arguments, return values, initial-message bytes and checkpoint
blobs are ``memoryview`` slices of the buffer they were read from. Every rejection raises
a :class:`~.errors.ProtocolError` subclass naming what was wrong and at which offset.
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
    n, pos2 = decode_zigzag_int(mv, pos)
    if n < 0:
        raise MalformedMessageError(f"negative {field} length {n}", offset=pos)
    if pos2 + n > end:
        raise TruncatedInputError(f"{field} of {n} bytes runs past the message end", offset=pos2)
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
        raise TruncatedInputError("RPC body is empty", offset=pos)
    kind = mv[pos]
    pos += 1
    if kind == 0:
        method_id, pos = _varint(mv, pos, end, False)
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
            raise TruncatedInputError(
                f"return value of {n} bytes runs past the message end", offset=pos
            )
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
        raise TruncatedInputError(
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
    """Decode the messages packed in ``buf[pos:end]`` (a record body).

    Payloads are views of ``buf``, except the arguments of incoming calls and the values
    of return values in messages under 8 KiB (the common case, decoded by the fast path),
    which are ``bytes`` of their own: cheaper to make than a view and to collect, and they
    do not keep ``buf`` alive (a binding's checkpoint tail holds calls for a while).
    """
    decode_calls = _decode_calls
    if decode_calls is None or direction is not Direction.TO_BINDING:
        return _decode_messages_py(buf, pos, end, direction)
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end > len(mv):
        raise TruncatedInputError(
            f"messages end at {end}, past the {len(mv)}-byte buffer", offset=pos
        )
    out: list[Message] = []
    # The C twin of the fast path below decodes each run of incoming calls and return
    # values; every other message (or anything doubtful) is decoded here, as before.
    at = decode_calls(mv, pos, end, out)
    if at < 0:  # a buffer the C loop is not written for (not flat bytes): nothing done
        return _decode_messages_py(mv, pos, end, direction)
    while at < end:
        msg, at = decode_message(mv, at, direction, end=end)
        out.append(msg)
        at = decode_calls(mv, at, end, out)
    return out


def _decode_messages_py(
    buf: Payload, pos: int, end: int, direction: Direction = Direction.TO_BINDING
) -> list[Message]:
    """:func:`decode_messages` in Python alone: the reference for its C twin."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    if end > len(mv):
        raise TruncatedInputError(
            f"messages end at {end}, past the {len(mv)}-byte buffer", offset=pos
        )
    out: list[Message] = []
    append = out.append
    incoming = direction is Direction.TO_BINDING
    new = object.__new__
    set_method, set_type, set_args, set_sender, set_seq = _INCOMING_RPC_SLOTS
    while pos < end:
        # Fast path: a size of one or two varint bytes and an incoming call (a fork, an
        # impulse, or an async/await call from a short ASCII name) or a return value, which
        # is what high-rate traffic and awaited calls and their replies look like.
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
                if stop <= end and mv[p] == 0 and 1 <= mv[p + 1] <= 3:
                    reply = _fast_return(mv, p + 2, stop, mv[p + 1])
                    if reply is not None:
                        append(reply)
                        pos = stop
                        continue
                elif stop <= end and mv[p] == 0 and mv[p + 1] == 0:
                    # The method id: one byte, or up to five (ids hashed from method names
                    # are 31-bit); anything longer or odd takes the general path.
                    q = p + 2
                    m = mv[q]
                    q += 1
                    shift = 7
                    if m >= 0x80:
                        m &= 0x7F
                        while q < stop and shift < 35:
                            b = mv[q]
                            q += 1
                            m |= (b & 0x7F) << shift
                            shift += 7
                            if b < 0x80:
                                break
                        else:
                            shift = 99
                    if shift <= 35 and m <= 0xFFFFFFFF and q < stop and mv[q] <= 2:
                        r = mv[q]
                        sender, call_seq, at = "", 0, q + 1
                        if r == 0:
                            # An async/await call: a sender of at most 63 ASCII bytes,
                            # a sequence number of at most nine varint bytes; anything
                            # else takes the general path.
                            sender, call_seq, at = _fast_caller(mv, q + 1, stop)
                        if at:
                            # IncomingRpc(method, type, args, ...), its slots set directly:
                            # the frozen class's __init__ costs a third more per message.
                            # The arguments (under 8 KiB here) are copied: a view costs
                            # more to make and to collect, and keeps the record alive.
                            call = new(IncomingRpc)
                            set_method(call, (m >> 1) ^ -(m & 1))
                            set_type(call, _RPC_TYPES[r])
                            set_args(call, mv[at:stop].tobytes())
                            set_sender(call, sender)
                            set_seq(call, call_seq)
                            append(call)
                            pos = stop
                            continue
        msg, pos = decode_message(mv, pos, direction, end=end)
        append(msg)
    return out


def _fast_caller(mv: memoryview, p: int, stop: int) -> tuple[str, int, int]:
    """An async/await call's sender and sequence number at ``mv[p:stop]``, and where its
    arguments start; ``("", 0, 0)`` for anything the fast path leaves to the general one."""
    if p >= stop or mv[p] >= 0x80 or mv[p] & 1:
        return "", 0, 0
    n = mv[p] >> 1
    name = mv[p + 1 : p + 1 + n]
    p += 1 + n
    if p > stop or not name.tobytes().isascii():
        return "", 0, 0
    v = shift = 0
    while p < stop and shift < 63:
        c = mv[p]
        p += 1
        v |= (c & 0x7F) << shift
        shift += 7
        if c < 0x80:
            return str(name, "ascii"), (v >> 1) ^ -(v & 1), p
    return "", 0, 0


def _fast_return(mv: memoryview, p: int, stop: int, kind: int) -> IncomingReturnValue | None:
    """A return value of ``kind`` (1-3) from ``mv[p:stop]``, after its kind byte: its caller
    (as :func:`_fast_caller`), then for a value or an exception a length of one or two
    varint bytes and exactly that many bytes; None for anything else."""
    sender, call_seq, p = _fast_caller(mv, p, stop)
    if not p:
        return None
    n = 0
    if kind != 2:
        if p >= stop:
            return None
        v = mv[p]
        p += 1
        if v >= 0x80:
            if p >= stop or mv[p] >= 0x80:
                return None
            v = (v & 0x7F) | (mv[p] << 7)
            p += 1
        if v & 1:
            return None
        n = v >> 1
    if p + n != stop:
        return None
    reply = object.__new__(IncomingReturnValue)
    set_type, set_sender, set_seq, set_value = _RETURN_SLOTS
    set_type(reply, _RETURN_TYPES[kind - 1])
    set_sender(reply, sender)
    set_seq(reply, call_seq)
    set_value(reply, mv[p:stop].tobytes())  # a copy of its own, as for calls; b"" for none
    return reply


_RPC_TYPES = (RpcType.ASYNC_AWAIT, RpcType.FORK, RpcType.IMPULSE)
_INCOMING_RPC_DESCRIPTORS = slot_descriptors(
    IncomingRpc,
    ("method_id", "rpc_type", "args", "sender", "call_seq"),
    "decode_messages' fast path and _cdecode.c",
)
_INCOMING_RPC_SLOTS = tuple(d.__set__ for d in _INCOMING_RPC_DESCRIPTORS)
_RETURN_TYPES = (ReturnType.VALUE, ReturnType.NO_VALUE, ReturnType.EXCEPTION)
_RETURN_DESCRIPTORS = slot_descriptors(
    IncomingReturnValue,
    ("return_type", "sender", "call_seq", "value"),
    "decode_messages' fast path and _cdecode.c",
)
_RETURN_SLOTS = tuple(d.__set__ for d in _RETURN_DESCRIPTORS)


def _load_decode_calls() -> Callable[[memoryview, int, int, list[Message]], int] | None:
    """The C fast path (``_cdecode.decode_calls``), given what it builds; None where it is
    not built or ``AMBROSIA_PURE_PYTHON`` is set."""
    if accel.load("ambrosia_py.wire._cdecode") is None:
        return None
    from . import _cdecode

    _cdecode.init(IncomingRpc, _INCOMING_RPC_DESCRIPTORS, _RPC_TYPES)
    _cdecode.init_returns(IncomingReturnValue, _RETURN_DESCRIPTORS, _RETURN_TYPES)
    return _cdecode.decode_calls


_decode_calls = _load_decode_calls()


def calls_decoder() -> Callable[[memoryview, int, int, list[Message]], int] | None:
    """The C loop :func:`decode_messages` runs over incoming calls and return values: given
    ``(view, pos, end, out)`` it appends the calls it reads to ``out`` and returns where it
    stopped (``end`` when the calls are all there is). None where it is not built."""
    return _decode_calls
