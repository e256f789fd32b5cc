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
from ...wire.decoding import _decode_messages_py

__all__ = [
    "count_replayable",
    "is_replayable",
    "large_link_forks",
    "one_link_message",
    "split_link_forks",
    "to_incoming",
]

_VIEW_FROM = 8 * 1024  # link calls this large are queued as views of their frame


def to_incoming(raw: bytes | memoryview) -> tuple[str, bytes, memoryview]:
    """Split an outgoing RPC frame into its destination and the incoming frame's parts.

    ``size | 00 | ZigZagInt dest length | dest | body`` becomes ``size' | 00`` and
    ``body`` (a view of ``raw``): the destination is cut out without decoding or copying
    the body (the hot path for self-calls).
    """
    mv = memoryview(raw)
    size, pos = wire.decode_zigzag_int(mv, 0)
    name_len, name_at = wire.decode_zigzag_int(mv, pos + 1, pos + size)
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
    """A link frame's messages, if all are fork calls in the incoming form under
    :data:`_VIEW_FROM` bytes (:func:`large_link_forks` takes larger ones); else None.

    The fast path of :meth:`Intake.link_input`: the frame is read as decoding reads it
    (:func:`count_replayable`: every message a fork or an impulse call, and as many forks
    as messages), then cut at its messages' sizes. Anything else, valid or not, returns
    None and takes the general path, which decodes each message and raises the
    documented errors.
    """
    forks = count_replayable(data)
    if forks is None:
        return None
    out: list[bytes] = []
    append = out.append
    decode_size = wire.decode_zigzag_int
    pos = 0
    for _ in range(forks):
        size, at = decode_size(data, pos)  # decoding read it: a valid size
        stop = at + size
        if size >= _VIEW_FROM:
            return None
        append(data[pos:stop])
        pos = stop
    return out if pos == len(data) else None  # an impulse, too: not a frame of forks


def one_link_message(data: bytes) -> wire.Message | None:
    """The message ``data`` is, decoded in the incoming form, if it is exactly one; None
    if it is several, or is not read whole (malformed: the general path says how)."""
    try:
        messages = wire.decode_messages(data, 0, len(data))
    except wire.ProtocolError:
        return None
    return messages[0] if len(messages) == 1 else None


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
    calls as decoding reads them; None otherwise (a return value, an async/await call, a
    batch, a control message, anything malformed): then decode them.

    Used by replay, which needs only this count per logged record. The C accelerator
    (``wire/_cdecode.c``) counts without decoding where it is built, and leaves to
    :func:`_count_replayable_py`, the reference, what it does not decide.
    """
    count = _c_count_replayable
    if count is not None:
        n = count(body, start)
        if n >= 0:
            return n
        if n == -1:
            return None
        # -2: not decided here (a body the C loop is not written for, a large message)
    return _count_replayable_py(body, start)


def _count_replayable_py(body: wire.Payload, start: int = 0) -> int | None:
    """:func:`count_replayable` by decoding the messages (in Python alone: the reference
    its C accelerator is held to)."""
    try:
        messages = _decode_messages_py(body, start, len(body))
    except wire.ProtocolError:
        return None
    n = 0
    for msg in messages:
        if type(msg) is not wire.IncomingRpc or msg.rpc_type is wire.RpcType.ASYNC_AWAIT:
            return None
        n += msg.rpc_type is wire.RpcType.FORK
    return n


def _load_count_replayable() -> Callable[[wire.Payload, int], int] | None:
    # The C loop reads fork as 1 and impulse as 2, as the wire format has them.
    if (wire.RpcType.FORK, wire.RpcType.IMPULSE) != (1, 2):  # pragma: no cover
        return None
    if accel.load("ambrosia_py.wire._cdecode") is None:
        return None
    from ...wire import _cdecode

    return _cdecode.count_replayable


_c_count_replayable = _load_count_replayable()
