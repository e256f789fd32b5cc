"""AMBROSIA's integer encodings (seed 002, Required Helper Functions).

ZigZagInt / ZigZagLong: zig-zag mapping, then a little-endian base-128 varint as in
protobuf; at most 5 bytes for 32-bit values and 10 for 64-bit ones. IntFixed / LongFixed
are little-endian. Decoders take ``(buffer, offset)`` and return ``(value, next offset)``.
"""

from __future__ import annotations

import struct

from .errors import TruncatedInputError, VarintTooLongError

__all__ = [
    "INT_FIXED",
    "INT_MAX",
    "INT_MIN",
    "LONG_FIXED",
    "LONG_MAX",
    "LONG_MIN",
    "decode_zigzag_int",
    "decode_zigzag_long",
    "encode_zigzag_int",
    "encode_zigzag_long",
    "zigzag_int_size",
]

INT_MIN = -(2**31)
INT_MAX = 2**31 - 1
LONG_MIN = -(2**63)
LONG_MAX = 2**63 - 1
INT_FIXED = struct.Struct("<i")
LONG_FIXED = struct.Struct("<q")

_MAX_INT_BYTES = 5
_MAX_LONG_BYTES = 10

# Single-byte encodings of small values, the overwhelmingly common case (sizes, ids, flags).
_SMALL = [bytes([((v << 1) ^ (v >> 63)) & 0xFFFFFFFFFFFFFFFF]) for v in range(-64, 64)]


def _encode(value: int, bits: int) -> bytes:
    if -64 <= value < 64:
        return _SMALL[value + 64]
    n = ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def encode_zigzag_int(value: int) -> bytes:
    """Encode a signed 32-bit integer as a ZigZagInt."""
    if -64 <= value < 64:
        return _SMALL[value + 64]
    if not INT_MIN <= value <= INT_MAX:
        raise OverflowError(f"ZigZagInt out of range: {value}")
    return _encode(value, 32)


def encode_zigzag_long(value: int) -> bytes:
    """Encode a signed 64-bit integer as a ZigZagLong."""
    if -64 <= value < 64:
        return _SMALL[value + 64]
    if not LONG_MIN <= value <= LONG_MAX:
        raise OverflowError(f"ZigZagLong out of range: {value}")
    return _encode(value, 64)


def zigzag_int_size(value: int) -> int:
    """Number of bytes :func:`encode_zigzag_int` produces for ``value``."""
    n = ((value << 1) ^ (value >> 31)) & 0xFFFFFFFF
    size = 1
    while n >= 0x80:
        n >>= 7
        size += 1
    return size


def _decode(
    buf: bytes | bytearray | memoryview, pos: int, max_bytes: int, name: str
) -> tuple[int, int]:
    start = pos
    end = len(buf)
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise TruncatedInputError(f"{name} truncated", offset=start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if pos - start >= max_bytes:
            raise VarintTooLongError(f"{name} longer than {max_bytes} bytes", offset=start)


def decode_zigzag_int(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Decode a ZigZagInt at ``pos``; return ``(value, next position)``."""
    if pos < len(buf):
        b = buf[pos]
        if b < 0x80:  # fast path: one byte
            return (b >> 1) ^ -(b & 1), pos + 1
    n, pos2 = _decode(buf, pos, _MAX_INT_BYTES, "ZigZagInt")
    if n > 0xFFFFFFFF:  # a fifth byte above 0x0f: never written, and not to be truncated
        raise VarintTooLongError("ZigZagInt value exceeds 32 bits", offset=pos)
    return (n >> 1) ^ -(n & 1), pos2


def decode_zigzag_long(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Decode a ZigZagLong at ``pos``; return ``(value, next position)``."""
    if pos < len(buf):
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    n, pos2 = _decode(buf, pos, _MAX_LONG_BYTES, "ZigZagLong")
    if n > 0xFFFFFFFFFFFFFFFF:  # a tenth byte above 0x01
        raise VarintTooLongError("ZigZagLong value exceeds 64 bits", offset=pos)
    return (n >> 1) ^ -(n & 1), pos2
