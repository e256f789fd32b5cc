"""The coordinator's files on disk: logs, checkpoints and the instance lock.

One instance version lives in ``<data dir>/<instance>_<version>/`` (reference ambrosia.md,
Files on disk): log files ``serverlog<N>``, checkpoints ``serverchkpt<N>`` (N from 1;
checkpoint N is the state at the start of log N, so recovering from it needs logs N, N+1,
...) and the lock file ``serverkillFile``, which a running coordinator holds with
``flock`` and which names its pid. Logs are appended with ``writev`` + ``fdatasync``;
checkpoints are written to a temporary file and renamed into place, so a reader only ever
sees a whole checkpoint.

Scanning a log (:meth:`InstanceFiles.scan_log`, :class:`LogScan`) streams the file through
:class:`ambrosia_py.wire.RecordReader` and verifies every record: check bytes, committer
id, consecutive sequence ids (across files: the caller passes the next expected id).
When a record fails, this module decides whether it is a *torn tail* (the unfinished last
write of a crashed coordinator, which recovery cuts off) or *corruption* of input that was
once durable (which must stop recovery: :class:`CorruptLogError`). The rule:

* Damage starts at the offset of the first record that fails (records are contiguous, so
  that is the end of the last good record).
* A record whose check bytes verify but whose committer id or sequence id is wrong is
  never a torn write (a torn write cannot leave a complete body with matching check
  bytes); it is corruption, in any file (this covers sequence gaps across files).
* Any other failure (an incomplete header, record or watermark section; a length field
  that is not in on-disk form or out of range or runs past the end of the file; check
  bytes that do not match; malformed watermarks) is a torn tail only if the file is the
  last one (``last=True``) **and no valid record follows the damaged point**.
* "A valid record follows" means: at some offset after the damage point there is a
  complete on-disk record, i.e. a header whose length field is in on-disk form, in range
  and ends inside the file, whose committer id is the caller's (when the caller gave
  none: the one of the good records before the damage, or the one the damaged header
  states), whose check bytes match its body and whose watermark section parses inside
  the file. Every byte offset after the damage point is considered, not
  just the one the damaged record's (possibly corrupt) length points at, so a corrupt
  length field cannot hide the records behind it. Candidates are found with a regular
  expression over the header's fixed-position bytes (committer id, the sign byte of the
  length), so the search runs at memory speed, chunk by chunk. The search errs towards
  raising: a valid record embedded in the damaged record's body also counts.
* The coordinator appends one batch per ``append`` and makes it durable before the next,
  so an unfinished write is always at the very end; data behind a damaged record was
  acknowledged once and must not be dropped.

The check bytes cover the messages only (the on-disk watermarks are not covered; that is
the released format), so a flipped byte inside a watermark's fixed-size fields cannot be
detected by anyone; a flip that changes a watermark count or name length desynchronises
the stream and is found at the next record.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import struct
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import xxhash

from .. import wire
from ..wire.records import HEADER

__all__ = [
    "CHECKPOINT_PREFIX",
    "LOCK_FILE",
    "LOG_PREFIX",
    "CorruptLogError",
    "InstanceFiles",
    "InstanceLockedError",
    "LogScan",
    "LogWriter",
    "StorageError",
    "TailDamage",
    "log_number",
    "log_numbers_in",
]

LOG_PREFIX = "serverlog"
CHECKPOINT_PREFIX = "serverchkpt"
LOCK_FILE = "serverkillFile"
_LOG_NAME = re.compile(rf"{LOG_PREFIX}([1-9][0-9]*)")
_CHECKPOINT_NAME = re.compile(rf"{CHECKPOINT_PREFIX}([1-9][0-9]*)")
_CHUNK = 1 << 20  # bytes read per step while scanning
_IOV_MAX = 1024  # Linux's limit on buffers per writev
_I32 = struct.Struct("<i")
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)


class StorageError(Exception):
    """A failure of the coordinator's on-disk storage."""


class CorruptLogError(StorageError):
    """A log record that fails verification and is not a torn tail.

    ``offset`` is where the bad record starts in ``path``; ``seq`` the sequence id its header
    states, or (when its header is incomplete) the one expected there.
    """

    def __init__(self, path: Path, offset: int, seq: int | None, reason: str) -> None:
        where = f"{path} at offset {offset}"
        if seq is not None:
            where += f", record seq {seq}"
        super().__init__(f"corrupt log {where}: {reason}")
        self.path = path
        self.offset = offset
        self.seq = seq
        self.reason = reason


class InstanceLockedError(StorageError):
    """Another process (a running coordinator) holds the instance version's lock."""

    def __init__(self, instance: str, version: int, pid: int | None, path: Path) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not recorded"
        super().__init__(f"instance {instance!r} version {version} is locked by {holder} ({path})")
        self.instance = instance
        self.version = version
        self.pid = pid
        self.path = path


@attrs.frozen
class TailDamage:
    """A torn or corrupt tail that was (``repair=True``) or would be cut off."""

    path: Path
    offset: int
    dropped_bytes: int
    reason: str


def _fsync_dir(path: Path) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _views(parts: Sequence[bytes | bytearray | memoryview]) -> list[memoryview]:
    out = []
    for part in parts:
        mv = memoryview(part)
        if mv.ndim != 1 or mv.itemsize != 1:
            mv = mv.cast("B")
        if len(mv):
            out.append(mv)
    return out


def _write_all(fd: int, parts: Sequence[bytes | bytearray | memoryview]) -> int:
    """Write every part with ``writev``, resuming after short writes; return the count."""
    views = _views(parts)
    total = 0
    i = 0
    while i < len(views):
        written = os.writev(fd, views[i : i + _IOV_MAX])
        total += written
        # Drop what was written; a short write leaves a part half done.
        while written and i < len(views):
            if written >= len(views[i]):
                written -= len(views[i])
                i += 1
            else:
                views[i] = views[i][written:]
                written = 0
    return total


class LogWriter:
    """Appends records to one log file; :meth:`append` returns once they are durable.

    Blocking by design: the coordinator calls it from a worker thread. A lock makes
    concurrent calls safe, though the coordinator makes one at a time. After a failed
    write the file may end in a partial record, so the writer refuses further appends
    (recovery will cut the partial record as a torn tail).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        existed = path.exists()
        try:
            self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise StorageError(f"cannot open log {path}: {exc.strerror}") from exc
        self.size = os.fstat(self._fd).st_size
        self._lock = threading.Lock()
        self._broken: str | None = None
        if not existed:
            # The new directory entry must survive a crash too, not just the data.
            _fsync_dir(path.parent)

    def append(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``parts`` at the end of the file and ``fdatasync`` it."""
        self.write(parts)
        self.sync()

    def write(self, parts: Sequence[bytes | bytearray | memoryview]) -> None:
        """Write ``parts`` at the end of the file, not yet durable (see :meth:`sync`)."""
        with self._lock:
            fd = self._usable()
            try:
                written = _write_all(fd, parts)
            except OSError as exc:
                self._broken = exc.strerror or str(exc)
                raise StorageError(f"cannot append to log {self.path}: {self._broken}") from exc
            self.size += written

    def sync(self) -> None:
        """``fdatasync``: everything written before this call is durable when it returns.

        Runs without the write lock, so the next record can be written meanwhile (the
        commit pipeline); a record written during the call waits for the next sync.
        """
        fd = self._usable()
        try:
            os.fdatasync(fd)
        except OSError as exc:
            self._broken = exc.strerror or str(exc)
            raise StorageError(f"cannot sync log {self.path}: {self._broken}") from exc

    def _usable(self) -> int:
        if self._fd is None:
            raise StorageError(f"log {self.path} is closed")
        if self._broken is not None:
            raise StorageError(
                f"log {self.path} failed earlier ({self._broken}); no further appends"
            )
        return self._fd

    def close(self) -> None:
        """Close the file (idempotent)."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LogScan:
    """The verified records of one log file, streamed in order (see the module docstring).

    Iterate once; afterwards ``damage``, ``next_seq``, ``end_offset``, ``records`` and
    ``committer_id`` describe the file (``done`` says the whole file was read). Records
    already yielded stay valid. :meth:`drain` iterates without keeping records.
    """

    def __init__(
        self,
        path: Path,
        *,
        committer_id: int | None,
        next_seq: int | None,
        last: bool,
        repair: bool,
        chunk_size: int = _CHUNK,
        max_record_size: int = wire.DEFAULT_MAX_RECORD_SIZE,
    ) -> None:
        self.path = path
        self.last = last
        self.repair = repair
        self.damage: TailDamage | None = None
        self.next_seq = next_seq
        self.committer_id = committer_id
        self.end_offset = 0
        self.records = 0
        self._trusted_committer = committer_id
        self._chunk = chunk_size
        self._max_record = max_record_size
        self._started = False
        self.done = False

    def __iter__(self) -> Iterator[wire.RawRecord]:
        if self._started:
            raise StorageError(f"scan of {self.path} is already under way or done")
        self._started = True
        return self._scan()

    def drain(self) -> LogScan:
        """Scan the whole file, dropping the records; return ``self``."""
        for _ in self:
            pass
        return self

    def _scan(self) -> Iterator[wire.RawRecord]:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise StorageError(f"no log file {self.path}") from None
        try:
            size = os.fstat(fd).st_size
            reader = wire.RecordReader(
                on_disk=True,
                committer_id=self.committer_id,
                next_seq=self.next_seq,
                max_record_size=self._max_record,
            )
            read_to = 0
            while True:
                try:
                    raw = reader.next_raw()
                except wire.ProtocolError as exc:
                    self._damaged(fd, size, exc)
                    break
                if raw is not None:
                    self.records += 1
                    self.end_offset = reader.offset
                    self.next_seq = reader.next_seq
                    self.committer_id = raw.header.committer_id
                    yield raw
                    continue
                if read_to >= size:
                    if reader.buffered:
                        self._damaged(fd, size, None)
                    break
                if self._runs_past_end(fd, size, reader.offset, reader.buffered):
                    self._damaged(fd, size, None)
                    break
                chunk = os.pread(fd, min(self._chunk, size - read_to), read_to)
                if not chunk:  # the file shrank under us
                    size = read_to
                    continue
                read_to += len(chunk)
                reader.feed(chunk)
        finally:
            os.close(fd)
        self.done = True

    def _runs_past_end(self, fd: int, size: int, offset: int, buffered: int) -> bool:
        """Whether the record at ``offset`` states a length beyond the file's end.

        Checked before reading on, so a corrupt length never makes us buffer the rest of
        the file waiting for a record that cannot complete.
        """
        if buffered < wire.HEADER_SIZE:
            return False
        header = os.pread(fd, wire.HEADER_SIZE, offset)
        if len(header) < wire.HEADER_SIZE:
            return True
        stored = int(_I32.unpack_from(header, 4)[0])
        return stored < 0 and offset + (-stored - 1) > size

    def _damaged(self, fd: int, size: int, exc: wire.ProtocolError | None) -> None:
        """Classify the failure at ``end_offset``: raise, or record (and cut) a torn tail."""
        start = self.end_offset
        header = os.pread(fd, wire.HEADER_SIZE, start)
        stated_seq: int | None = None
        if len(header) == wire.HEADER_SIZE:
            stated_seq = int(HEADER.unpack(header)[3])
        seq = stated_seq if stated_seq is not None else self.next_seq
        if exc is None:
            if len(header) < wire.HEADER_SIZE:
                reason = f"incomplete record header ({size - start} of {wire.HEADER_SIZE} bytes)"
            else:
                reason = (
                    f"record or its watermarks run past the end of the file "
                    f"({size - start} bytes present)"
                )
        else:
            reason = exc.reason
            if exc.offset is not None and exc.offset != start:
                reason += f" (at offset {exc.offset})"
        if isinstance(exc, wire.CommitterError | wire.SequenceError) and _record_at(
            fd, start, size, None, self._max_record
        ):
            raise CorruptLogError(
                self.path, start, seq, f"{reason}; the record itself is intact, not a torn write"
            )
        if not self.last:
            raise CorruptLogError(self.path, start, seq, f"{reason} in a log that is not the last")
        # Whose records to look for: the caller's committer if given; otherwise the one
        # the good records so far carried and the one the damaged header states.
        committers = {self._trusted_committer}
        if self._trusted_committer is None and len(header) == wire.HEADER_SIZE:
            committers = {self.committer_id, int(HEADER.unpack(header)[0])}
        follower = _find_record(
            fd, start + 1, size, frozenset(c for c in committers if c is not None), self._max_record
        )
        if follower is not None:
            raise CorruptLogError(
                self.path, start, seq, f"{reason}; a valid record follows at offset {follower}"
            )
        self.damage = TailDamage(self.path, start, size - start, f"torn tail: {reason}")
        if self.repair:
            _truncate(self.path, start)


def _truncate(path: Path, length: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)


def _record_at(
    fd: int, pos: int, size: int, committers: frozenset[int] | None, max_record: int
) -> bool:
    """Whether a complete, verifiable on-disk record (of one of ``committers``, if given)
    starts at ``pos``."""
    header = os.pread(fd, wire.HEADER_SIZE, pos)
    if len(header) < wire.HEADER_SIZE:
        return False
    try:
        parsed = wire.parse_header(header, on_disk=True, max_record_size=max_record)
    except wire.ProtocolError:
        return False
    if committers is not None and parsed.committer_id not in committers:
        return False
    if pos + parsed.length > size:
        return False
    hasher = xxhash.xxh64()
    at, end = pos + wire.HEADER_SIZE, pos + parsed.length
    while at < end:  # in pieces: a (bogus) length may claim hundreds of megabytes
        piece = os.pread(fd, min(_CHUNK, end - at), at)
        if not piece:
            return False
        hasher.update(piece)
        at += len(piece)
    if hasher.intdigest() != parsed.check:
        return False
    # The watermark section: read in growing pieces until it parses or the file ends.
    tail_at = pos + parsed.length
    want = 256
    while True:
        tail = os.pread(fd, want, tail_at)
        try:
            wire.decode_disk_tail(tail)
        except wire.TruncatedError:
            if tail_at + len(tail) >= size:
                return False
            want *= 4
            continue
        except wire.ProtocolError:
            return False
        return True


def _candidate_pattern(
    committers: frozenset[int], remaining: int, max_record: int
) -> re.Pattern[bytes]:
    """Offsets whose bytes could start an on-disk header: a committer id, then a length
    field whose top byte fits a negative length no larger than the rest of the file."""
    longest = min(remaining, max_record)
    lowest = (-longest - 1) >> 24  # top byte (signed) of the most negative allowed field
    top = re.escape(bytes([lowest & 0xFF])) + b"-\xff" if lowest < -1 else b"\xff"
    who = b"|".join(re.escape(_I32.pack(c)) for c in sorted(committers))
    return re.compile(b"(?=(?:" + who + b")...[" + top + b"])", re.DOTALL)


def _find_record(
    fd: int, start: int, size: int, committers: frozenset[int], max_record: int
) -> int | None:
    """The offset of the first valid record of one of ``committers`` from ``start`` on."""
    if size - start < wire.HEADER_SIZE or not committers:
        return None
    pattern = _candidate_pattern(committers, size - start, max_record)
    pos = start
    overlap = wire.HEADER_SIZE - 1
    while pos < size - overlap:
        chunk = os.pread(fd, _CHUNK + overlap, pos)
        for match in pattern.finditer(chunk):
            if match.start() >= len(chunk) - overlap and pos + len(chunk) < size:
                break  # seen again, whole, in the next chunk
            if _record_at(fd, pos + match.start(), size, committers, max_record):
                return pos + match.start()
        pos += _CHUNK
    return None


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
        """Create the directory (and its parents) and make its entry durable."""
        existed = self.path.is_dir()
        self.path.mkdir(parents=True, exist_ok=True)
        if not existed:
            _fsync_dir(self.path.parent)

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
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
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
        """Write checkpoint ``n`` atomically: temp file, fsync, rename, fsync the dir."""
        final = self.checkpoint_path(n)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=self.path)
        try:
            try:
                _write_all(fd, parts)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        _fsync_dir(self.path)

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

    def prune(self, keep: int, *, committed: int | None = None) -> list[Path]:
        """Remove all but the newest ``keep`` checkpoints and the logs before the oldest kept.

        Recovery from checkpoint K needs logs K, K+1, ...; those are never removed.
        ``committed``, if given, is the checkpoint the registry last recorded as committed
        (the newest file may be one a crash left uncommitted): it and everything after it
        are kept as well. Returns the removed paths, oldest first.
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
        if doomed:
            _fsync_dir(self.path)
        return doomed


def _numbers_in(directory: Path, pattern: re.Pattern[str]) -> list[int]:
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for name in names if (m := pattern.fullmatch(name)))


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
