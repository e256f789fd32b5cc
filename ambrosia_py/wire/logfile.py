"""Where the records of a log file end: the released form at rest, the live tail in use.

A log at rest has the released on-disk form (reference ambrosia.md, *Files on disk*):
records back to back, the file ending with the last one. A log that a coordinator is
writing is *preallocated*, so that a commit's ``fdatasync`` overwrites space the file
already has instead of growing it (no journal commit of the file's size on every sync:
see ``docs/performance.md``). Its *live tail* (written by
:class:`ambrosia_py.coordinator.storage.files.LogWriter`) is:

* :data:`END_MARKER` right after the last record: every write carries its records and
  then the marker, and the next write starts over it;
* zeros (space allocated and never written) up to
* :data:`TRAILER`, the file's last 24 bytes, which says the file has a live tail. When
  the writer grows the file it writes the new trailer first and syncs it with the new
  size, then zeros the old one, so a crash leaves a trailer at the end (and at most one
  old trailer, after the data).

The writer truncates the file to its last record when it closes it; recovery does the
same when it cuts a torn tail or finds a live one. Neither constant can be taken for
the start of a record (bytes 4-7, a record's length field, read as a positive number:
on disk a record's is negative) and neither holds a zero byte.

:func:`data_end` finds where a file's records end; a reader then reads the bytes before
that exactly as it reads a log at rest, where a record cut short by the end is a torn
tail. For a file with a live tail, the trailer and the zeros before it (and an old
trailer between zeros) are dropped; then:

* the bytes end with the whole marker: the last write finished, and the records end
  where the marker starts;
* they end with the first k bytes of the marker: the last write was cut in its marker,
  after its records were whole; they end before those k bytes;
* they end with the last 24-j bytes of the marker, 24 bytes after a record boundary:
  the last write was cut after its first j bytes, over the marker of the write before,
  whose rest is still there. The reader that finds the boundary tells it
  (:func:`cut_over_marker`) and cuts those 24 bytes as a torn tail;
* otherwise the last write was cut in its records: they end at the last non-zero byte,
  and the record there reads as cut short. A record's last byte on disk is zero (its
  trim watermarks end in a zero count or in the high byte of a sequence id; only a
  Checkpoint's blob, which coordinators do not log, may follow them), so even a record
  written whole whose marker is missing reads as cut: its write never finished, so it
  was never synced, acknowledged or forwarded.

A reader may run beside the writer (``replay`` or ``analyze`` on a live instance, or
just after a crash of the binding while its coordinator closes the log). The writer's
close truncates the file, and a growth zeros the old trailer, between two of the
reader's reads: :func:`settled_data_end` reads the end again until the file held still
while it looked, so a reader never takes a record cut by the truncation for a torn
write.

Sans-IO: the caller passes how to read the file (``pread(size, offset)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

__all__ = [
    "END_MARKER",
    "TRAILER",
    "FileMovedError",
    "cut_over_marker",
    "data_end",
    "has_live_tail",
    "settled_data_end",
]

END_MARKER: Final = b"#ambrosia-py: end of log"
TRAILER: Final = b"@ambrosia-py: free space"
_SIZE = 24
_PROBE = 64 * 1024  # bytes read per step while skipping zeros backwards

_SETTLE_TRIES = 8  # a writer truncates once, at close, and grows rarely: this is plenty

Pread = Callable[[int, int], bytes]  # (size, offset) -> bytes, short at the end


class FileMovedError(Exception):
    """The file kept changing size while its end was read (:func:`settled_data_end`)."""


def has_live_tail(pread: Pread, size: int) -> bool:
    """Whether the file (``size`` bytes) ends with :data:`TRAILER`."""
    return size >= _SIZE and pread(_SIZE, size - _SIZE) == TRAILER


def data_end(pread: Pread, size: int) -> int:
    """Where the records of a log file of ``size`` bytes end (see the module docstring)."""
    if not has_live_tail(pread, size):
        return size
    end = _skip_zeros(pread, size - _SIZE)
    while end >= _SIZE and pread(_SIZE, end - _SIZE) == TRAILER:
        end = _skip_zeros(pread, end - _SIZE)  # an old trailer the writer had not zeroed
    last = pread(min(end, _SIZE), max(0, end - _SIZE))
    if last == END_MARKER:
        return end - _SIZE
    for k in range(min(len(last), _SIZE - 1), 0, -1):
        if last.endswith(END_MARKER[:k]):
            return end - k
    return end


def settled_data_end(pread: Pread, size: Callable[[], int]) -> tuple[int, int]:
    """:func:`data_end` and the file size it holds for, read while the file held still.

    A read that comes back short inside the size just taken, or a size that differs
    after the look, means the writer truncated or grew the file meanwhile: look again.
    :class:`FileMovedError` if it never held still in a few tries.
    """
    for _ in range(_SETTLE_TRIES):
        before = size()
        end, held = _look(pread, before)
        if held and size() == before:
            return end, before
    raise FileMovedError(f"the file changed size {_SETTLE_TRIES} times while it was read")


def _look(pread: Pread, size: int) -> tuple[int, bool]:
    """:func:`data_end` for ``size`` bytes, and whether every read inside them was whole."""
    whole = True

    def exact(n: int, at: int) -> bytes:
        nonlocal whole
        got = pread(n, at)
        if len(got) < min(n, max(0, size - at)):
            whole = False
        return got

    return data_end(exact, size), whole


def cut_over_marker(head: bytes) -> int | None:
    """If ``head``, the last 24 bytes before :func:`data_end` and starting at a record
    boundary, is the first j bytes of a write cut short over the end marker of the write
    before it (the rest of that marker still there), then j (1-23); otherwise None. Such a
    write held no whole record: the records end at the boundary."""
    if len(head) != _SIZE:
        return None
    for j in range(1, _SIZE):
        if head[j:] == END_MARKER[j:]:
            return j
    return None


def _skip_zeros(pread: Pread, end: int) -> int:
    """The offset after the last non-zero byte before ``end`` (0 if there is none)."""
    while end > 0:
        start = max(0, end - _PROBE)
        piece = pread(end - start, start)
        stripped = piece.rstrip(b"\0")
        if stripped:
            return start + len(stripped)
        end = start
    return 0
