"""A replica's log: the on-disk records of an instance's log files, addressed by seq.

A replica (:mod:`ambrosia_py.coordinator.replication`) keeps the log a standalone
coordinator keeps: ``serverlog<N>`` files of on-disk records, seqs consecutive across
files, checkpoint N the state before the first record of log N. Replication addresses it
by seq: a secondary writes what its primary ships at the end (:meth:`ReplicaLog.append`),
cuts an uncommitted tail that disagrees with a new primary's log
(:meth:`ReplicaLog.truncate`) and starts over from a checkpoint shipped whole
(:meth:`ReplicaLog.install_checkpoint`); a primary reads its records from any seq to ship
them (:meth:`ReplicaLog.read`), those its commit path wrote through a
:class:`~.files.LogWriter` of its own made known with :meth:`ReplicaLog.note`.

A seq is found through a sparse index in memory, per file: the offset of its first record
and of one record every :data:`SPARSE_BYTES` after, built by the scan in
:meth:`ReplicaLog.open` and by every append and note (exact, so the sidecar index
``serverindex<N>``, a hint, is not needed). A read starts at the entry at or before its
seq and verifies every record it passes (check bytes, committer id, consecutive seqs):
a file changed under the log raises :class:`~.errors.CorruptLogError`, never ships.

Crash safety: a crash at any point of any step leaves files from which ``open`` recovers
a prefix of the log before or after the step, every record whole, no gap between files:

* ``append`` writes through a :class:`~.files.LogWriter` (records, then the end marker):
  a write cut short is a torn tail of the last log, which ``open`` cuts. Only ``sync``
  makes records durable and moves :attr:`~ReplicaLog.durable_end`, all a replica ever
  acknowledges. ``open`` fdatasyncs what it scanned, so there ``durable_end = end``.
* ``roll`` syncs the current log before it creates the next, so a log followed by
  another is whole and durable (a torn record in a log not the last is damage).
* ``truncate`` removes the later log files newest first, syncing the directory after
  each (a crash leaves a shorter run of files, never a hole), then cuts the file holding
  the new end and fsyncs it. Cut off midway, the log is longer than asked but whole; the
  replication core saves the history that follows a truncation only once it returned.
* the install writes the checkpoint atomically and creates its log, empty, before the
  caller commits it (``ReplicaState(checkpoint=n)``), and removes older files only after:
  until the commit, recovery starts from the old checkpoint with its logs intact (the new
  empty log after them is harmless); after it, from the new one.

Threads: synchronous, no lock. Any call may run in a worker thread (``asyncio.to_thread``)
provided no other call on the same object runs meanwhile: the adapter awaits each before
it makes the next. Another writer (the primary's commit path) may write the current log
file during a read or a sync, which touch only records already noted; ``append``,
``truncate``, ``roll`` and the install need that no other writer holds the log files.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from ... import wire
from ..core.checkpoint import IcState, StateFormatError
from .errors import CorruptLogError, StorageError
from .files import PREALLOCATE_BYTES, InstanceFiles, LogWriter, log_data_size
from .index import drop_index, trim_index
from .modes import create_private, fsync_dir

__all__ = ["SPARSE_BYTES", "RecordRefusedError", "ReplicaLog"]

# One in-memory index entry per this many bytes of log: a read skips at most this much
# before its first record. 64 KiB costs 16 Ki entries per GiB of log.
SPARSE_BYTES = 64 * 1024
_MIN_READ = 64 * 1024  # what one pread takes at the least (a small read's first record)
_MAX_READ = 4 << 20  # and at the most, however large a read's byte budget


class RecordRefusedError(StorageError):
    """A batch given to :meth:`ReplicaLog.append` that was refused; nothing of it was
    written. ``index`` is the record's place in the batch (None: the batch as a whole),
    ``seq`` the seq it had to carry."""

    def __init__(self, index: int | None, seq: int, reason: str) -> None:
        what = "batch" if index is None else f"record {index} of the batch (seq {seq})"
        super().__init__(f"refused {what}: {reason}; nothing was written")
        self.index = index
        self.seq = seq
        self.reason = reason


@attrs.define
class _Segment:
    """One log file's part of the log: records ``first .. end - 1``, their bytes ending
    at ``size``; ``seqs``/``offsets`` its sparse index."""

    number: int
    first: int
    end: int
    size: int = 0
    seqs: list[int] = attrs.field(factory=list)
    offsets: list[int] = attrs.field(factory=list)

    def add(self, size: int) -> None:
        """One more record at the end, ``size`` bytes on disk."""
        if not self.offsets or self.size - self.offsets[-1] >= SPARSE_BYTES:
            self.seqs.append(self.end)
            self.offsets.append(self.size)
        self.end += 1
        self.size += size

    def entry_before(self, seq: int) -> tuple[int, int]:
        """The indexed record at or before ``seq``: its seq and offset."""
        i = bisect.bisect_right(self.seqs, seq) - 1
        return self.seqs[i], self.offsets[i]

    def cut(self, seq: int, offset: int) -> None:
        """Keep the records before ``seq``, which starts at ``offset``."""
        keep = bisect.bisect_left(self.seqs, seq)
        del self.seqs[keep:], self.offsets[keep:]
        self.end = seq
        self.size = offset


class ReplicaLog:
    """A replica's log as seq-addressed on-disk records over an :class:`InstanceFiles`'
    log files (see the module docstring). Made by :meth:`open`.

    ``base``: the first seq the log holds (the seq its checkpoint stands before); ``end``:
    the seq after its last record; ``durable_end``: records below it are durable;
    ``log_number``: the file appends go to.
    """

    def __init__(
        self, files: InstanceFiles, committer_id: int, segments: list[_Segment], base: int
    ) -> None:
        self._files = files
        self.committer_id = committer_id
        self._segments = segments
        self._base = base
        self._durable_end = segments[-1].end
        self._writer: LogWriter | None = None
        self._fds: dict[int, int] = {}  # log number -> descriptor for reading and syncing

    @classmethod
    def open(
        cls, files: InstanceFiles, *, first_log: int, committer_id: int, base_seq: int
    ) -> ReplicaLog:
        """The log from ``first_log`` on, its first record ``base_seq``: the log files
        ``first_log`` and after, verified as recovery verifies them (a torn tail of the
        last is cut; damage before it raises :class:`CorruptLogError`) and made durable.
        No such file: an empty log at ``base_seq``, whose first append creates
        ``first_log``."""
        if first_log < 1:
            raise StorageError(f"log numbers start at 1, not {first_log}")
        if base_seq < 0:
            raise StorageError(f"a log starts at seq 0 or later, not {base_seq}")
        numbers = [n for n in files.log_numbers() if n >= first_log]
        segments = []
        seq = base_seq
        for n in numbers:
            segment = _Segment(n, seq, seq)
            scan = files.scan_log(
                n, committer_id=committer_id, next_seq=seq, last=n == numbers[-1], repair=True
            )
            for raws in scan.batches():
                for raw in raws:
                    segment.add(len(raw.raw))
            _fdatasync_path(files.log_path(n))
            segments.append(segment)
            seq = segment.end
        return cls(files, committer_id, segments or [_Segment(first_log, seq, seq)], base_seq)

    # --- where the log stands ----------------------------------------------------------

    @property
    def base(self) -> int:
        return self._base

    @property
    def end(self) -> int:
        return self._segments[-1].end

    @property
    def durable_end(self) -> int:
        return self._durable_end

    @property
    def log_number(self) -> int:
        return self._segments[-1].number

    @property
    def log_size(self) -> int:
        """The bytes of records in the file appends go to (a roll's trigger)."""
        return self._segments[-1].size

    def log_start(self, n: int) -> int | None:
        """The seq log file ``n`` starts at; None if the log holds no file ``n``."""
        for segment in self._segments:
            if segment.number == n:
                return segment.first
        return None

    def __repr__(self) -> str:
        return (
            f"ReplicaLog({str(self._files.path)!r}, base={self._base}, end={self.end}, "
            f"durable_end={self._durable_end}, log_number={self.log_number})"
        )

    # --- appending ---------------------------------------------------------------------

    def append(self, first_seq: int, records: Sequence[bytes | memoryview]) -> None:
        """Write on-disk ``records``, seq ``first_seq`` on, at the log's end, verbatim
        (not yet durable: :meth:`sync`).

        Every record is verified first, and the batch is refused whole
        (:class:`RecordRefusedError`) unless ``first_seq`` is :attr:`end` and each record
        is exactly one well-formed on-disk record (header, messages matching their check
        bytes, watermarks, nothing after) of this log's committer id with the next seq.
        """
        if first_seq != self.end:
            raise RecordRefusedError(
                None, first_seq, f"it starts at seq {first_seq}, the log ends at {self.end}"
            )
        sizes = self._verified_sizes(first_seq, records)
        if not sizes:
            return
        segment = self._segments[-1]
        self._open_writer(segment).write(records)
        for size in sizes:
            segment.add(size)

    def _verified_sizes(self, first_seq: int, records: Sequence[bytes | memoryview]) -> list[int]:
        reader = wire.RecordReader(on_disk=True, committer_id=self.committer_id, next_seq=first_seq)
        sizes = []
        for i, record in enumerate(records):
            seq = first_seq + i
            reader.feed(record)
            try:
                raws = reader.next_raws(1)
            except wire.ProtocolError as exc:
                raise RecordRefusedError(i, seq, exc.reason) from None
            if not raws:
                raise RecordRefusedError(i, seq, _torn(record))
            if reader.buffered:
                raise RecordRefusedError(
                    i,
                    seq,
                    f"its length field and watermarks end at byte {len(raws[0].raw)}, "
                    f"but {len(record)} bytes were given",
                )
            sizes.append(len(record))
        return sizes

    def _open_writer(self, segment: _Segment) -> LogWriter:
        if self._writer is None:
            # Preallocated only from a file's start. A writer growing a file that holds
            # records writes its trailer before the end marker after them: a crash in
            # between would make recovery take the last (durable) record for one cut
            # short, and drop it. Such a file is appended to as the released coordinator
            # does, until the next roll.
            writer = LogWriter(
                self._files.log_path(segment.number),
                preallocate=PREALLOCATE_BYTES if segment.size == 0 else 0,
            )
            if writer.size != segment.size:
                writer.close()
                raise StorageError(
                    f"log {writer.path} holds records up to offset {writer.size}, this "
                    f"log knows them up to {segment.size}: another writer?"
                )
            self._writer = writer
        return self._writer

    def sync(self) -> int:
        """Make every record below :attr:`end` durable (fdatasync) and return the new
        :attr:`durable_end`. Safe in a worker thread while nothing else is done to this
        object (see the module docstring)."""
        end = self.end
        for segment in self._segments:
            if segment.end > max(self._durable_end, segment.first):
                self._sync_file(segment.number)
        self._durable_end = max(self._durable_end, end)
        return self._durable_end

    def _sync_file(self, number: int) -> None:
        writer = self._writer
        if writer is not None and writer.path == self._files.log_path(number):
            writer.sync()
            return
        try:
            os.fdatasync(self._fd(number))
        except OSError as exc:
            raise StorageError(f"cannot sync log {self._files.log_path(number)}: {exc}") from exc

    def roll(self, n: int) -> None:
        """Append to a new log file ``n`` from here on (created empty and durably, after
        the current log was made durable)."""
        if n <= self.log_number:
            raise StorageError(f"cannot roll to log {n}: appends go to log {self.log_number}")
        path = self._files.log_path(n)
        if path.exists() and log_data_size(path) > 0:
            raise StorageError(f"cannot roll to log {path}: it holds records already")
        self.sync()
        self._close_writer()
        os.close(create_private(path, os.O_RDONLY))
        fsync_dir(path.parent)
        self._segments.append(_Segment(n, self.end, self.end))

    # --- another writer's records ------------------------------------------------------

    def note(self, seq: int, log_number: int, offset: int, size: int) -> None:
        """Record ``seq``, written by another writer (a :class:`LogWriter` of the
        primary's commit path) at ``offset`` of log ``log_number``, ``size`` bytes on
        disk, is in the log: :attr:`end` passes it and :meth:`read` finds it. A newer
        ``log_number`` rolls the log there (its first record at offset 0)."""
        segment = self._segments[-1]
        path = self._files.log_path(log_number)
        expected = segment.size if log_number == segment.number else 0
        writer = self._writer
        problem = None
        if seq != self.end:
            problem = f"the log ends at {self.end}"
        elif size < wire.HEADER_SIZE:
            problem = f"{size} bytes are no record"
        elif log_number < segment.number:
            problem = f"the log is at log {segment.number} already"
        elif offset != expected:
            problem = f"at offset {offset}, where the next record goes at offset {expected}"
        elif writer is not None and writer.path == path:
            problem = "this log appends to that file itself; another writer needs a log of its own"
        if problem is not None:
            raise StorageError(f"noted record seq {seq} in {path}: {problem}")
        self._close_writer()  # appends of its own, if any, were to an earlier log
        if log_number != segment.number:
            segment = _Segment(log_number, seq, seq)
            self._segments.append(segment)
        segment.add(size)

    def synced(self, end: int) -> None:
        """The other writer made the log durable below ``end``."""
        if end > self.end:
            raise StorageError(f"synced up to seq {end}, past the log's end {self.end}")
        self._durable_end = max(self._durable_end, end)

    # --- reading -----------------------------------------------------------------------

    def read(self, from_seq: int, max_bytes: int) -> list[bytes]:
        """The on-disk records from ``from_seq`` on: at least one if ``base <= from_seq <
        end``, then as many as fit in ``max_bytes`` (one larger record comes alone);
        none if ``from_seq`` was pruned (below :attr:`base`) or is :attr:`end`.

        Every record is verified on its way out: :class:`CorruptLogError` if the file no
        longer holds what was written (the wrong seq where a record was indexed, a bad
        check, a record cut short).
        """
        return [bytes(record.raw) for record in self.read_records(from_seq, max_bytes)]

    def read_records(self, from_seq: int, max_bytes: int) -> list[wire.RawRecord]:
        """What :meth:`read` reads, as the verified records it parsed (headers and
        watermarks: a reader of its own need not parse them again)."""
        if from_seq < self._base:
            return []
        if from_seq > self.end:
            raise StorageError(f"cannot read from seq {from_seq}: the log ends at {self.end}")
        chunk = min(_MAX_READ, max(_MIN_READ, max_bytes + SPARSE_BYTES))
        out: list[wire.RawRecord] = []
        taken = 0
        for segment in self._segments:
            if segment.end <= max(from_seq, segment.first):
                continue  # before ``from_seq``, or empty
            for _, record in self._records(segment, max(from_seq, segment.first), chunk):
                size = len(record.raw)
                if out and taken + size > max_bytes:
                    return out
                out.append(record)
                taken += size
                if taken >= max_bytes:
                    return out  # full: the next record is not read
        return out

    def _records(
        self, segment: _Segment, from_seq: int, chunk: int
    ) -> Iterator[tuple[int, wire.RawRecord]]:
        """``(offset, record)`` of the records of ``segment`` from ``from_seq`` on,
        verified, read from the index entry at or before it; each record's bytes its
        own (not a view of the reader's buffer)."""
        path = self._files.log_path(segment.number)
        seq, start = segment.entry_before(from_seq)
        fd = self._fd(segment.number)
        reader = wire.RecordReader(on_disk=True, committer_id=self.committer_id, next_seq=seq)
        at = start
        while seq < segment.end:
            try:
                raws = reader.next_raws()
            except wire.ProtocolError as exc:
                offset = start + (exc.offset if exc.offset is not None else reader.offset)
                raise CorruptLogError(path, offset, exc.seq, exc.reason) from None
            if not raws:
                if at >= segment.size:
                    raise CorruptLogError(
                        path, start + reader.offset, seq, "a record runs past where its log ends"
                    )
                data = os.pread(fd, min(chunk, segment.size - at), at)
                if not data:
                    raise CorruptLogError(
                        path, at, seq, f"the file ends before {segment.size}, its records' end"
                    )
                at += len(data)
                reader.feed(data)
            for raw in raws:
                seq = raw.header.seq + 1
                if seq > segment.end:
                    raise CorruptLogError(
                        path, start + raw.offset, seq - 1, f"past the log's end {segment.end}"
                    )
                if seq > from_seq:
                    own = wire.RawRecord(raw.header, bytes(raw.raw), raw.offset, raw.tail)
                    yield start + raw.offset, own

    def _fd(self, number: int) -> int:
        fd = self._fds.get(number)
        if fd is None:
            path = self._files.log_path(number)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise CorruptLogError(path, 0, None, "the log file is gone") from None
            self._fds[number] = fd
        return fd

    # --- cutting -----------------------------------------------------------------------

    def truncate(self, end: int) -> None:
        """Keep the records below ``end``, durably, and drop the rest: the later log
        files are removed, the file holding ``end`` is cut where that record starts and
        fsynced, with the directory. Needs ``base <= end <=`` :attr:`end`; afterwards
        :attr:`end` and :attr:`durable_end` are both ``end``."""
        if not self._base <= end <= self.end:
            raise StorageError(
                f"cannot truncate to seq {end}: the log holds {self._base} .. {self.end - 1}"
            )
        k = max(i for i, segment in enumerate(self._segments) if segment.first <= end)
        keep = self._segments[k]
        offset = self._offset_of(keep, end)  # read before anything changes
        self._close_writer()
        while len(self._segments) > k + 1:  # newest first: a crash leaves no hole
            doomed = self._segments[-1]
            self._close_fd(doomed.number)
            path = self._files.log_path(doomed.number)
            path.unlink(missing_ok=True)
            drop_index(path)
            fsync_dir(path.parent)
            self._segments.pop()
        path = self._files.log_path(keep.number)
        _cut_file(path, offset)
        keep.cut(end, offset)
        trim_index(path, offset)
        for segment in self._segments[:k]:  # records below ``end`` in earlier files
            if segment.end > max(self._durable_end, segment.first):
                self._sync_file(segment.number)
        self._durable_end = end

    def _offset_of(self, segment: _Segment, seq: int) -> int:
        if seq == segment.end:
            return segment.size
        for offset, _ in self._records(segment, seq, _MIN_READ):
            return offset
        raise AssertionError("unreachable: a segment holds the seqs below its end")

    # --- checkpoints -------------------------------------------------------------------

    def install_checkpoint(
        self, n: int, data: bytes, seq: int, commit: Callable[[], object]
    ) -> IcState:
        """Start over from a checkpoint shipped whole: :meth:`write_checkpoint_for_install`,
        then ``commit()`` (the caller saves ``ReplicaState(checkpoint=n)`` durably), then
        :meth:`drop_before`. Returns the checkpoint's state. If ``commit`` raises, the
        older files are all still there: recovery starts from the old checkpoint."""
        state = self.write_checkpoint_for_install(n, data, seq)
        commit()
        self.drop_before(n)
        return state

    def write_checkpoint_for_install(self, n: int, data: bytes, seq: int) -> IcState:
        """Verify ``data`` (the bytes of a checkpoint file, the state before record
        ``seq``), write it as checkpoint ``n`` atomically and start log ``n``, empty, at
        ``seq``: ``base == end == durable_end == seq`` from here on.

        The older logs and checkpoints stay until :meth:`drop_before`, which must come
        only after the caller has committed checkpoint ``n`` (until then recovery starts
        from the old one), and before anything is appended (recovery from the old
        checkpoint would find log ``n`` not following its logs).
        """
        if n <= self.log_number:
            raise StorageError(
                f"cannot install checkpoint {n}: its log must come after log {self.log_number}"
            )
        where = f"checkpoint {n} to install"
        try:
            state = IcState.decode(bytes(data), where)
        except StateFormatError as exc:
            raise StorageError(f"refused {exc}") from None
        if state.next_seq != seq:
            raise StorageError(
                f"refused {where}: it stands before record {state.next_seq}, not {seq}"
            )
        if state.committer_id != self.committer_id:
            raise StorageError(
                f"refused {where}: committer id {state.committer_id}, this log's is "
                f"{self.committer_id}"
            )
        path = self._files.log_path(n)
        if path.exists() and log_data_size(path) > 0:
            raise StorageError(f"cannot install checkpoint {n}: {path} holds records already")
        self._close_writer()
        self._close_fds()
        self._files.write_checkpoint(n, [data])
        os.close(create_private(path, os.O_RDONLY))
        fsync_dir(path.parent)
        self._segments = [_Segment(n, seq, seq)]
        self._base = self._durable_end = seq
        return state

    def drop_before(self, n: int) -> list[Path]:
        """Remove the logs and checkpoints before checkpoint ``n``, which recovery starts
        from (committed by the caller); :attr:`base` becomes its seq. Idempotent; returns
        the files removed."""
        numbers = [segment.number for segment in self._segments]
        if n not in numbers:
            raise StorageError(f"cannot drop the logs before log {n}: the log holds {numbers}")
        if not self._files.checkpoint_path(n).exists():
            raise StorageError(
                f"cannot drop the logs before log {n}: there is no checkpoint {n} to start from"
            )
        k = numbers.index(n)
        for segment in self._segments[:k]:
            self._close_fd(segment.number)
        del self._segments[:k]
        self._base = max(self._base, self._segments[0].first)
        self._durable_end = max(self._durable_end, self._base)
        return self._files.prune(1, committed=n)

    # --- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the files (idempotent). Records not synced are not made durable."""
        self._close_writer()
        self._close_fds()

    def _close_writer(self) -> None:
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()

    def _close_fd(self, number: int) -> None:
        fd = self._fds.pop(number, None)
        if fd is not None:
            os.close(fd)

    def _close_fds(self) -> None:
        for number in list(self._fds):
            self._close_fd(number)

    def __enter__(self) -> ReplicaLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _torn(record: bytes | memoryview) -> str:
    """Why ``record``, which the reader could not complete, is not a whole record."""
    if len(record) < wire.HEADER_SIZE:
        return f"{len(record)} bytes, shorter than a record header ({wire.HEADER_SIZE})"
    header = wire.parse_header(record, 0, on_disk=True)
    if header.length > len(record):
        return f"its header states {header.length} bytes, {len(record)} were given (torn)"
    return f"its watermarks are cut short at byte {len(record)} (torn)"


def _fdatasync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _cut_file(path: Path, offset: int) -> None:
    """Cut ``path`` at ``offset`` (a live tail goes too) and fsync it; a missing file is
    an empty log (one :meth:`ReplicaLog.open` found none of), left missing."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        if offset:
            raise CorruptLogError(path, 0, None, "the log file is gone") from None
        return
    try:
        os.ftruncate(fd, offset)
        os.fsync(fd)
    finally:
        os.close(fd)
