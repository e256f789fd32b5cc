"""What the ingress logs, sans-IO: the body of its impulses, as the log keeps them forever.

A call from outside enters the immortal as an impulse to the reserved method id
:data:`INGRESS_METHOD_ID` (negative: never an ``@rpc`` method's), so the coordinator
logs it, key and all, before the dispatcher sees it. Its arguments are one of::

    CALL       u8 1 | u64 time (ms since the epoch, the server's clock at arrival)
               | u8 k | key (k, 1..255) | i32 method id | the method's arguments
    RETENTION  u8 2 | u64 calls to keep | u64 milliseconds to keep them
    BATCH      u8 3 | u64 time | u32 n | n times (u8 k | key (k) | i32 method id
               | u32 a | the method's arguments (a))

Integers are little-endian. A BATCH is the calls that reached the ingress in one turn of
its event loop, from all its connections, in the order they arrived: one impulse, so one
log record and one ``fdatasync`` for all of them, where a CALL each cost the coordinator
a message each and the binding a dispatch each. Its calls are taken in order, as if
logged one after the other at the same time. The time is logged input: the key table's clock
(``keys.py``) only ever reads it, so expiry replays exactly. The formats are read
back at every replay of old logs: change them only by adding kinds.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence

import attrs

from ..wire import Payload
from .errors import IngressProtocolError
from .frames import MAX_KEY_SIZE

__all__ = [
    "INGRESS_METHOD_ID",
    "BatchEnvelope",
    "CallEnvelope",
    "EnvelopeKind",
    "RetentionEnvelope",
    "decode_envelope",
    "decode_impulse",
    "encode_batch_envelope",
    "encode_call_envelope",
    "encode_retention_envelope",
]

INGRESS_METHOD_ID = -0x494E47  # "ING"; @rpc ids are 0..2**31-1
_CALL_HEAD = struct.Struct("<BQB")  # kind, time, key length
_METHOD = struct.Struct("<i")
_RETENTION = struct.Struct("<BQQ")
_BATCH_HEAD = struct.Struct("<BQI")  # kind, time, number of calls
_KEY_SIZE = struct.Struct("<B")
_BATCH_CALL_TAIL = struct.Struct("<iI")  # method id, length of the arguments
_KEY_BYTE = tuple(_KEY_SIZE.pack(n) for n in range(MAX_KEY_SIZE + 1))


class EnvelopeKind(enum.IntEnum):
    CALL = 1
    RETENTION = 2
    BATCH = 3


_BATCH_KIND = bytes([EnvelopeKind.BATCH])


@attrs.frozen
class CallEnvelope:
    time_ms: int
    key: bytes
    method_id: int
    args: bytes


@attrs.frozen
class RetentionEnvelope:
    """How long the key table keeps results: the last ``keep_count`` calls, and none
    older than ``keep_ms`` (by logged time). 0 means no limit of that kind."""

    keep_count: int
    keep_ms: int


def encode_call_envelope(time_ms: int, key: bytes, method_id: int, args: bytes) -> bytes:
    if not 1 <= len(key) <= MAX_KEY_SIZE:
        raise ValueError(f"an idempotency key of {len(key)} bytes: it needs 1 to {MAX_KEY_SIZE}")
    return b"".join(
        (
            _CALL_HEAD.pack(EnvelopeKind.CALL, time_ms, len(key)),
            key,
            _METHOD.pack(method_id),
            args,
        )
    )


@attrs.frozen
class BatchEnvelope:
    """Calls logged together (kind BATCH): each a :class:`CallEnvelope` of the same time."""

    calls: tuple[CallEnvelope, ...]


def encode_batch_envelope(time_ms: int, calls: Sequence[tuple[bytes, int, Payload]]) -> bytes:
    """A BATCH of ``calls`` (key, method id, arguments) that arrived at ``time_ms``."""
    parts: list[Payload] = [_BATCH_HEAD.pack(EnvelopeKind.BATCH, time_ms, len(calls))]
    add = parts.append
    for key, method_id, args in calls:
        if not 1 <= len(key) <= MAX_KEY_SIZE:
            raise ValueError(
                f"an idempotency key of {len(key)} bytes: it needs 1 to {MAX_KEY_SIZE}"
            )
        add(_KEY_BYTE[len(key)])
        add(key)
        add(_BATCH_CALL_TAIL.pack(method_id, len(args)))
        add(args)
    return b"".join(parts)


def encode_retention_envelope(retention: RetentionEnvelope) -> bytes:
    return _RETENTION.pack(EnvelopeKind.RETENTION, retention.keep_count, retention.keep_ms)


def decode_impulse(data: Payload) -> RetentionEnvelope | BatchEnvelope:
    """One logged ingress impulse of any kind, a CALL as a batch of one;
    :class:`IngressProtocolError` names what and where."""
    data = bytes(data)
    if data[:1] == _BATCH_KIND:
        return _decode_batch(data)
    one = decode_envelope(data)
    return one if isinstance(one, RetentionEnvelope) else BatchEnvelope((one,))


def decode_envelope(data: Payload) -> CallEnvelope | RetentionEnvelope:
    """One logged ingress impulse of the kinds CALL and RETENTION (a BATCH is refused,
    naming :func:`decode_impulse`, which reads every kind); :class:`IngressProtocolError`
    names what and where."""
    data = bytes(data)
    if not data:
        raise IngressProtocolError("an empty ingress impulse", offset=0)
    kind = data[0]
    if kind == EnvelopeKind.BATCH:
        raise IngressProtocolError(
            "a BATCH ingress impulse (several calls): decode_impulse reads it", offset=0
        )
    if kind == EnvelopeKind.RETENTION:
        if len(data) != _RETENTION.size:
            raise IngressProtocolError(
                f"a RETENTION impulse of {len(data)} bytes, not {_RETENTION.size}", offset=0
            )
        _, count, keep_ms = _RETENTION.unpack(data)
        return RetentionEnvelope(count, keep_ms)
    if kind != EnvelopeKind.CALL:
        raise IngressProtocolError(f"an ingress impulse of unknown kind {kind}", offset=0)
    if len(data) < _CALL_HEAD.size:
        raise IngressProtocolError(
            f"a CALL impulse of {len(data)} bytes ends inside its head", offset=len(data)
        )
    _, time_ms, key_size = _CALL_HEAD.unpack_from(data)
    method_at = _CALL_HEAD.size + key_size
    if key_size == 0 or len(data) < method_at + _METHOD.size:
        raise IngressProtocolError(
            f"a CALL impulse of {len(data)} bytes with a {key_size}-byte key: the key is empty "
            "or the method id is cut",
            offset=_CALL_HEAD.size - 1,
        )
    (method_id,) = _METHOD.unpack_from(data, method_at)
    return CallEnvelope(
        time_ms, data[_CALL_HEAD.size : method_at], method_id, data[method_at + _METHOD.size :]
    )


def _decode_batch(data: bytes) -> BatchEnvelope:
    """A BATCH impulse, every call of it checked: one that ends early, or bytes after
    the last call, refuse the whole batch (nothing of it runs)."""
    if len(data) < _BATCH_HEAD.size:
        raise IngressProtocolError(
            f"a BATCH impulse of {len(data)} bytes ends inside its head", offset=len(data)
        )
    _, time_ms, count = _BATCH_HEAD.unpack_from(data)
    calls = []
    at = _BATCH_HEAD.size
    for index in range(count):
        key_at = at + 1
        key_size = data[at] if at < len(data) else 0
        tail_at = key_at + key_size
        if key_size == 0 or len(data) < tail_at + _BATCH_CALL_TAIL.size:
            raise IngressProtocolError(
                f"call {index} of a BATCH impulse of {count} calls: its key is empty or it "
                f"ends early ({len(data)} bytes)",
                offset=at,
            )
        method_id, size = _BATCH_CALL_TAIL.unpack_from(data, tail_at)
        args_at = tail_at + _BATCH_CALL_TAIL.size
        if len(data) < args_at + size:
            raise IngressProtocolError(
                f"call {index} of a BATCH impulse: {size} bytes of arguments, "
                f"{len(data) - args_at} left",
                offset=args_at,
            )
        calls.append(
            CallEnvelope(time_ms, data[key_at:tail_at], method_id, data[args_at : args_at + size])
        )
        at = args_at + size
    if at != len(data):
        raise IngressProtocolError(
            f"{len(data) - at} bytes after the last of {count} calls of a BATCH impulse",
            offset=at,
        )
    return BatchEnvelope(tuple(calls))
