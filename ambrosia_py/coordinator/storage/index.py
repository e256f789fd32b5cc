"""The sidecar index beside each log file: where records start, and when they were written.

``serverindex<N>`` pairs with ``serverlog<N>``. It is a hint for readers of the log
(the Spark data source splits a large log at indexed offsets and takes ``commit_time``
from it), never something recovery depends on: it is not fsynced, may lag, may be
missing (older logs, logs of the released AMBROSIA) or hold garbage after a power cut.
A reader must verify that a record with the entry's sequence id starts at an entry's
offset before trusting it.

Layout: the 8-byte magic :data:`INDEX_MAGIC`, then 32-byte entries, all little-endian:
``record offset u64 | sequence id i64 | wall-clock time i64 (ns since the epoch) |
check u64`` where the check is XXH64 of the first 24 bytes, so an entry of zeros or a
torn entry never reads as valid.

The writer (:class:`IndexWriter`, driven by :class:`.storage.LogWriter`) adds an entry
for the first record it writes to a file and then for a record once :data:`EVERY_BYTES` of log or
:data:`EVERY_NS` of time have passed since the last entry. So a record's own write time
is known exactly when it is indexed and otherwise lies less than :data:`EVERY_NS` after
the preceding entry's time. The entry is written *before* its record, so a reader that
sees a record already sees its entry. The cost on the commit path is one clock read and
two comparisons per record, plus one small ``write`` at most every 100 ms or 1 MiB.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import xxhash

from ... import wire
from .modes import create_private

__all__ = [
    "ENTRY_SIZE",
    "EVERY_BYTES",
    "EVERY_NS",
    "INDEX_MAGIC",
    "INDEX_PREFIX",
    "IndexEntry",
    "IndexWriter",
    "decode_index",
    "drop_index",
    "encode_entry",
    "index_path_for",
    "read_index",
    "trim_index",
]

log = logging.getLogger("ambrosia_py.coordinator")

INDEX_PREFIX = "serverindex"
INDEX_MAGIC = b"AMBIDX01"
EVERY_BYTES = 1024 * 1024
EVERY_NS = 100_000_000  # 100 ms
_ENTRY = struct.Struct("<QqqQ")
ENTRY_SIZE = _ENTRY.size  # 32
_PAYLOAD = struct.Struct("<Qqq")
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_LOG_NAME = re.compile(r"serverlog([1-9][0-9]*)")


@attrs.frozen
class IndexEntry:
    """A record of the log starts at ``offset`` with ``seq``; written at ``time_ns``."""

    offset: int
    seq: int
    time_ns: int


def index_path_for(log_path: Path) -> Path | None:
    """``serverindex<N>`` beside ``serverlog<N>``; ``None`` for a file not named so."""
    m = _LOG_NAME.fullmatch(log_path.name)
    return log_path.with_name(f"{INDEX_PREFIX}{m.group(1)}") if m else None


def encode_entry(entry: IndexEntry) -> bytes:
    """One entry, its check included."""
    head = _PAYLOAD.pack(entry.offset, entry.seq, entry.time_ns)
    return head + struct.pack("<Q", xxhash.xxh64_intdigest(head))


def decode_index(data: bytes) -> list[IndexEntry]:
    """The valid entries of an index file's bytes, by offset (the last one per offset wins).

    Bytes that are not an index (wrong magic) give no entries; entries failing their check,
    and a torn last entry, are skipped. Nothing here says a record starts where an entry
    claims: that is for the reader to verify.
    """
    if not data.startswith(INDEX_MAGIC):
        return []
    found: dict[int, IndexEntry] = {}
    for at in range(len(INDEX_MAGIC), len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        offset, seq, time_ns, check = _ENTRY.unpack_from(data, at)
        if xxhash.xxh64_intdigest(data[at : at + 24]) == check:
            found[offset] = IndexEntry(offset, seq, time_ns)
    return [found[k] for k in sorted(found)]


def read_index(log_path: Path) -> list[IndexEntry]:
    """The valid entries of the index beside ``log_path`` (none when it has no index)."""
    path = index_path_for(log_path)
    if path is None:
        return []
    try:
        return decode_index(path.read_bytes())
    except OSError:
        return []


def drop_index(log_path: Path) -> None:
    """Remove the sidecar index of ``log_path``, if it has one (its log is gone)."""
    index = index_path_for(log_path)
    if index is not None:
        index.unlink(missing_ok=True)


def trim_index(log_path: Path, cut: int) -> None:
    """Keep the entries of the sidecar index of ``log_path`` before offset ``cut``: the
    index is a hint readers verify, but a stale entry would pair a later record's offset
    with the time an earlier one was written. Not synced, and a failure leaves no index."""
    index = index_path_for(log_path)
    if index is None or not index.exists():
        return
    if cut == 0:
        drop_index(log_path)
        return
    kept = b"".join(encode_entry(e) for e in read_index(log_path) if e.offset < cut)
    try:
        fd = create_private(index, os.O_WRONLY | os.O_TRUNC)
        try:
            os.write(fd, INDEX_MAGIC + kept)
        finally:
            os.close(fd)
    except OSError:
        with contextlib.suppress(OSError):
            index.unlink()


def _header_seq(parts: Sequence[wire.Payload]) -> int | None:
    """The sequence id in the on-disk header that begins ``parts``, if they begin with one."""
    head = bytes(parts[0][: wire.HEADER_SIZE]) if parts else b""
    if len(head) < wire.HEADER_SIZE:
        head = b"".join(bytes(p) for p in parts)[: wire.HEADER_SIZE]
        if len(head) < wire.HEADER_SIZE:
            return None
    if _I32.unpack_from(head, 4)[0] >= 0:  # not a length in on-disk form: not a record
        return None
    return int(_I64.unpack_from(head, 16)[0])


class IndexWriter:
    """Appends entries to one log's index (see the module docstring for when).

    ``fresh`` starts the index anew (the log file was just created: whatever an index of
    the same name holds belongs to a log that is gone). A failure to write the index is
    logged once and turns the index off for this file; it never fails the log.
    """

    def __init__(
        self,
        path: Path,
        *,
        fresh: bool,
        every_bytes: int = EVERY_BYTES,
        every_ns: int = EVERY_NS,
    ) -> None:
        self.path = path
        self._every_bytes = every_bytes
        self._every_ns = every_ns
        self._last_offset = -every_bytes  # the first record is always indexed
        self._last_ns = 0
        self._fd: int | None = None
        try:
            flags = os.O_WRONLY | os.O_APPEND | (os.O_TRUNC if fresh else 0)
            self._fd = create_private(path, flags)
            if os.fstat(self._fd).st_size == 0 or not _has_magic(path):
                os.ftruncate(self._fd, 0)
                os.write(self._fd, INDEX_MAGIC)
        except OSError as exc:
            self._give_up(exc)

    def note(self, offset: int, parts: Sequence[wire.Payload]) -> None:
        """Called before the record in ``parts`` is written at ``offset``."""
        if self._fd is None:
            return
        now = time.monotonic_ns()
        if offset - self._last_offset < self._every_bytes and now - self._last_ns < self._every_ns:
            return
        seq = _header_seq(parts)
        if seq is None:
            return
        entry = encode_entry(IndexEntry(offset, seq, time.time_ns()))
        try:
            os.write(self._fd, entry)
        except OSError as exc:
            self._give_up(exc)
            return
        self._last_offset = offset
        self._last_ns = now

    def _give_up(self, exc: OSError) -> None:
        log.warning("log index %s is off for this log: %s", self.path, exc.strerror or exc)
        self.close()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            with contextlib.suppress(OSError):  # nothing of the log depends on it
                os.close(fd)


def _has_magic(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(len(INDEX_MAGIC)) == INDEX_MAGIC
