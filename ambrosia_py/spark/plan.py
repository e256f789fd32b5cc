"""Planning a read: which byte ranges of which logs, split at verified index entries.

A log with a sidecar index (``serverindex<N>``, :mod:`ambrosia_py.coordinator.storage.index`)
is split at indexed offsets about every ``split_bytes``; an entry is used only if a valid
record with the entry's seq starts at its offset. A log without one is one piece. Small
pieces are then packed together, so a data dir of many small logs is not one Spark task
per file.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from ..coordinator.storage.index import INDEX_PREFIX, IndexEntry, decode_index
from ..wire import scanner
from .layout import LogFile
from .scan import Neighbour, Span

__all__ = ["DEFAULT_SPLIT_BYTES", "Piece", "pack", "pieces_of", "plan"]

DEFAULT_SPLIT_BYTES = 64 << 20
_ENTRIES_BEFORE = 3  # index entries kept before a piece's start, for its first commit_time


@attrs.frozen
class Piece:
    """A byte range of one log, with the index entries that may give its commit times."""

    log: LogFile
    span: Span
    entries: tuple[IndexEntry, ...] = ()

    @property
    def size(self) -> int:
        return self.span.end - self.span.start


def _entries_for(entries: Sequence[IndexEntry], span: Span) -> tuple[IndexEntry, ...]:
    before = [e for e in entries if e.offset < span.start][-_ENTRIES_BEFORE:]
    inside = [e for e in entries if span.start <= e.offset < span.end]
    return (*before, *inside)


def index_of(log: LogFile) -> list[IndexEntry]:
    """The valid entries of the sidecar index beside ``log`` (none without one), read
    through its file system (:func:`ambrosia_py.coordinator.storage.index.decode_index`)."""
    if log.number == 0:
        return []
    data = log.location.sibling(f"{INDEX_PREFIX}{log.number}").read_bytes()
    return [] if data is None else decode_index(data)


def pieces_of(log: LogFile, start: int, end: int, *, final: bool, split_bytes: int) -> list[Piece]:
    """``[start, end)`` of ``log`` as pieces split at verified index entries.

    A split point is an entry at which a valid record (:func:`ambrosia_py.wire.scanner.record_at`)
    with the entry's seq and the committer id of the log's first record starts; the pieces
    around it know that record (their neighbour check, :mod:`.scan`). ``final``: ``end`` is
    where the log ends, and it is the newest of its instance version (where a crash may
    have cut a write: a torn tail).
    """
    if end <= start:
        return []
    entries = index_of(log)
    points: list[tuple[int, int]] = []  # (offset, seq) of each verified split point
    with log.location.open() as src:
        bytes_ = scanner.LogBytes(src.pread, end)
        first = scanner.record_at(bytes_, 0) if entries else None
        last = start
        for e in entries:
            if first is None or e.offset - last < split_bytes or e.offset >= end:
                continue
            header = scanner.record_at(bytes_, e.offset)
            if header is not None and (header.seq, header.committer_id) == (
                e.seq,
                first.committer_id,
            ):
                points.append((e.offset, e.seq))
                last = e.offset
    out = []
    bounds: list[tuple[int, int | None]] = [(start, None), *points, (end, None)]
    for (a, a_seq), (b, b_seq) in itertools.pairwise(bounds):
        assert first is not None or (a_seq is None and b_seq is None)
        span = Span(
            a,
            b,
            final=final and b == end,
            before=None
            if a_seq is None or first is None
            else Neighbour(first.committer_id, a_seq - 1),
            after=None if b_seq is None or first is None else Neighbour(first.committer_id, b_seq),
        )
        out.append(Piece(log, span, _entries_for(entries, span)))
    return out


def plan(logs: Sequence[LogFile], split_bytes: int = DEFAULT_SPLIT_BYTES) -> list[Piece]:
    """Every log of ``logs`` from its start to its present end, split."""
    out: list[Piece] = []
    for log in logs:
        size = log.location.data_size()
        out += pieces_of(log, 0, size, final=log.last, split_bytes=split_bytes)
    return out


def pack(pieces: Sequence[Piece], split_bytes: int) -> list[list[Piece]]:
    """Consecutive pieces grouped into partitions of about ``split_bytes``."""
    groups: list[list[Piece]] = []
    size = 0
    for piece in pieces:
        if not groups or size + piece.size > split_bytes:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece.size
    return groups
