"""BARE primitives, strict: the encoders and the :class:`Reader` every Ockam codec uses.

Owns the byte-level rules of the reference (*BARE primitives*): ``uint`` is unsigned
LEB128, ``int`` is its zig-zag form, ``string`` and ``data`` are a ``uint`` length then
the bytes, ``optional<T>`` is ``00`` or ``01`` then T, an enum or union tag is a
``uint``, ``[]T`` is a ``uint`` count then the items, and a struct is its fields in
schema order with no tags.

Decoding never guesses. Every rejection is a :class:`~.errors.DecodeError` that names
``Struct.field`` and the byte offset where the bad field starts: truncation, a length or
count past the end, an over-long or non-minimal varint, invalid UTF-8, an optional flag
other than 0/1, an enum value or union tag outside the schema, and trailing bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import TypeVar

from ambrosia_py.wire.errors import TruncatedInputError, VarintTooLongError
from ambrosia_py.wire.varint import (
    decode_uvarint,
    encode_uvarint,
    encode_zigzag_long,
    uvarint_size,
)

from .errors import DecodeError

__all__ = [
    "MAX_UINT",
    "MAX_VARINT_BYTES",
    "Reader",
    "data",
    "data_size",
    "int_",
    "list_",
    "optional",
    "string",
    "string_size",
    "u8",
    "uint",
    "uint_at",
    "uint_size",
]

T = TypeVar("T")

MAX_UINT = 2**64 - 1
"""The largest BARE ``uint``: the format's integers are 64-bit."""

MAX_VARINT_BYTES = 10
"""A 64-bit value needs at most 10 groups of 7 bits (reference, *BARE primitives*)."""

_MIN_INT = -(2**63)
_MAX_INT = 2**63 - 1


# --- encoders ---------------------------------------------------------------------------


# BARE's ``uint`` is the unsigned LEB128 varint AMBROSIA's ZigZagInt and ZigZagLong are
# built on, and its ``int`` is their zig-zag form over 64 bits (ZigZagLong): the byte
# work is ``ambrosia_py.wire.varint``'s. BARE's own rules (64 bits, minimal encodings
# only) are checked here.


def uint(n: int) -> bytes:
    """``n`` as a BARE ``uint`` (unsigned LEB128); ValueError unless 0 <= n < 2**64."""
    if not 0 <= n <= MAX_UINT:
        raise ValueError(f"uint {n} is negative" if n < 0 else f"uint {n} does not fit in 64 bits")
    return encode_uvarint(n)


def uint_size(n: int) -> int:
    """The length of ``uint(n)`` in bytes, computed without encoding."""
    return uvarint_size(n)


def int_(n: int) -> bytes:
    """``n`` as a BARE ``int``: zig-zag, then a ``uint``; ValueError outside 64-bit."""
    if not _MIN_INT <= n <= _MAX_INT:
        raise ValueError(f"int {n} does not fit in 64 bits")
    # Zig-zag maps 0, -1, 1, -2 ... to 0, 1, 2, 3 ... so small magnitudes stay short.
    return encode_zigzag_long(n)


def uint_at(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """The ``uint`` at ``buf[pos:end]`` and the position after it: at most 10 bytes,
    below 2**64, minimally encoded. ValueError saying why for anything else."""
    try:
        value, after = decode_uvarint(buf, pos, end, MAX_VARINT_BYTES)
    except TruncatedInputError:
        n = end - pos
        got = f"after {n} byte{'s' * (n != 1)}" if n > 0 else "with no bytes left"
        raise ValueError(f"truncated: varint ends {got}") from None
    except VarintTooLongError:
        raise ValueError(f"varint longer than {MAX_VARINT_BYTES} bytes") from None
    # We reject a last group of zero after other groups ("80 00" for 0): the BARE spec
    # requires the minimal encoding, the released encoders only produce it, and accepting
    # padding would give one value many encodings (two payloads equal as values but not
    # as bytes).
    if after - pos > 1 and buf[after - 1] == 0:
        raise ValueError(f"non-minimal varint ({after - pos} bytes)")
    if value > MAX_UINT:  # the 10th group holds bit 63 only
        raise ValueError("varint value does not fit in 64 bits")
    return value, after


def string(s: str) -> bytes:
    """``s`` as a BARE ``string``: the UTF-8 length, then the UTF-8 bytes."""
    raw = s.encode("utf-8")
    return uint(len(raw)) + raw


def string_size(s: str) -> int:
    """The length of ``string(s)`` in bytes."""
    n = len(s.encode("utf-8"))
    return uint_size(n) + n


def data(b: bytes | bytearray | memoryview) -> bytes:
    """``b`` as BARE ``data``: its length, then the bytes."""
    raw = bytes(b)
    return uint(len(raw)) + raw


def data_size(n: int) -> int:
    """The length of BARE ``data`` holding ``n`` bytes."""
    return uint_size(n) + n


def optional(value: T | None, enc: Callable[[T], bytes]) -> bytes:
    """BARE ``optional<T>``: ``00`` for None, else ``01`` then ``enc(value)``."""
    return b"\x00" if value is None else b"\x01" + enc(value)


def list_(items: Iterable[T], enc: Callable[[T], bytes]) -> bytes:
    """BARE ``[]T``: the item count, then each item as ``enc`` encodes it."""
    parts = [enc(item) for item in items]
    return uint(len(parts)) + b"".join(parts)


def u8(n: int) -> bytes:
    """``n`` as one byte; ValueError outside 0..255."""
    if not 0 <= n <= 0xFF:
        raise ValueError(f"u8 {n} outside 0..255")
    return bytes((n,))


# --- decoding ---------------------------------------------------------------------------


class Reader:
    """Reads BARE values from ``buf[start:end]``, strictly, one field at a time.

    ``context`` is the struct being read; every error names ``context.field`` and the
    offset where the field starts, counted from the start of ``buf`` (not of
    ``start``), so a nested reader made by :meth:`sub` reports offsets in the outer
    buffer. ``context`` may be reassigned as decoding moves from struct to struct.

    The ``read_fn`` passed to :meth:`optional` and :meth:`list_` is called as
    ``read_fn(reader, field)`` so unbound methods work (``Reader.string``) and nested
    structs can name their fields under ``field`` (``"messages[2].data"``).
    """

    __slots__ = ("_buf", "_end", "_pos", "context")

    def __init__(
        self,
        buf: bytes | bytearray | memoryview,
        context: str,
        *,
        start: int = 0,
        end: int | None = None,
    ) -> None:
        if isinstance(buf, memoryview):
            view = buf if buf.format == "B" and buf.ndim == 1 else buf.cast("B")
            size = view.nbytes
            self._buf: bytes | memoryview = view
        else:
            self._buf = bytes(buf) if isinstance(buf, bytearray) else buf
            size = len(buf)
        stop = size if end is None else end
        if not 0 <= start <= stop <= size:
            raise ValueError(f"reader bounds {start}..{stop} outside a {size}-byte buffer")
        self._pos = start
        self._end = stop
        self.context = context

    @property
    def pos(self) -> int:
        """The offset of the next byte to read, counted from the start of the buffer."""
        return self._pos

    @property
    def remaining(self) -> int:
        """How many bytes are left before the end of this reader's range."""
        return self._end - self._pos

    def error(self, field: str, offset: int, reason: str) -> DecodeError:
        """A :class:`DecodeError` for ``context.field`` at ``offset`` (to raise)."""
        what = f"{self.context}.{field}" if field else self.context
        return DecodeError(what, offset, reason)

    def end(self) -> None:
        """Raise if any byte is left: every encoding must be consumed exactly."""
        if self._pos != self._end:
            left = self._end - self._pos
            raise self.error("", self._pos, f"{left} trailing byte{'s' * (left != 1)}")

    # -- scalars --

    def uint(self, field: str) -> int:
        """A ``uint``: at most 10 bytes, below 2**64, minimally encoded (:func:`uint_at`)."""
        pos = self._pos
        try:
            value, self._pos = uint_at(self._buf, pos, self._end)
        except ValueError as exc:
            raise self.error(field, pos, str(exc)) from None
        return value

    def int_(self, field: str) -> int:
        """An ``int``: a zig-zag ``uint``."""
        n = self.uint(field)
        return (n >> 1) ^ -(n & 1)

    def u8(self, field: str) -> int:
        """One byte."""
        if self._pos >= self._end:
            raise self.error(field, self._pos, "truncated: expected 1 byte, none left")
        b = self._buf[self._pos]
        self._pos += 1
        return b

    def enum(self, field: str, count: int) -> int:
        """An enum value, which must be below ``count``."""
        start = self._pos
        value = self.uint(field)
        if value >= count:
            raise self.error(field, start, f"enum value {value} out of range 0..{count - 1}")
        return value

    def union_tag(self, field: str, allowed: Collection[int]) -> int:
        """A union tag, which must be one of ``allowed``."""
        start = self._pos
        tag = self.uint(field)
        if tag not in allowed:
            expected = ", ".join(str(t) for t in sorted(allowed))
            raise self.error(field, start, f"unknown union tag {tag} (expected {expected})")
        return tag

    # -- length-prefixed values --

    def _span(self, field: str) -> tuple[int, int]:
        """Read a length and return the (start, end) of the bytes it covers."""
        start = self._pos
        n = self.uint(field)
        body = self._pos
        left = self._end - body
        if n > left:
            raise self.error(field, start, f"length {n} past the end ({left} bytes left)")
        self._pos = body + n
        return body, body + n

    def data(self, field: str) -> bytes:
        """A ``data`` value, copied out as bytes."""
        lo, hi = self._span(field)
        return bytes(self._buf[lo:hi])

    def string(self, field: str) -> str:
        """A ``string``: its bytes must be valid UTF-8."""
        start = self._pos
        lo, hi = self._span(field)
        try:
            return str(self._buf[lo:hi], "utf-8")
        except UnicodeDecodeError as exc:
            bad = lo + exc.start
            raise self.error(field, start, f"invalid UTF-8 at byte {bad} ({exc.reason})") from None

    def sub(self, field: str, context: str) -> Reader:
        """A reader over the bytes of the ``data`` field ``field``, for a nested encoding.

        Its offsets are still counted from the start of this reader's buffer.
        """
        lo, hi = self._span(field)
        return Reader(self._buf, context, start=lo, end=hi)

    # -- composites --

    def optional(self, field: str, read_fn: Callable[[Reader, str], T]) -> T | None:
        """An ``optional<T>``: flag 0 is None, flag 1 is followed by ``read_fn``'s value."""
        start = self._pos
        flag = self.u8(field)
        if flag == 0:
            return None
        if flag != 1:
            raise self.error(field, start, f"optional flag {flag:#04x}, expected 0 or 1")
        return read_fn(self, field)

    def list_(self, field: str, read_item_fn: Callable[[Reader, str], T]) -> tuple[T, ...]:
        """A ``[]T``, each item read by ``read_item_fn(reader, "field[i]")``.

        Every item of every list in these schemas takes at least one byte, so a count
        larger than the bytes left is rejected before anything is allocated.
        """
        start = self._pos
        count = self.uint(field)
        left = self._end - self._pos
        if count > left:
            raise self.error(
                field, start, f"count {count} exceeds the {left} bytes left (items are >= 1 byte)"
            )
        return tuple(read_item_fn(self, f"{field}[{i}]") for i in range(count))
