"""The incremental, sans-IO frame reader: bytes in any chunking, frames out.

Owns the framing rules of seed 000 (*Wire Format*): a u32 length in the dialect's byte
order counts the tag and body after it, and a length over the reader's maximum is
refused as soon as its four bytes arrive, before any of its body is kept (footnote B1;
the reference answers it with ERROR and a close). Nothing here touches a socket.

Errors come in stream order. :meth:`FrameReader.feed` raises a
:class:`~.errors.FrameTooLargeError` at once, yet the complete frames before the bad
length can still be read; iteration then raises the same error. A malformed frame raises
when iteration reaches it. Once an error is raised the reader is failed: every later
call raises it again, since the seed's answer is ERROR and a close, never resync.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from .codec import DEFAULT_MAX_FRAME_BYTES, DIALECTS, LENGTH_PREFIX_BYTES, Dialect, decode_tagged
from .errors import FrameTooLargeError, ProtocolError, TruncatedStreamError
from .frames import Frame

__all__ = ["FrameReader"]


class FrameReader:
    """Splits a connection's byte stream into decoded frames of one dialect.

    ``feed(data)`` as bytes arrive, then iterate (or call :meth:`next_frame`) for the
    complete frames; ``close()`` at end of stream. What is held is bounded: at most the
    complete frames not yet read, plus one partial frame of at most ``max_frame_bytes``
    and its prefix.
    """

    __slots__ = ("_boundary", "_buf", "_dialect", "_error", "_length", "_max", "_offset", "_pos")

    def __init__(
        self,
        dialect: Dialect | str = Dialect.DRAFT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes {max_frame_bytes} must be at least 1 (a tag)")
        self._dialect = Dialect(dialect)
        order = "<" if DIALECTS[self._dialect].byte_order == "little" else ">"
        self._length = struct.Struct(f"{order}I")
        self._max = max_frame_bytes
        self._buf = bytearray()
        self._pos = 0  # start of the next frame to hand out
        self._boundary = 0  # end of the complete frames; _pos <= _boundary <= len(_buf)
        self._offset = 0  # stream offset of _buf[0]
        self._error: ProtocolError | None = None

    @property
    def dialect(self) -> Dialect:
        return self._dialect

    @property
    def max_frame_bytes(self) -> int:
        return self._max

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as frames."""
        return len(self._buf) - self._pos

    @property
    def offset(self) -> int:
        """Stream offset of the next frame to hand out (bytes consumed so far)."""
        return self._offset + self._pos

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the stream.

        Raises :class:`~.errors.FrameTooLargeError` for a length over the maximum (the
        frames before it stay readable), or the error the reader already failed with.
        """
        if self._error is not None:
            raise self._error
        if self._pos:  # drop what was handed out, once per feed
            del self._buf[: self._pos]
            self._offset += self._pos
            self._boundary -= self._pos
            self._pos = 0
        self._buf += data
        self._scan()

    def _scan(self) -> None:
        buf, at = self._buf, self._boundary
        prefix = LENGTH_PREFIX_BYTES
        while len(buf) - at >= prefix:
            (size,) = self._length.unpack_from(buf, at)
            if size > self._max:
                # Drop the bad length and all after it: the body is never held.
                del buf[at:]
                self._boundary = at
                self._error = FrameTooLargeError(
                    self._dialect.value, self._offset + at, size, self._max
                )
                raise self._error
            if len(buf) - at - prefix < size:
                break
            at += prefix + size
        self._boundary = at

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes are fed.

        Raises the :class:`~.errors.ProtocolError` of a malformed frame (and, once the
        frames before it are read, of an oversize length).
        """
        if self._pos >= self._boundary:
            if self._error is not None:
                raise self._error
            return None
        (size,) = self._length.unpack_from(self._buf, self._pos)
        start = self._pos + LENGTH_PREFIX_BYTES
        data = bytes(self._buf[start : start + size])
        try:
            frame = decode_tagged(data, self._dialect, self._offset + start)
        except ProtocolError as err:
            self._fail(err)
            raise
        self._pos = start + size
        return frame

    def __iter__(self) -> Iterator[Frame]:
        """The complete frames buffered now, in order."""
        while (frame := self.next_frame()) is not None:
            yield frame

    def close(self) -> None:
        """The stream has ended: raise if it ended inside a frame.

        :class:`~.errors.TruncatedStreamError` names the offset of the partial frame and
        how many of its bytes arrived. Complete frames not yet read stay readable.
        """
        if self._error is not None:
            raise self._error
        left = len(self._buf) - self._boundary
        if not left:
            return
        at = self._boundary
        declared = None
        if left >= LENGTH_PREFIX_BYTES:
            declared = LENGTH_PREFIX_BYTES + self._length.unpack_from(self._buf, at)[0]
        del self._buf[at:]
        self._error = TruncatedStreamError(
            self._dialect.value, self._offset + at, left, declared, LENGTH_PREFIX_BYTES
        )
        raise self._error

    def _fail(self, err: ProtocolError) -> None:
        self._error = err
        self._buf = bytearray()
        self._pos = self._boundary = 0
