"""AMBROSIA's integer encodings (seed 002, Required Helper Functions), and the varint
every other format of the project shares.

ZigZagInt / ZigZagLong: zig-zag mapping, then a little-endian base-128 varint as in
protobuf (unsigned LEB128); at most 5 bytes for 32-bit values and 10 for 64-bit ones.
IntFixed / LongFixed are little-endian. Decoders take ``(buffer, offset)`` and return
``(value, next offset)``; an ``end`` bounds the bytes a varint may take (a message's end).

The unsigned varint itself (:func:`encode_uvarint`, :func:`decode_uvarint`) is here once
for every format built on LEB128 (BARE's ``uint`` is one); a format's own rules (BARE
refuses non-minimal encodings, AMBROSIA does not) are checked by its codec on top.
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
    "decode_uvarint",
    "decode_zigzag_int",
    "decode_zigzag_long",
    "encode_uvarint",
    "encode_zigzag_int",
    "encode_zigzag_long",
    "uvarint_size",
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
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]
_SMALL = [_ONE_BYTE[((v << 1) ^ (v >> 63)) & 0x7F] for v in range(-64, 64)]

Readable = bytes | bytearray | memoryview


def encode_uvarint(n: int) -> bytes:
    """Encode a non-negative integer as an unsigned LEB128 varint (7 bits a byte, low
    bits first, the high bit set on every byte but the last); the minimal encoding."""
    if n < 0x80:
        if n < 0:
            raise OverflowError(f"unsigned varint of a negative value: {n}")
        return _ONE_BYTE[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def uvarint_size(n: int) -> int:
    """Number of bytes :func:`encode_uvarint` produces for ``n`` (not negative)."""
    return 1 if n < 0x80 else (n.bit_length() + 6) // 7


def decode_uvarint(
    buf: Readable, pos: int = 0, end: int | None = None, max_bytes: int = _MAX_LONG_BYTES
) -> tuple[int, int]:
    """Decode an unsigned LEB128 varint of at most ``max_bytes`` bytes at ``pos``, within
    ``buf[:end]``; return ``(value, next position)``. Raises
    :class:`~.errors.TruncatedInputError` if it runs past ``end`` and
    :class:`~.errors.VarintTooLongError` if ``max_bytes`` bytes do not end it. Non-minimal
    encodings are accepted, and the value is not bounded beyond ``7 * max_bytes`` bits."""
    size = len(buf)
    if end is None or end > size:
        end = size
    if pos < end:
        b = buf[pos]
        if b < 0x80:  # one byte: the common case
            return b, pos + 1
    start = pos
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise TruncatedInputError("varint truncated", offset=start)
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7
        if pos - start >= max_bytes:
            raise VarintTooLongError(f"varint longer than {max_bytes} bytes", offset=start)


def encode_zigzag_int(value: int) -> bytes:
    """Encode a signed 32-bit integer as a ZigZagInt."""
    if -64 <= value < 64:
        return _SMALL[value + 64]
    if 0 < value < 0x2000:  # two bytes: the size of a message up to 8 KiB
        return bytes((((value << 1) & 0x7F) | 0x80, value >> 6))
    if not INT_MIN <= value <= INT_MAX:
        raise OverflowError(f"ZigZagInt out of range: {value}")
    return encode_uvarint(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def encode_zigzag_long(value: int) -> bytes:
    """Encode a signed 64-bit integer as a ZigZagLong."""
    if -64 <= value < 64:
        return _SMALL[value + 64]
    if not LONG_MIN <= value <= LONG_MAX:
        raise OverflowError(f"ZigZagLong out of range: {value}")
    return encode_uvarint(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def zigzag_int_size(value: int) -> int:
    """Number of bytes :func:`encode_zigzag_int` produces for ``value``."""
    return uvarint_size(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def _decode_zigzag(
    buf: Readable, pos: int, end: int, max_bytes: int, bits: int, name: str
) -> tuple[int, int]:
    """The general case of the two decoders below: any length, any bound."""
    try:
        n, after = decode_uvarint(buf, pos, end, max_bytes)
    except TruncatedInputError:
        raise TruncatedInputError(f"{name} truncated", offset=pos) from None
    except VarintTooLongError:
        raise VarintTooLongError(f"{name} longer than {max_bytes} bytes", offset=pos) from None
    if n >> bits:  # a last byte above the value's width: never written, not to be truncated
        raise VarintTooLongError(f"{name} value exceeds {bits} bits", offset=pos)
    return (n >> 1) ^ -(n & 1), after


def decode_zigzag_int(buf: Readable, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode a ZigZagInt at ``pos`` (ending by ``end``, the buffer's end by default);
    return ``(value, next position)``."""
    stop = len(buf)
    if end is not None and end < stop:
        stop = end
    if pos < stop:
        b = buf[pos]
        if b < 0x80:  # one byte: the common case
            return (b >> 1) ^ -(b & 1), pos + 1
        if pos + 1 < stop:
            c = buf[pos + 1]
            if c < 0x80:  # two bytes: sizes of messages up to 8 KiB
                n = (b & 0x7F) | (c << 7)
                return (n >> 1) ^ -(n & 1), pos + 2
    return _decode_zigzag(buf, pos, stop, _MAX_INT_BYTES, 32, "ZigZagInt")


def decode_zigzag_long(buf: Readable, pos: int = 0, end: int | None = None) -> tuple[int, int]:
    """Decode a ZigZagLong at ``pos`` (ending by ``end``, the buffer's end by default);
    return ``(value, next position)``."""
    stop = len(buf)
    if end is not None and end < stop:
        stop = end
    if pos < stop:
        b = buf[pos]
        if b < 0x80:
            return (b >> 1) ^ -(b & 1), pos + 1
    return _decode_zigzag(buf, pos, stop, _MAX_LONG_BYTES, 64, "ZigZagLong")
