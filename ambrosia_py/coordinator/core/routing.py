"""Routing at the byte level: the coordinator's per-message paths, sans-IO.

What :class:`ic_core.Intake` does to each call or return value without decoding it:
cut the destination out of an outgoing frame (:func:`to_incoming`), tell an impulse
from replayable input (:func:`is_replayable`), and split a link frame of fork calls into
its messages (:func:`split_link_forks`; :func:`large_link_forks` for frames of large
calls, as views). Each accepts exactly what decoding accepts, or leaves the frame to the
general path that decodes it and raises the documented errors.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import accel, wire
from ...wire.decoding import calls_decoder

__all__ = [
    "count_replayable",
    "is_replayable",
    "large_link_forks",
    "one_link_message",
    "split_link_forks",
    "to_incoming",
]

_FORK = int(wire.RpcType.FORK)
_VIEW_FROM = 8 * 1024  # link calls this large are queued as views of their frame
_decode_calls = calls_decoder()


def to_incoming(raw: bytes | memoryview) -> tuple[str, bytes, memoryview]:
    """Split an outgoing RPC frame into its destination and the incoming frame's parts.

    ``size | 00 | ZigZagInt dest length | dest | body`` becomes ``size' | 00`` and
    ``body`` (a view of ``raw``): the destination is cut out without decoding or copying
    the body (the hot path for self-calls).
    """
    mv = memoryview(raw)
    size, pos = wire.decode_zigzag_int(mv, 0)
    name_len, name_at = wire.decode_zigzag_int(mv[: pos + size], pos + 1)
    if name_len < 0 or name_at + name_len > pos + size:
        raise wire.MalformedMessageError(f"destination length {name_len}", offset=pos + 1)
    try:
        destination = str(mv[name_at : name_at + name_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise wire.InvalidNameError(
            f"destination name is not valid UTF-8: {exc.reason}", offset=name_at
        ) from None
    body = mv[name_at + name_len : pos + size]
    if not len(body):
        raise wire.TruncatedInputError("RPC body is empty", offset=name_at + name_len)
    return destination, wire.encode_zigzag_int(1 + len(body)) + b"\x00", body


def is_replayable(incoming_body: wire.Payload) -> bool:
    """Whether an incoming RPC body (after the type byte) is anything but an impulse call."""
    if incoming_body[0] != 0:
        return True  # a return value
    _, pos = wire.decode_zigzag_int(incoming_body, 1)
    return pos >= len(incoming_body) or incoming_body[pos] != wire.RpcType.IMPULSE


def split_link_forks(data: bytes) -> list[bytes] | None:
    """A link frame's messages, if all are fork calls in the incoming form; else None.

    The fast path of :meth:`Intake.link_input`: it accepts exactly the frames that
    decoding would accept as incoming fork calls (a size of one or two varint bytes, the
    RPC type, a call, a method id of at most five varint bytes within 32 bits, the fork
    type byte, the arguments). Anything else, valid or not, returns None and takes the
    general path, which decodes each message and raises the documented errors.
    """
    out: list[bytes] = []
    append = out.append
    pos = 0
    end = len(data)
    while pos < end:
        b0 = data[pos]
        if b0 < 0x80:
            n = b0
            at = pos + 1
        elif pos + 1 < end and data[pos + 1] < 0x80:
            n = (b0 & 0x7F) | (data[pos + 1] << 7)
            at = pos + 2
        else:
            return None
        stop = at + (n >> 1)
        if n & 1 or n < 6 or stop > end or data[at] != 0 or data[at + 1] != 0:
            return None
        q = at + 2  # the method id
        if data[q] >= 0x80:
            if q + 1 >= stop:
                return None
            last = min(q + 4, stop - 1)
            k = q + 1
            while k < last and data[k] >= 0x80:
                k += 1
            if data[k] >= 0x80 or (k == q + 4 and data[k] > 0x0F):
                return None
            q = k
        q += 1
        if q >= stop or data[q] != _FORK:
            return None
        append(data[pos:stop])
        pos = stop
    return out


def one_link_message(data: bytes) -> wire.Message | None:
    """The message ``data`` is, decoded in the incoming form, if it is exactly one; None
    if it is several, or is not read whole (malformed: the general path says how).

    Incoming calls and return values go through the C decoder where it is built (the
    same messages as :func:`wire.decode_message`, tested so in ``test_cdecode``)."""
    if _decode_calls is not None:
        out: list[wire.Message] = []
        stop = _decode_calls(memoryview(data), 0, len(data), out)
        if out:
            return out[0] if stop == len(data) and len(out) == 1 else None
    try:
        msg, stop = wire.decode_message(data, 0, wire.Direction.TO_BINDING)
    except wire.ProtocolError:
        return None
    return msg if stop == len(data) else None


def large_link_forks(payload: memoryview) -> list[wire.Payload] | None:
    """A link frame's messages if the first is large, the frame immutable and all are
    fork calls as decoding reads them (``MessageReader``, ``decode_message``); else None,
    and the paths of ``bytes`` decide (and name what is wrong). :func:`split_link_forks`
    never takes large calls; without this the frame was copied whole before decoding.
    Calls of :data:`_VIEW_FROM` or more are views of the frame, smaller ones copies."""
    if not isinstance(payload.obj, bytes) or payload.format != "B" or not payload.c_contiguous:
        return None
    end = payload.nbytes
    try:
        if wire.decode_zigzag_int(payload, 0)[0] < _VIEW_FROM:
            return None
        out: list[wire.Payload] = []
        pos = 0
        while pos < end:
            msg, stop = wire.decode_message(payload, pos, wire.Direction.TO_BINDING)
            if (
                stop - pos > wire.DEFAULT_MAX_MESSAGE_SIZE
                or not isinstance(msg, wire.IncomingRpc)
                or msg.rpc_type != wire.RpcType.FORK
            ):
                return None
            view = payload[pos:stop]
            out.append(view if stop - pos >= _VIEW_FROM else view.tobytes())
            pos = stop
    except wire.ProtocolError:
        return None
    return out


def count_replayable(body: wire.Payload, start: int = 0) -> int | None:
    """How many of a record body's framed messages (from ``body[start:]``; a record in
    wire form from its header's size on) are fork calls, when all are fork or impulse
    calls; None otherwise (see :func:`_count_replayable_py`, the reference, and
    ``wire/_cdecode.c``, its C twin, used where built)."""
    count = _c_count_replayable
    if count is not None:
        n = count(body, start)
        if n >= 0:
            return n
        if n == -1:
            return None
        # -2: a body the C loop is not written for (not flat bytes)
    return _count_replayable_py(body, start)


def _count_replayable_py(body: wire.Payload, start: int = 0) -> int | None:
    """How many of a record body's framed messages are fork calls, read byte by byte,
    when all are fork or impulse calls (decoding accepts exactly these and reads
    nothing after their type byte); None otherwise (a return value, an async/await
    call, a batch, a control message, anything malformed): then decode them.

    Used by replay, which needs only this count per logged record.
    """
    n = 0
    pos = start
    end = len(body)
    while pos < end:
        b0 = body[pos]
        if b0 < 0x80:
            size = b0
            at = pos + 1
        elif pos + 1 < end and body[pos + 1] < 0x80:
            size = (b0 & 0x7F) | (body[pos + 1] << 7)
            at = pos + 2
        else:
            return None
        stop = at + (size >> 1)
        if size & 1 or size < 4 or stop > end or body[at] != 0:
            return None
        if body[at + 1]:  # a return value: decoding checks its fields
            return None
        p = at + 2  # a call: its method id (at most 5 varint bytes), then its type byte
        last = min(p + 5, stop)
        while p < last and body[p] >= 0x80:
            p += 1
        if p >= last or (p - at == 6 and body[p] > 0x0F) or p + 1 >= stop:
            return None
        rpc_type = body[p + 1]
        if rpc_type == _FORK:
            n += 1
        elif rpc_type != _IMPULSE:  # an async/await call: decoding checks its sender
            return None
        pos = stop
    return n


_IMPULSE = int(wire.RpcType.IMPULSE)


def _load_count_replayable() -> Callable[[wire.Payload, int], int] | None:
    # The C twin reads fork as 1 and impulse as 2, as the wire format has them.
    if (_FORK, _IMPULSE) != (1, 2) or accel.load("ambrosia_py.wire._cdecode") is None:
        return None
    from ...wire import _cdecode

    return _cdecode.count_replayable


_c_count_replayable = _load_count_replayable()
