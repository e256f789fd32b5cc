"""The coordinator's files on disk: logs, checkpoints and the instance lock.

One instance version lives in ``<data dir>/<instance>_<version>/`` (reference ambrosia.md,
Files on disk): log files ``serverlog<N>``, checkpoints ``serverchkpt<N>`` (N from 1;
checkpoint N is the state at the start of log N, so recovering from it needs logs N, N+1,
...) and the lock file ``serverkillFile``, which a running coordinator holds with
``flock`` and which names its pid. Logs are written with ``pwritev`` + ``fdatasync``
into space preallocated ahead of the records, and truncated to their last record when
closed (the live tail, :mod:`ambrosia_py.wire.logfile`); checkpoints are written to a
temporary file and renamed into place, so a reader only ever sees a whole checkpoint.
Beside each log the writer keeps a sidecar index ``serverindex<N>`` (:mod:`.index`):
a hint for readers, never read by recovery.
Every file is created 0600 and the directory 0700 (:mod:`.modes`):
logs hold call arguments, checkpoints whole states.

Scanning a log (:meth:`InstanceFiles.scan_log`) is :mod:`.scan`'s job: it verifies every
record and tells a torn tail from corruption. The errors live in :mod:`.errors`; this
module re-exports them and the scan's names, so importers need only this one.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import tempfile
import threading
from collections.abc import Sequence
from itertools import islice
from pathlib import Path

from ... import crashpoints
from ...iov import IOV_MAX, advance, nbytes, unsent
from ...wire import logfile
from .errors import CorruptLogError, InstanceLockedError, StorageError
from .index import EVERY_BYTES, INDEX_PREFIX, IndexWriter, drop_index, index_path_for
from .modes import PRIVATE_FILE, create_private, fsync_dir, make_private_dir
from .scan import LogScan, TailDamage, records_end

__all__ = [
    "CHECKPOINT_PREFIX",
    "LOCK_FILE",
    "LOG_PREFIX",
    "CorruptLogError",
    "InstanceFiles",
    "InstanceLockedError",
    "LogScan",
    "LogWriter",
    "PREALLOCATE_BYTES",
    "REPLICA_STATE_FILE",
    "StorageError",
    "TailDamage",
    "log_bytes_in",
    "log_data_size",
    "log_number",
    "log_numbers_in",
    "write_atomically",
]

LOG_PREFIX = "serverlog"
CHECKPOINT_PREFIX = "serverchkpt"
LOCK_FILE = "serverkillFile"
# A replica's epoch, history and checkpoint number (replica_state.py), and a checkpoint
# coming in from another replica (replicas/node.py), kept until installed.
REPLICA_STATE_FILE = "replica-state"
INCOMING_PREFIX = ".incoming."
_LOG_NAME = re.compile(rf"{LOG_PREFIX}([1-9][0-9]*)")
_CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}([1-9][0-9]*)")


# How far ahead of its records a log is allocated, at the least. Writing into space the
# file already has, ``fdatasync`` need not commit a new file size to the journal, so a
# small record's sync, two of which an awaited round trip waits for, is cheaper on ext4
# (docs/performance.md, *What the design does for speed*). Each step costs a sync of its
# own (LogWriter._make_room): a small step makes a coordinator whose writes fall behind
# its input hold more memory; at 8 MiB it holds about what it does without preallocation.
PREALLOCATE_BYTES = 8 << 20
_CAN_PREALLOCATE = hasattr(os, "posix_fallocate")
_ZEROS = bytes(len(logfile.TRAILER))


def _write_all(fd: int, parts: Sequence[bytes | bytearray | memoryview], at: int) -> int:
    """Write every part at offset ``at`` with ``pwritev``, resuming after short writes;
    return the count."""
    total = 0
    if len(parts) <= IOV_MAX:  # the usual case, one pwritev that takes it all
        size = nbytes(parts)
        total = os.pwritev(fd, parts, at)
        if total == size:
            return total
    queue = unsent(parts, total)
    while queue:
        written = os.pwritev(fd, list(islice(queue, IOV_MAX)), at + total)
        total += written
        advance(queue, written)  # a short write leaves a part half done
    return total


class LogWriter:
    """Appends records to one log file; :meth:`append` returns once they are durable.

    Blocking by design: the coordinator calls it from a worker thread. A lock makes
    concurrent calls safe, though the coordinator makes one at a time. After a failed
    write the file may end in a partial record, so the writer refuses further appends
    (recovery will cut the partial record as a torn tail).

    The file is preallocated ahead of the records (``preallocate``: at least that many
    bytes at a time; 0, or a platform without ``posix_fallocate``, appends as the released
    coordinator does): every write ends with the end marker, and the file with the
    trailer (:mod:`ambrosia_py.wire.logfile`). :meth:`close` truncates it to its last
    record. ``size`` is where the records end, and where the next write goes.
    """

    def __init__(
        self,
        path: Path,
        *,
        index_every_bytes: int = EVERY_BYTES,
        preallocate: int = PREALLOCATE_BYTES,
    ) -> None:
        self.path = path
        existed = path.exists()
        try:
            self._fd: int | None = create_private(path, os.O_RDWR)
        except OSError as exc:
            raise StorageError(f"cannot open log {path}: {exc.strerror}") from exc
        fd = self._fd
        self.size, on_disk = records_end(fd)
        if on_disk > self.size:  # a live tail a crash left: cut, as close() would have
            os.ftruncate(fd, self.size)
        self._step = preallocate if _CAN_PREALLOCATE else 0
        self._trailer_at: int | None = None  # where the trailer lies; writes end before it
        self._lock = threading.Lock()
        self._broken: str | None = None
        if not existed:
            # The new directory entry must survive a crash too, not just the data.
            fsync_dir(path.parent)
        # The sidecar index (logindex.py): a hint for readers, never needed for recovery.
        index = index_path_for(path) if index_every_bytes else None
        self._index = (
            IndexWriter(index, fresh=self.size == 0, every_bytes=index_every_bytes)
            if index is not None
            else None
        )

    def append(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``parts`` at the end of the file and ``fdatasync`` it."""
        self.write(parts)
        self.sync()

    def write(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``parts`` at the end of the file, not yet durable (see :meth:`sync`)."""
        with self._lock:
            fd = self._usable()
            crashpoints.reach("ic.log.before_write")
            if self._index is not None:
                self._index.note(self.size, parts)
            size = nbytes(parts)
            try:
                if self._step:
                    self._make_room(fd, self.size + size + len(logfile.END_MARKER))
                    parts = [*parts, logfile.END_MARKER]
                crashpoints.reach_midway("ic.log.mid_write", (fd, self.size), parts)
                _write_all(fd, parts, self.size)
            except OSError as exc:
                self._broken = exc.strerror or str(exc)
                raise StorageError(f"cannot append to log {self.path}: {self._broken}") from exc
            self.size += size

    def _make_room(self, fd: int, end: int) -> None:
        """Grow the file, if it must, so a write can end at ``end`` before the trailer.

        The new trailer goes first, made durable with the file's new size (a file that
        grew without it would read as a log at rest, its zeros as damage), and the old
        one is zeroed after: a crash in between leaves a trailer at the end of the file,
        which is what says it has a live tail (readers skip an old trailer between
        zeros). Then the space is allocated; where the file system cannot, it stays a
        hole, which reads as zeros too. One sync more per step: per 8,192 records of
        1 KiB, per 128 of 64 KiB.
        """
        if self._trailer_at is not None and end <= self._trailer_at:
            return
        if self._trailer_at is None and self.size:
            # A file written before (a log at rest, reopened): its records need the end
            # marker behind them, durable, before a trailer makes the file read as live,
            # or the last of them would read as cut short.
            os.pwrite(fd, logfile.END_MARKER, self.size)
            os.fdatasync(fd)
        trailer = len(logfile.TRAILER)
        grown = -(-(end + trailer) // self._step) * self._step
        os.pwrite(fd, logfile.TRAILER, grown - trailer)
        os.fdatasync(fd)
        if self._trailer_at is not None:
            os.pwrite(fd, _ZEROS, self._trailer_at)
        self._trailer_at = grown - trailer
        try:
            os.posix_fallocate(fd, self.size, self._trailer_at - self.size)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise

    def sync(self) -> None:
        """``fdatasync``: everything written before this call is durable when it returns.

        Runs without the write lock, so the next record can be written meanwhile (the
        commit pipeline); a record written during the call waits for the next sync.
        """
        fd = self._usable()
        crashpoints.reach("ic.log.before_sync")
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self._broken = exc.strerror or str(exc)
            raise StorageError(f"cannot sync log {self.path}: {self._broken}") from exc
        crashpoints.reach("ic.log.after_sync")

    def _usable(self) -> int:
        if self._fd is None:
            raise StorageError(f"log {self.path} is closed")
        if self._broken is not None:
            raise StorageError(
                f"log {self.path} failed earlier ({self._broken}); no further appends"
            )
        return self._fd

    def close(self) -> None:
        """Truncate the file to its last record and close it (idempotent).

        The truncation is not synced: until it is durable, the live tail it removes still
        reads the same (:mod:`ambrosia_py.wire.logfile`).
        """
        with self._lock:
            if self._index is not None:
                self._index.close()
            if self._fd is not None:
                if self._trailer_at is not None:
                    with contextlib.suppress(OSError):  # the live tail reads the same
                        os.ftruncate(self._fd, self.size)
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class InstanceFiles:
    """The directory of one instance version and the files in it."""

    def __init__(self, data_dir: Path, instance: str, version: int) -> None:
        if not instance or "/" in instance or instance in (".", ".."):
            raise StorageError(f"instance name {instance!r} cannot name a directory")
        self.data_dir = Path(data_dir)
        self.instance = instance
        self.version = version
        self.path = self.data_dir / f"{instance}_{version}"
        self._lock_fd: int | None = None

    def __repr__(self) -> str:
        return f"InstanceFiles({str(self.path)!r})"

    def create(self) -> None:
        """Create the directory (and its parents), 0700, and make its entry durable."""
        make_private_dir(self.path)

    def owned_paths(self) -> list[Path]:
        """The directory and every file in it the coordinator writes (for :func:`.modes.tighten`):
        logs, checkpoints and their temporary files, the lock, kept torn tails, log indexes,
        a replica's state and a checkpoint coming in."""
        try:
            names = os.listdir(self.path)
        except FileNotFoundError:
            return []
        ours = (
            LOG_PREFIX,
            CHECKPOINT_PREFIX,
            LOCK_FILE,
            f".{CHECKPOINT_PREFIX}",
            REPLICA_STATE_FILE,
            f".{REPLICA_STATE_FILE}",
            INCOMING_PREFIX,
        )
        names.sort()
        # Sidecar indexes last: a report of loose modes names the logs and checkpoints first.
        return [
            self.path,
            *(self.path / n for n in names if n.startswith(ours)),
            *(self.path / n for n in names if n.startswith(INDEX_PREFIX)),
        ]

    # --- the lock ----------------------------------------------------------------------

    @property
    def lock_path(self) -> Path:
        return self.path / LOCK_FILE

    @property
    def locked(self) -> bool:
        """Whether this object holds the lock."""
        return self._lock_fd is not None

    def acquire_lock(self) -> None:
        """Take the instance version's lock, or raise :class:`InstanceLockedError`.

        The lock is an ``flock`` on ``serverkillFile``; the kernel drops it when the
        holder dies, however it dies. The holder's pid is written into the file so the
        error can name it.
        """
        if self._lock_fd is not None:
            return
        try:
            fd = create_private(self.lock_path, os.O_RDWR)
        except OSError as exc:
            raise StorageError(f"cannot open lock file {self.lock_path}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise InstanceLockedError(
                    self.instance, self.version, self._holder_pid(), self.lock_path
                ) from None
            raise StorageError(f"cannot lock {self.lock_path}: {exc.strerror}") from exc
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        os.fsync(fd)
        self._lock_fd = fd

    def _holder_pid(self) -> int | None:
        try:
            text = self.lock_path.read_text(encoding="ascii", errors="replace").strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def release_lock(self) -> None:
        """Give the lock up (idempotent); the pid is cleared first."""
        fd = self._lock_fd
        if fd is None:
            return
        self._lock_fd = None
        try:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    # --- names -------------------------------------------------------------------------

    def log_path(self, n: int) -> Path:
        return self.path / f"{LOG_PREFIX}{_positive(n)}"

    def checkpoint_path(self, n: int) -> Path:
        return self.path / f"{CHECKPOINT_PREFIX}{_positive(n)}"

    def log_numbers(self) -> list[int]:
        """The numbers of the log files present, ascending."""
        return log_numbers_in(self.path)

    def checkpoint_numbers(self) -> list[int]:
        """The numbers of the (complete) checkpoints present, ascending."""
        return _numbers_in(self.path, _CHECKPOINT_NAME)

    # --- checkpoints -------------------------------------------------------------------

    def write_checkpoint(self, n: int, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write checkpoint ``n`` atomically (:func:`write_atomically`)."""
        write_atomically(self.checkpoint_path(n), parts, midway="ic.checkpoint.mid_write")

    def read_checkpoint(self, n: int) -> bytes:
        """The bytes of checkpoint ``n``."""
        path = self.checkpoint_path(n)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise StorageError(f"no checkpoint {path}") from None

    # --- logs --------------------------------------------------------------------------

    def open_log(self, n: int) -> LogWriter:
        """A writer appending to log ``n`` (created if missing).

        Appending goes after whatever the file holds: scan (and repair) a log that a crash
        may have torn before appending to it, or start the next log instead.
        """
        return LogWriter(self.log_path(n))

    def scan_log(
        self,
        n: int,
        *,
        committer_id: int | None = None,
        next_seq: int | None = None,
        last: bool,
        repair: bool,
    ) -> LogScan:
        """Verify log ``n`` record by record (see the module docstring for the rules)."""
        return LogScan(
            self.log_path(n),
            committer_id=committer_id,
            next_seq=next_seq,
            last=last,
            repair=repair,
        )

    def clear(self) -> None:
        """Remove every log and checkpoint: what an earlier attempt to start these files
        (an upgrade's, never committed) left."""
        doomed = [self.log_path(n) for n in self.log_numbers()]
        doomed += [self.checkpoint_path(n) for n in self.checkpoint_numbers()]
        for path in doomed:
            path.unlink()
            drop_index(path)
        if doomed:
            fsync_dir(self.path)

    def prune(self, keep: int, *, committed: int | None = None) -> list[Path]:
        """Remove all but the newest ``keep`` checkpoints and the logs before the oldest kept.

        Recovery from checkpoint K needs logs K, K+1, ...; those are never removed.
        ``committed``, if given, is the checkpoint the registry last recorded as committed
        (the newest file may be one a crash left uncommitted): it and everything after it
        are kept as well. Returns the removed paths, oldest first (a removed log's sidecar
        index, ``serverindex<N>``, is removed too and not listed).
        """
        if keep < 1:
            raise StorageError(f"keep must be at least 1, not {keep}")
        checkpoints = self.checkpoint_numbers()
        if not checkpoints:
            return []
        oldest_kept = checkpoints[-keep] if len(checkpoints) >= keep else checkpoints[0]
        if committed is not None:
            oldest_kept = min(oldest_kept, committed)
        doomed = [self.checkpoint_path(n) for n in checkpoints if n < oldest_kept]
        doomed += [self.log_path(n) for n in self.log_numbers() if n < oldest_kept]
        doomed.sort(key=lambda p: (_number(p), p.name))
        for path in doomed:
            path.unlink()
            drop_index(path)  # a removed log's sidecar index goes with it
        if doomed:
            fsync_dir(self.path)
        return doomed


def write_atomically(
    path: Path, parts: Sequence[bytes | bytearray | memoryview], *, midway: str | None = None
) -> None:
    """Write ``path`` whole or not at all, durably: a temporary file beside it (0600,
    named ``.<name>.<random>.tmp``), fsync, rename over ``path``, fsync of the directory.
    A crash leaves the old file or the new one. ``midway``: the crash point halfway
    through the write (:mod:`ambrosia_py.crashpoints`)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, PRIVATE_FILE)  # mkstemp's mode already; stated, as for every file
            if midway is not None:
                crashpoints.reach_midway(midway, (fd, 0), parts)
            _write_all(fd, parts, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def _numbers_in(directory: Path, pattern: re.Pattern[str]) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := pattern.fullmatch(name)))


def log_data_size(path: Path) -> int:
    """Where the records of the log file at ``path`` end: its size, less a live tail
    (:mod:`ambrosia_py.wire.logfile`)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return records_end(fd)[0]
    finally:
        os.close(fd)


def log_bytes_in(directory: Path) -> int:
    """The bytes of records in the ``serverlog<N>`` files in ``directory`` (not their
    preallocated space; 0 if it does not exist yet)."""
    if not directory.is_dir():
        return 0
    total = 0
    for path in directory.iterdir():
        if log_number(path) is not None:
            with contextlib.suppress(FileNotFoundError):  # pruned meanwhile
                total += log_data_size(path)
    return total


def log_numbers_in(directory: Path) -> list[int]:
    """The numbers N of the well-named ``serverlog<N>`` files in ``directory``, ascending."""
    return _numbers_in(directory, _LOG_NAME)


def log_number(path: Path) -> int | None:
    """N if ``path`` is named ``serverlog<N>``, else ``None``."""
    m = _LOG_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else None


def _positive(n: int) -> int:
    if n < 1:
        raise StorageError(f"log and checkpoint numbers start at 1, not {n}")
    return n


def _number(path: Path) -> int:
    m = _LOG_NAME.fullmatch(path.name) or _CHECKPOINT_NAME.fullmatch(path.name)
    return int(m.group(1)) if m else 0
