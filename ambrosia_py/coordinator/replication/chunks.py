"""A checkpoint sent in chunks (CHECKPOINT from a primary, TAKEN from a secondary): cut
into pieces on the sending side, gathered on the receiving one, in whatever order and
as often as they arrive, until every byte is in."""

from __future__ import annotations

from collections.abc import Iterator

from .messages import Buffer

__all__ = ["ChunkTransfer", "checkpoint_pieces"]


def checkpoint_pieces(data: Buffer, size: int) -> Iterator[tuple[int, memoryview]]:
    """A checkpoint's bytes cut for CHECKPOINT or TAKEN chunks of at most ``size`` bytes:
    ``(offset, piece)``, views of ``data``; one empty piece for an empty checkpoint."""
    view = memoryview(data)
    for offset in range(0, max(len(view), 1), size):
        yield offset, view[offset : offset + size]


class ChunkTransfer:
    """The byte ranges of one checkpoint (``key``: epoch, seq, total) come in so far."""

    def __init__(self, key: tuple[int, int, int]) -> None:
        self.key = key
        self.ranges: list[tuple[int, int]] = []  # disjoint, sorted, not touching

    def _merged(self, start: int, end: int) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for a, b in self.ranges:
            if b < start or a > end:
                out.append((a, b))
            else:
                start, end = min(a, start), max(b, end)
        out.append((start, end))
        out.sort()
        return out

    def missing_after(self, offset: int, size: int) -> int:
        """The bytes still missing once ``offset .. offset + size`` is in."""
        ranges = self._merged(offset, offset + size) if size else self.ranges
        return self.key[2] - sum(b - a for a, b in ranges)

    def add(self, offset: int, size: int) -> bool:
        """Take the range in; whether it brought any byte (or is the empty checkpoint)."""
        before = sum(b - a for a, b in self.ranges)
        if size:
            self.ranges = self._merged(offset, offset + size)
        return size == 0 or sum(b - a for a, b in self.ranges) > before
