"""What both incremental readers share: the input buffer they take units out of, and
their size limits (:mod:`.reader` reads log records, :mod:`.message_reader` bare
messages). Sans-IO."""

from __future__ import annotations

from .messages import Buffer
from .records import DEFAULT_MAX_RECORD_SIZE

__all__ = ["DEFAULT_MAX_CHECKPOINT_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "InputBuffer"]

DEFAULT_MAX_CHECKPOINT_SIZE = 1 << 40
DEFAULT_MAX_MESSAGE_SIZE = DEFAULT_MAX_RECORD_SIZE


_HAND_OVER = 64 * 1024  # records at least this large are never copied out


class InputBuffer:
    """An input buffer with a read position.

    Copies are what limit throughput for large records, so the buffer avoids them: a
    ``bytes`` chunk fed while nothing is buffered is kept by reference, and records are
    handed out as views of it; a large record assembled from several chunks is handed
    out as a view of the assembly buffer, which is then replaced (only the bytes after the
    record are copied). Small records are copied out, which keeps memory compact. A small
    remainder cut by a chunk boundary is joined to the next chunk as ``bytes`` (one copy of
    the chunk) rather than assembled in a ``bytearray``: small messages are then sliced
    from ``bytes``, the cheapest way to take them out.
    """

    __slots__ = ("consumed", "data", "pos")

    def __init__(self) -> None:
        self.data: bytes | bytearray = b""
        self.pos = 0
        self.consumed = 0  # stream offset of data[0]

    def feed(self, chunk: Buffer) -> None:
        if not len(chunk):
            return
        if self.pos >= len(self.data):
            # Nothing buffered: keep an immutable chunk as it is.
            self.consumed += len(self.data)
            self.pos = 0
            self.data = chunk if isinstance(chunk, bytes) else bytes(chunk)
            return
        if isinstance(self.data, bytes) and len(self.data) - self.pos < _HAND_OVER:
            # A small remainder (a message cut by the chunk boundary): join it to the new
            # chunk as ``bytes``, whose slices are the cheapest copies to take from.
            self.data = self.data[self.pos :] + bytes(chunk)
            self.consumed += self.pos
            self.pos = 0
            return
        if isinstance(self.data, bytes):
            with memoryview(self.data) as mv:
                self.data = bytearray(mv[self.pos :])
            self.consumed += self.pos
            self.pos = 0
        elif self.pos and self.pos * 2 >= len(self.data):
            del self.data[: self.pos]
            self.consumed += self.pos
            self.pos = 0
        self.data += chunk

    @property
    def available(self) -> int:
        return len(self.data) - self.pos

    @property
    def offset(self) -> int:
        """Stream offset of the read position."""
        return self.consumed + self.pos

    def take(self, n: int) -> bytes | memoryview:
        """The next ``n`` bytes, as a copy or a view that no later feed can change."""
        start = self.pos
        self.pos += n
        data = self.data
        if isinstance(data, bytes):
            return (
                memoryview(data)[start : start + n] if n >= _HAND_OVER else data[start : start + n]
            )
        rest = len(data) - self.pos
        if n >= _HAND_OVER and rest < n:
            # Hand the assembly buffer over (it is never resized again) and keep the rest.
            with memoryview(data) as mv:
                self.data = bytearray(mv[self.pos :])
            self.consumed += self.pos
            self.pos = 0
            return memoryview(data)[start : start + n]
        with memoryview(data) as mv:
            return bytes(mv[start : start + n])
