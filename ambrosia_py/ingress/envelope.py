"""What the ingress logs, sans-IO: the body of its impulses, as the log keeps them forever.

A call from outside enters the immortal as an impulse to the reserved method id
:data:`INGRESS_METHOD_ID` (negative: never an ``@rpc`` method's), so the coordinator
logs it, key and all, before the dispatcher sees it. Its arguments are one of::

    CALL       u8 1 | u64 time (ms since the epoch, the server's clock at arrival)
               | u8 k | key (k, 1..255) | i32 method id | the method's arguments
    RETENTION  u8 2 | u64 calls to keep | u64 milliseconds to keep them

Integers are little-endian. The time is logged input: the key table's clock
(``keys.py``) only ever reads it, so expiry replays exactly. The formats are read
back at every replay of old logs: change them only by adding kinds.
"""

from __future__ import annotations

import enum
import struct

import attrs

from .errors import IngressProtocolError
from .frames import MAX_KEY_SIZE

__all__ = [
    "INGRESS_METHOD_ID",
    "CallEnvelope",
    "EnvelopeKind",
    "RetentionEnvelope",
    "decode_envelope",
    "encode_call_envelope",
    "encode_retention_envelope",
]

INGRESS_METHOD_ID = -0x494E47  # "ING"; @rpc ids are 0..2**31-1
_CALL_HEAD = struct.Struct("<BQB")  # kind, time, key length
_METHOD = struct.Struct("<i")
_RETENTION = struct.Struct("<BQQ")


class EnvelopeKind(enum.IntEnum):
    CALL = 1
    RETENTION = 2


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


def encode_retention_envelope(retention: RetentionEnvelope) -> bytes:
    return _RETENTION.pack(EnvelopeKind.RETENTION, retention.keep_count, retention.keep_ms)


def decode_envelope(data: bytes | bytearray | memoryview) -> CallEnvelope | RetentionEnvelope:
    """One logged ingress impulse; :class:`IngressProtocolError` names what and where."""
    data = bytes(data)
    if not data:
        raise IngressProtocolError("an empty ingress impulse", offset=0)
    kind = data[0]
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
