"""The field kinds both dialects' tables are written in, and the cursor that reads them.

A :class:`Kind` says how one field is written and read; the byte order and the widths of
string lengths come from the dialect's :class:`~.codec.DialectSpec` at each call, so a
kind is shared by both tables. The :class:`Cursor` reads one frame and raises the
:mod:`.errors` classes naming the field and the stream offset where it starts (for bad
UTF-8, the offending byte). Internal to the package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .errors import (
    InvalidBoolError,
    InvalidTextError,
    ProtocolError,
    TrailingBytesError,
    TruncatedFrameError,
)

if TYPE_CHECKING:
    from .codec import DialectSpec

Pairs = tuple[tuple[int, int], ...]


class Unfit(Exception):
    """A value a field cannot hold; ``encode`` turns it into an EncodeError naming the
    frame, the field and the dialect."""


class Cursor:
    """Reads one frame (tag first) field by field; errors name stream offsets."""

    __slots__ = ("base", "buf", "dialect", "frame", "order", "pos")

    def __init__(self, buf: bytes, base: int, spec: DialectSpec, frame: str) -> None:
        self.buf = buf
        self.pos = 1  # after the tag
        self.base = base  # stream offset of the tag
        self.order: Literal["little", "big"] = spec.byte_order
        self.dialect = spec.dialect.value
        self.frame = frame

    def error(
        self, cls: type[ProtocolError], field: str | None, at: int, reason: str
    ) -> ProtocolError:
        """``cls`` for ``field`` at ``at`` (an index into this frame)."""
        return cls(self.dialect, self.frame, field, self.base + at, reason)

    @property
    def left(self) -> int:
        """Bytes of the frame not read yet."""
        return len(self.buf) - self.pos

    def take(self, n: int, field: str) -> bytes:
        if n > self.left:
            raise self.error(
                TruncatedFrameError, field, self.pos, f"needs {n} bytes, {self.left} left"
            )
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def uint(self, n: int, field: str) -> int:
        return int.from_bytes(self.take(n, field), self.order)

    def i64(self, field: str) -> int:
        return int.from_bytes(self.take(8, field), self.order, signed=True)

    def bool8(self, field: str) -> bool:
        at = self.pos
        value = self.uint(1, field)
        if value > 1:
            raise self.error(InvalidBoolError, field, at, f"boolean 0x{value:02x}, expected 0 or 1")
        return value == 1

    def blob(self, width: int, field: str) -> bytes:
        """A ``width``-byte length, then that many bytes."""
        at = self.pos
        n = self.uint(width, field)
        if n > self.left:
            reason = f"length {n} past the end of the frame ({self.left} bytes left)"
            raise self.error(TruncatedFrameError, field, at, reason)
        return self.take(n, field)

    def text(self, width: int, field: str) -> str:
        raw = self.blob(width, field)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            at = self.pos - len(raw) + exc.start
            raise self.error(InvalidTextError, field, at, f"invalid UTF-8 ({exc.reason})") from None

    def rest(self) -> bytes:
        """The bytes left in the frame (the seed's "remaining bytes")."""
        out = self.buf[self.pos :]
        self.pos = len(self.buf)
        return out

    def end(self) -> None:
        """Raise TrailingBytesError unless the frame has been read to its end."""
        n = self.left
        if n:
            reason = f"{n} trailing byte{'s' * (n != 1)} after the last field"
            raise self.error(TrailingBytesError, None, self.pos, reason)


@attrs.frozen
class Kind:
    """How one field is written (for a dialect) and read."""

    write: Callable[[Any, DialectSpec], bytes]
    read: Callable[[Cursor, DialectSpec, str], Any]


def uint_bytes(value: Any, size: int, spec: DialectSpec) -> bytes:
    """``value`` as a ``size``-byte unsigned integer in the dialect's byte order."""
    if not isinstance(value, int) or isinstance(value, bool):
        raise Unfit(f"expects an integer, got {type(value).__name__}")
    try:
        return value.to_bytes(size, spec.byte_order)
    except OverflowError:
        raise Unfit(f"{value} is not a u{size * 8}") from None


def sized(raw: bytes, width: int, spec: DialectSpec) -> bytes:
    """``raw`` after its length as a ``width``-byte integer."""
    if len(raw) >> (8 * width):
        raise Unfit(f"{len(raw)} bytes, over the u{8 * width} length's {(1 << 8 * width) - 1}")
    return len(raw).to_bytes(width, spec.byte_order) + raw


def _uint(size: int) -> Kind:
    return Kind(
        lambda v, spec: uint_bytes(v, size, spec),
        lambda cur, spec, field: cur.uint(size, field),
    )


def _write_bool(value: Any, spec: DialectSpec) -> bytes:
    if not isinstance(value, bool):
        raise Unfit(f"expects a bool, got {type(value).__name__}")
    return b"\x01" if value else b"\x00"


def _write_text(value: Any, width: int, spec: DialectSpec) -> bytes:
    if not isinstance(value, str):
        raise Unfit(f"expects text, got {type(value).__name__}")
    try:
        raw = value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise Unfit(f"not encodable as UTF-8 ({exc.reason})") from None
    return sized(raw, width, spec)


def _short(spec: DialectSpec) -> int:
    return spec.short_length_bytes


def _long(spec: DialectSpec) -> int:
    return spec.long_length_bytes


def _text(width: Callable[[DialectSpec], int]) -> Kind:
    return Kind(
        lambda v, spec: _write_text(v, width(spec), spec),
        lambda cur, spec, field: cur.text(width(spec), field),
    )


def _write_bytes(value: Any, spec: DialectSpec) -> bytes:
    if not isinstance(value, bytes):
        raise Unfit(f"expects bytes, got {type(value).__name__}")
    return sized(value, spec.short_length_bytes, spec)


def _write_pairs(pairs: Pairs, spec: DialectSpec) -> bytes:
    return b"".join(uint_bytes(a, 8, spec) + uint_bytes(b, 8, spec) for a, b in pairs)


def _read_pairs(cur: Cursor, field: str, count: int | None) -> Pairs:
    # count None: pairs to the end of the frame (seed 000: OK's and ACK's "remaining
    # bytes in the frame"); a partial pair at the end is a truncated field.
    pairs: list[tuple[int, int]] = []
    while cur.left if count is None else len(pairs) < count:
        item = f"{field}[{len(pairs)}]"
        pairs.append((cur.uint(8, f"{item}.stream_id"), cur.uint(8, f"{item}.point")))
    return tuple(pairs)


def _write_counted_pairs(pairs: Pairs, spec: DialectSpec) -> bytes:
    return uint_bytes(len(pairs), 4, spec) + _write_pairs(pairs, spec)


def _read_counted_pairs(cur: Cursor, spec: DialectSpec, field: str) -> Pairs:
    at = cur.pos
    count = cur.uint(4, field)
    if count * 16 > cur.left:  # checked before reading, so a count cannot run away
        reason = f"count {count} needs {count * 16} bytes, {cur.left} left"
        raise cur.error(TruncatedFrameError, field, at, reason)
    return _read_pairs(cur, field, count)


U16 = _uint(2)
U32 = _uint(4)
U64 = _uint(8)
U128 = _uint(16)
BOOL = Kind(_write_bool, lambda cur, spec, field: cur.bool8(field))
SHORT_TEXT = _text(_short)
"""UTF-8 after a short length (u16 in both dialects)."""
LONG_TEXT = _text(_long)
"""UTF-8 after a long length (u32: RESTART's address, MIGRATE's host)."""
SHORT_BYTES = Kind(_write_bytes, lambda cur, spec, field: cur.blob(_short(spec), field))
"""Opaque bytes after a short length (the cookie)."""
PAIRS_TO_END = Kind(_write_pairs, lambda cur, spec, field: _read_pairs(cur, field, None))
"""(u64, u64) pairs filling the rest of the frame (the draft's OK and ACK)."""
COUNTED_PAIRS = Kind(_write_counted_pairs, _read_counted_pairs)
"""A u32 count, then that many (u64, u64) pairs (v3's ACK)."""
