"""Routing at the byte level: the coordinator's per-message paths, sans-IO.

What :class:`.intake.Intake` does to each call or return value without decoding it:
cut the destination out of an outgoing frame (:func:`to_incoming`), tell an impulse
from replayable input (:func:`is_replayable`), and count a record's fork calls
(:func:`count_replayable`, in C where built). Each accepts exactly what decoding
accepts, or leaves the frame to the general path that decodes it and raises the
documented errors.
"""

from __future__ import annotations

from collections.abc import Callable

from ... import accel, wire
from ...wire.decoding import _decode_messages_py

__all__ = [
    "count_replayable",
    "is_replayable",
    "to_incoming",
]


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
