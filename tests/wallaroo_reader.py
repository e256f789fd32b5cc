"""The tests' reader of a connector protocol byte stream: bytes in any chunking, decoded
frames out, every error naming its stream offset.

The package's edges only cut a stream into frames (``codec.split_frames``) and the cores
decode each (``codec.decode_tagged``); this reader does both in a row, as a test's peer
reading what a worker or a connector wrote needs them. So what the tests read through it
is cut and decoded by the package's own code; the reader adds only the bookkeeping: the
stream offsets, and the stream ending inside a frame.

Errors come in stream order. :meth:`FrameReader.feed` raises a ``FrameTooLargeError`` at
once (seed 000, footnote B1: the body of a length over the limit is never held), yet the
complete frames before the bad length can still be read; iteration then raises the same
error. A malformed frame raises when iteration reaches it. Once an error is raised the
reader is failed: every later call raises it again, since the seed's answer is ERROR and
a close, never a resync.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

from immortals.wallaroo import (
    DEFAULT_MAX_FRAME_BYTES,
    DIALECTS,
    LENGTH_PREFIX_BYTES,
    Dialect,
    Frame,
    FrameTooLargeError,
    ProtocolError,
    TruncatedStreamError,
)
from immortals.wallaroo.codec import decode_tagged, split_frames

__all__ = ["FrameReader", "decode_all"]

_PREFIX = LENGTH_PREFIX_BYTES


class FrameReader:
    """Splits a connection's byte stream into decoded frames of one dialect.

    ``feed(data)`` as bytes arrive, then iterate (or call :meth:`next_frame`) for the
    complete frames; ``close()`` at the end of the stream. What is held is bounded: the
    complete frames not yet read, plus one partial frame of at most ``max_frame_bytes``
    and its prefix.
    """

    def __init__(
        self,
        dialect: Dialect | str = Dialect.DRAFT,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    ) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes {max_frame_bytes} must be at least 1 (a tag)")
        self.dialect = Dialect(dialect)
        self.max_frame_bytes = max_frame_bytes
        self._order = DIALECTS[self.dialect].byte_order
        self._partial = bytearray()  # the bytes after the last complete frame
        self._cut = 0  # the stream offset of _partial[0]
        self._frames: collections.deque[tuple[int, bytes]] = collections.deque()
        """Complete frames not yet read: (stream offset of the tag, tag and body)."""
        self._error: ProtocolError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received and not yet handed out as frames."""
        return len(self._partial) + sum(_PREFIX + len(raw) for _, raw in self._frames)

    @property
    def offset(self) -> int:
        """The stream offset of the next frame to hand out (bytes consumed so far)."""
        return self._frames[0][0] - _PREFIX if self._frames else self._cut

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Take the next bytes of the stream.

        Raises ``FrameTooLargeError`` for a length over the maximum (the frames before it
        stay readable), or the error the reader already failed with.
        """
        if self._error is not None:
            raise self._error
        self._partial += data
        frames, used, oversize = split_frames(self._partial, self._order, self.max_frame_bytes)
        at = self._cut
        for raw in frames:
            self._frames.append((at + _PREFIX, raw))
            at += _PREFIX + len(raw)
        del self._partial[:used]
        self._cut += used
        if oversize is not None:
            self._partial.clear()  # the bad length and all after it: its body is never held
            self._error = FrameTooLargeError(
                self.dialect.value, self._cut, oversize[1], self.max_frame_bytes
            )
            raise self._error

    def next_frame(self) -> Frame | None:
        """The next complete frame, or None until more bytes are fed.

        Raises the ``ProtocolError`` of a malformed frame (and, once the frames before it
        are read, of an oversize length or a stream that ended inside a frame).
        """
        if not self._frames:
            if self._error is not None:
                raise self._error
            return None
        at, raw = self._frames.popleft()
        try:
            return decode_tagged(raw, self.dialect, at)
        except ProtocolError as err:
            self._error = err
            self._frames.clear()
            self._partial.clear()
            raise

    def __iter__(self) -> Iterator[Frame]:
        """The complete frames buffered now, in order."""
        while (frame := self.next_frame()) is not None:
            yield frame

    def close(self) -> None:
        """The stream has ended: raise ``TruncatedStreamError`` if it ended inside a
        frame, naming the offset of the partial frame and how many of its bytes arrived.
        Complete frames not yet read stay readable."""
        if self._error is not None:
            raise self._error
        left = len(self._partial)
        if not left:
            return
        declared = None
        if left >= _PREFIX:
            declared = _PREFIX + int.from_bytes(self._partial[:_PREFIX], self._order)
        self._partial.clear()
        self._error = TruncatedStreamError(self.dialect.value, self._cut, left, declared, _PREFIX)
        raise self._error


def decode_all(wire: bytes, dialect: Dialect) -> list[Frame]:
    """Every frame of ``wire``, which must end at a frame's end."""
    reader = FrameReader(dialect)
    reader.feed(wire)
    frames = list(reader)
    reader.close()
    return frames
