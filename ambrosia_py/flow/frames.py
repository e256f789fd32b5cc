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
from collections.abc import Callable, Iterator, Sequence

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
    "encode_frame_parts",
    "frame_checksum",
]

_LENGTH = struct.Struct("<I")
_PREFIX = struct.Struct("<IQ")  # length, checksum
_HEADER = struct.Struct("<IQQQ")  # length, checksum, token first, token second
_TLS_HEADER = struct.Struct("<IQQ")  # length, token first, token second
_CHECKED_FROM = _PREFIX.size  # the checksum covers everything after length and checksum
_U32 = 0xFFFF_FFFF
_ONE_SHOT_BYTES = 4096  # checksums of messages up to this size hash one joined copy
_SMALL_PIECE = 4096  # chunks of a cut frame smaller than this are gathered, not held apart
# Tokens read from frames, by their halves: a connection carries frames for a few tokens
# (a link: its own and the keep-alives'), so each is made (and validated) once, not per
# frame. Bounded: a peer sending ever new tokens gets fresh ones past the first few.
_TOKENS: dict[tuple[int, int], Token] = {}
_TOKENS_MAX = 64


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
    header = _header(
        token,
        _nbytes(message),
        max_length,
        (lambda token_bytes: frame_checksum(token_bytes, message)) if checksum else None,
    )
    return [header, message if isinstance(message, bytes | memoryview) else memoryview(message)]


def encode_frame_parts(
    token: Token,
    parts: Sequence[Buffer],
    *,
    max_length: int = PACKET_LIMIT,
    checksum: bool = True,
) -> list[bytes | memoryview]:
    """A frame whose message is ``parts`` one after the other, as buffers: the header,
    then the parts themselves, neither joined nor copied (the checksum is streamed over
    them). The same bytes as :func:`encode_frame` of the parts joined.

    Ready for ``writelines`` or ``writev``; mutable parts must not change until written.
    """
    views = [p if isinstance(p, bytes) else memoryview(p).cast("B") for p in parts]

    def streamed(token_bytes: bytes) -> int:
        hasher = xxhash.xxh3_64(token_bytes)
        for view in views:
            hasher.update(view)
        return int(hasher.intdigest())

    header = _header(token, sum(len(v) for v in views), max_length, streamed if checksum else None)
    return [header, *views]


def _header(
    token: Token, size: int, max_length: int, checksum: Callable[[bytes], int] | None
) -> bytes:
    """The header of a frame with a ``size``-byte message; ``checksum`` of the token's
    bytes and the message, or None for the form without it (over TLS)."""
    length = MIN_FRAME_LENGTH + size
    if length > check_frame_limit(max_length):
        raise FrameLengthError(
            f"frame length {length} (a {size}-byte message) exceeds the limit {max_length}"
        )
    token_bytes = token.encode()
    if checksum is None:
        return _LENGTH.pack(length) + token_bytes
    return _PREFIX.pack(length, checksum(token_bytes)) + token_bytes


def encode_frame_bytes(
    token: Token, message: Buffer, *, max_length: int = PACKET_LIMIT, checksum: bool = True
) -> bytes:
    """A frame joined into one ``bytes``."""
    return b"".join(encode_frame(token, message, max_length=max_length, checksum=checksum))


@attrs.frozen
class FlowFrame:
    """One received frame: its token and message.

    ``message`` is a read-only view of a ``bytes`` object that holds exactly the message
    (``message.obj``), so no later ``feed`` changes it and the ``bytes`` can be handed on
    without another copy; ``offset`` is the stream offset of the frame's length field.
    """

    token: Token
    message: memoryview = attrs.field(repr=lambda m: f"<{m.nbytes} bytes>")
    offset: int = attrs.field(default=0, eq=False)


def _token(first: int, second: int) -> Token:
    """``Token(first, second)``, made once for the tokens frames carry most."""
    token = _TOKENS.get((first, second))
    if token is None:
        token = Token(first, second)
        if len(_TOKENS) < _TOKENS_MAX:
            _TOKENS[first, second] = token
    return token


class FrameReader:
    """Reads frames from a byte stream fed in chunks of any size.

    ``feed()`` appends bytes; ``next_frame()`` returns the next complete, verified frame or
    ``None`` when more bytes are needed; iterating yields every complete frame. The length
    is checked as soon as its 4 bytes arrive. After an error every later call raises it
    again: the reader never resyncs. ``start_offset`` is the stream offset of the first byte
    fed (after a ConnectPacket, its size), so errors name offsets in the whole stream.

    Each message costs one copy, into a ``bytes`` of its own: chunks (``bytes``) are kept
    by reference, a message inside one chunk is sliced from it, and a frame cut by chunk
    boundaries is held as views of its chunks until its last byte is in, then its message
    is joined once (not gathered in a buffer that grows, then copied out again).

    ``checksum=False`` reads the TLS form (no checksum field). ``max_length`` may be
    changed between frames (a link raises it once the peer is authenticated).
    """

    def __init__(
        self, *, max_length: int = PACKET_LIMIT, start_offset: int = 0, checksum: bool = True
    ) -> None:
        self._max = check_frame_limit(max_length)
        self._checksum = checksum
        self._prefix = _CHECKED_FROM if checksum else _LENGTH.size
        self._header = FRAME_HEADER_LENGTH if checksum else TLS_FRAME_HEADER_LENGTH
        self._data = b""  # the chunk frames are read from, when no frame is cut
        self._pos = 0
        self._consumed = start_offset  # stream offset of _data[0]
        # A frame cut by chunk boundaries: its bytes so far, from its first, as (chunk,
        # index where they begin); their total size; the stream offset of the first; and
        # the frame's size, once its length is in (else 0). Small chunks are gathered in
        # bytearrays of about _SMALL_PIECE bytes (see _add_piece).
        self._pieces: list[tuple[bytes | bytearray, int]] = []
        self._held = 0
        self._start = 0
        self._need = 0
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
        return self._start if self._pieces else self._consumed + self._pos

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet returned in a frame: 0 at a frame boundary."""
        return self._held if self._pieces else len(self._data) - self._pos

    def feed(self, data: Buffer) -> None:
        """Append ``data`` to the stream. The reader keeps ``bytes`` and copies the rest."""
        if self._failed is not None:
            raise self._failed
        if not _nbytes(data):
            return
        if self._pieces:
            self._add_piece(data)
            return
        rest = len(self._data) - self._pos
        if rest:  # what is left of the chunk held continues in this one
            self._pieces = [(self._data, self._pos)]
            self._held = rest
            self._start = self._consumed + self._pos
            self._need = 0
            self._add_piece(data)
            return
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._consumed += len(self._data)
        self._pos = 0
        self._data = chunk

    def skip(self, size: int) -> None:
        """Count ``size`` bytes of whole frames read elsewhere, at a frame boundary (none
        held): the next byte fed is at the stream offset after them."""
        if self.buffered or size < 0:
            raise ValueError(f"cannot skip {size} bytes with {self.buffered} held")
        self._consumed += self._pos + size
        self._data = b""
        self._pos = 0

    def _add_piece(self, data: Buffer) -> None:
        """Hold ``data`` as the cut frame's next piece: a ``bytes`` by reference, a copy
        of anything else. Small chunks go into a bytearray that gathers them (a piece for
        each would cost a hundred bytes of bookkeeping for every byte of a trickle)."""
        size = _nbytes(data)
        self._held += size
        if size >= _SMALL_PIECE:
            self._pieces.append((data if isinstance(data, bytes) else bytes(data), 0))
            return
        last = self._pieces[-1][0]
        if isinstance(last, bytearray) and len(last) < _SMALL_PIECE:
            last += data
        else:
            self._pieces.append((bytearray(data), 0))

    def next_frame(self) -> FlowFrame | None:
        """The next complete frame, or ``None`` if more bytes are needed."""
        if self._failed is not None:
            raise self._failed
        try:
            if self._pieces:
                return self._assembled_frame()
            return self._next_frame()
        except FlowError as exc:
            self._failed = exc
            raise

    def _check_length(self, length: int, start: int) -> int:
        """The frame's whole size (prefix + ``length``), once its length is found sound."""
        if length < MIN_FRAME_LENGTH:
            raise FrameLengthError(
                f"frame length {length} is below {MIN_FRAME_LENGTH} (no room for the token)",
                offset=start,
            )
        if length > self._max:
            raise FrameLengthError(
                f"frame length {length} exceeds the limit {self._max}", offset=start
            )
        return self._prefix + length

    def _next_frame(self) -> FlowFrame | None:
        """A frame inside the chunk held, sliced from it."""
        data, pos = self._data, self._pos
        available = len(data) - pos
        if available < _LENGTH.size:
            return None
        start = self._consumed + pos
        size = self._check_length(_LENGTH.unpack_from(data, pos)[0], start)
        if available < size:
            return None
        end = pos + size
        if self._checksum:
            _, expected, first, second = _HEADER.unpack_from(data, pos)
            with memoryview(data) as mv:
                actual = xxhash.xxh3_64_intdigest(mv[pos + _CHECKED_FROM : end])
            _check(expected, actual, start)
        else:
            _, first, second = _TLS_HEADER.unpack_from(data, pos)
        self._pos = end
        # The message's one copy: a slice of the chunk.
        message = data[pos + self._header : end]
        return FlowFrame(_token(first, second), memoryview(message), start)

    def _assembled_frame(self) -> FlowFrame | None:
        """The frame that begins the pieces, once all of it is in: its message joined."""
        pieces = self._pieces
        start = self._start
        if not self._need:
            if self._held < _LENGTH.size:
                return None
            (length,) = _LENGTH.unpack(_gather(_views(pieces, _LENGTH.size)[0], _LENGTH.size))
            self._need = self._check_length(length, start)
        need = self._need
        if self._held < need:
            return None
        views, used = _views(pieces, need)
        chunk, at = pieces[used - 1]
        at += views[-1].nbytes  # where the frame ends in the last chunk it touches
        header = _gather(views, self._header)
        message = b"".join(_skip(views, self._header))
        if self._checksum:
            _, expected, first, second = _HEADER.unpack(header)
            _check(expected, frame_checksum(header[_CHECKED_FROM:], message), start)
        else:
            _, first, second = _TLS_HEADER.unpack(header)
        rest = pieces[used:]
        if at < len(chunk):
            rest.insert(0, (chunk, at))
        self._held -= need
        self._start = start + need
        self._need = 0
        if len(rest) > 1:  # fed more than one chunk before asking for frames
            self._pieces = rest
        else:  # back to reading a chunk: the one the frame ended in, or the next
            self._pieces = []
            self._held = 0
            data, self._pos = rest[0] if rest else (b"", 0)
            if isinstance(data, bytearray):  # slices of the chunk read must be bytes
                data, self._pos = bytes(data[self._pos :]), 0
            self._data = data
            self._consumed = self._start - self._pos
        return FlowFrame(_token(first, second), memoryview(message), start)

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


def _check(expected: int, actual: int, start: int) -> None:
    if actual != expected:
        raise ChecksumError(
            f"frame checksum {expected:#018x} does not match its token and message "
            f"({actual:#018x})",
            offset=start,
        )


def _views(pieces: list[tuple[bytes | bytearray, int]], n: int) -> tuple[list[memoryview], int]:
    """Views of the first ``n`` bytes of ``pieces`` (all there), and how many pieces
    they touch."""
    out: list[memoryview] = []
    for i, (chunk, at) in enumerate(pieces):
        take = min(n, len(chunk) - at)
        out.append(memoryview(chunk)[at : at + take])
        n -= take
        if not n:
            return out, i + 1
    raise AssertionError("fewer bytes held than asked for")  # pragma: no cover


def _gather(pieces: list[memoryview], n: int) -> bytes:
    """The first ``n`` bytes of ``pieces`` (a header: a few bytes) as one ``bytes``."""
    out = bytearray()
    for piece in pieces:
        out += piece[: n - len(out)]
        if len(out) == n:
            break
    return bytes(out)


def _skip(pieces: list[memoryview], n: int) -> list[memoryview]:
    """``pieces`` without their first ``n`` bytes (views, nothing copied)."""
    for i, piece in enumerate(pieces):
        if n < len(piece):
            return [piece[n:], *pieces[i + 1 :]]
        n -= len(piece)
    return []
