"""Checksummed frames and the incremental reader (seed 004, *Framing and checksumming
protocol*; reference, *Frames (no TLS)*).

A frame on a plain TCP connection, every integer little-endian::

    u32 length (token + message, at least 16) | u64 XXH3-64 (seed 0) of token + message
    | token: u64 first, u64 second | message

Over TLS the checksum is left out (reference, *Frames*; TLS has its own integrity
check): ``u32 length | token | message``. ``checksum=False`` selects that form.

A length below 16 or above the limit (:data:`PACKET_LIMIT`, 100 MiB, by default), or a
checksum that does not match, is an error that closes the connection. The length is
checked as soon as its 4 bytes are in, before anything of the frame is buffered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import attrs
import xxhash

from .constants import (
    FRAME_HEADER_LENGTH,
    MIN_FRAME_LENGTH,
    PACKET_LIMIT,
    TLS_FRAME_HEADER_LENGTH,
    Buffer,
)
from .errors import ChecksumError, FlowError, FrameLengthError, TruncatedFrameError
from .tokens import Token

__all__ = [
    "FlowFrame",
    "FrameReader",
    "check_frame_limit",
    "encode_frame",
    "encode_frame_bytes",
    "frame_checksum",
]

_LENGTH = struct.Struct("<I")
_PREFIX = struct.Struct("<IQ")  # length, checksum
_HEADER = struct.Struct("<IQQQ")  # length, checksum, token first, token second
_TLS_HEADER = struct.Struct("<IQQ")  # length, token first, token second
_CHECKED_FROM = _PREFIX.size  # the checksum covers everything after length and checksum
_U32 = 0xFFFF_FFFF
_ZERO_COPY = 64 * 1024  # messages at least this large are handed out as views, uncopied
_ONE_SHOT_BYTES = 4096  # checksums of messages up to this size hash one joined copy


def _nbytes(buf: Buffer) -> int:
    return buf.nbytes if isinstance(buf, memoryview) else len(buf)


def check_frame_limit(max_length: int) -> int:
    """``max_length`` if it is a usable frame length limit (16..2**32-1), else ValueError."""
    if not MIN_FRAME_LENGTH <= max_length <= _U32:
        raise ValueError(f"frame length limit {max_length} outside {MIN_FRAME_LENGTH}..{_U32}")
    return max_length


def frame_checksum(token_bytes: Buffer, message: Buffer) -> int:
    """XXH3-64 (seed 0) of the token's 16 bytes followed by the message, streamed (or
    joined, for a small message: one call rather than four)."""
    if _nbytes(message) <= _ONE_SHOT_BYTES:
        return xxhash.xxh3_64_intdigest(bytes(token_bytes) + bytes(message))
    hasher = xxhash.xxh3_64()
    hasher.update(token_bytes)
    hasher.update(message)
    return int(hasher.intdigest())


def encode_frame(
    token: Token, message: Buffer, *, max_length: int = PACKET_LIMIT, checksum: bool = True
) -> list[bytes | memoryview]:
    """A frame as buffers: the 28-byte header (20 without the checksum, the TLS form), then
    ``message`` itself, uncopied.

    Ready for ``writelines``. A mutable ``message`` must not change until it is written.
    Raises :class:`FrameLengthError` if 16 + the message size exceeds ``max_length``.
    """
    size = _nbytes(message)
    length = MIN_FRAME_LENGTH + size
    if length > check_frame_limit(max_length):
        raise FrameLengthError(
            f"frame length {length} (a {size}-byte message) exceeds the limit {max_length}"
        )
    token_bytes = token.encode()
    if checksum:
        header = _PREFIX.pack(length, frame_checksum(token_bytes, message)) + token_bytes
    else:
        header = _LENGTH.pack(length) + token_bytes
    return [header, message if isinstance(message, bytes | memoryview) else memoryview(message)]


def encode_frame_bytes(
    token: Token, message: Buffer, *, max_length: int = PACKET_LIMIT, checksum: bool = True
) -> bytes:
    """A frame joined into one ``bytes``."""
    return b"".join(encode_frame(token, message, max_length=max_length, checksum=checksum))


@attrs.frozen
class FlowFrame:
    """One received frame: its token and message.

    ``message`` is a read-only view that no later ``feed`` changes; ``offset`` is the
    stream offset of the frame's length field.
    """

    token: Token
    message: memoryview = attrs.field(repr=lambda m: f"<{m.nbytes} bytes>")
    offset: int = attrs.field(default=0, eq=False)


class FrameReader:
    """Reads frames from a byte stream fed in chunks of any size.

    ``feed()`` appends bytes; ``next_frame()`` returns the next complete, verified frame or
    ``None`` when more bytes are needed; iterating yields every complete frame. The length
    is checked as soon as its 4 bytes arrive. After an error every later call raises it
    again: the reader never resyncs. ``start_offset`` is the stream offset of the first byte
    fed (after a ConnectPacket, its size), so errors name offsets in the whole stream.

    A ``bytes`` chunk fed while nothing is buffered is kept by reference and messages are
    cut from it; messages of 64 KiB or more are views (no copy), smaller ones are copied
    so a small message does not keep a large chunk alive.

    ``checksum=False`` reads the TLS form (no checksum field). ``max_length`` may be
    changed between frames (a link raises it once the peer is authenticated).
    """

    def __init__(
        self, *, max_length: int = PACKET_LIMIT, start_offset: int = 0, checksum: bool = True
    ) -> None:
        self._max = check_frame_limit(max_length)
        self._checksum = checksum
        self._prefix = _CHECKED_FROM if checksum else _LENGTH.size
        self._data: bytes | bytearray = b""
        self._pos = 0
        self._consumed = start_offset  # stream offset of _data[0]
        self._failed: FlowError | None = None

    @property
    def max_length(self) -> int:
        """The largest frame length accepted."""
        return self._max

    @max_length.setter
    def max_length(self, value: int) -> None:
        self._max = check_frame_limit(value)

    @property
    def checksum(self) -> bool:
        """Whether frames carry the XXH3 checksum (False: the TLS form)."""
        return self._checksum

    @property
    def offset(self) -> int:
        """Stream offset of the first byte not yet returned in a frame."""
        return self._consumed + self._pos

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned in a frame: 0 at a frame boundary."""
        return len(self._data) - self._pos

    def feed(self, data: Buffer) -> None:
        """Append ``data`` to the stream. The reader keeps ``bytes`` and copies the rest."""
        if self._failed is not None:
            raise self._failed
        if not _nbytes(data):
            return
        if self._pos >= len(self._data):
            self._consumed += len(self._data)
            self._pos = 0
            self._data = data if isinstance(data, bytes) else bytes(data)
            return
        if isinstance(self._data, bytes):
            with memoryview(self._data) as mv:
                self._data = bytearray(mv[self._pos :])
            self._consumed += self._pos
            self._pos = 0
        elif self._pos * 2 >= len(self._data):
            del self._data[: self._pos]
            self._consumed += self._pos
            self._pos = 0
        self._data += data

    def next_frame(self) -> FlowFrame | None:
        """The next complete frame, or ``None`` if more bytes are needed."""
        if self._failed is not None:
            raise self._failed
        try:
            return self._next_frame()
        except FlowError as exc:
            self._failed = exc
            raise

    def _next_frame(self) -> FlowFrame | None:
        data, pos = self._data, self._pos
        available = len(data) - pos
        if available < _LENGTH.size:
            return None
        start = self._consumed + pos
        (length,) = _LENGTH.unpack_from(data, pos)
        if length < MIN_FRAME_LENGTH:
            raise FrameLengthError(
                f"frame length {length} is below {MIN_FRAME_LENGTH} (no room for the token)",
                offset=start,
            )
        if length > self._max:
            raise FrameLengthError(
                f"frame length {length} exceeds the limit {self._max}", offset=start
            )
        prefix = self._prefix
        if available < prefix + length:
            return None
        end = pos + prefix + length
        if not self._checksum:
            _, first, second = _TLS_HEADER.unpack_from(data, pos)
            message = self._take(pos + TLS_FRAME_HEADER_LENGTH, end)
            return FlowFrame(Token(first, second), message, start)
        _, expected, first, second = _HEADER.unpack_from(data, pos)
        with memoryview(data) as mv:
            actual = xxhash.xxh3_64_intdigest(mv[pos + _CHECKED_FROM : end])
        if actual != expected:
            raise ChecksumError(
                f"frame checksum {expected:#018x} does not match its token and message "
                f"({actual:#018x})",
                offset=start,
            )
        message = self._take(pos + FRAME_HEADER_LENGTH, end)
        return FlowFrame(Token(first, second), message, start)

    def _take(self, start: int, end: int) -> memoryview:
        """Bytes ``start:end`` of the buffer as a view no later feed can change; consume them."""
        data = self._data
        self._pos = end
        if end - start < _ZERO_COPY:
            with memoryview(data) as mv:
                return memoryview(bytes(mv[start:end]))
        if isinstance(data, bytes):
            return memoryview(data)[start:end]
        # Hand the assembly buffer over (it is never resized again) and keep the rest.
        with memoryview(data) as mv:
            self._data = bytearray(mv[end:])
        self._consumed += end
        self._pos = 0
        return memoryview(data).toreadonly()[start:end]

    def __iter__(self) -> Iterator[FlowFrame]:
        while (frame := self.next_frame()) is not None:
            yield frame

    def frames(self, data: Buffer) -> list[FlowFrame]:
        """Feed ``data`` and return every frame it completes."""
        self.feed(data)
        return list(self)

    def close(self) -> None:
        """Say the stream ended; raise :class:`TruncatedFrameError` (for good) if inside a frame."""
        if self._failed is not None:
            raise self._failed
        if self.buffered:
            self._failed = TruncatedFrameError(
                f"stream ends inside a frame ({self.buffered} bytes left over)",
                offset=self.offset,
            )
            raise self._failed
