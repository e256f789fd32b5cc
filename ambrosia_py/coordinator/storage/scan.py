"""Scanning a log file for recovery: its verified records, and the coordinator's answer to
damage.

Scanning a log (:class:`LogScan`, made by :meth:`.storage.InstanceFiles.scan_log`) streams
the file through :class:`ambrosia_py.wire.RecordReader` and verifies every record: check
bytes, committer id, consecutive sequence ids (across files: the caller passes the next
expected id). A file with a live tail (a log being written, or left by a crash:
:mod:`ambrosia_py.wire.logfile`) is read up to where its records end, and "the end of the
file" means there. When a record fails, the one log scanner (:mod:`ambrosia_py.wire.scanner`,
which the Spark reader asks too) says what the bytes from there are: a *torn tail* (the
unfinished last write of a crashed coordinator) or *damage* to input that was once durable.
Its rule is recovery's safety; in short, damage is a record that verifies but carries the
wrong committer id or seq, any failure in a log that is not the last or followed by a valid
record (of the instance's committer: the caller's, else the good records' or the one the
damaged header states), and a last record that is complete but does not verify, or whose
header is not the one the log expects next. Only zeros, or a prefix of the expected record
cut short by the end of the file, are a torn tail.

This module is the strict caller, the coordinator's policy on top of that rule:

* damage stops recovery: :class:`~.errors.CorruptLogError`, naming file, offset and seq,
  and the file is left as it is;
* a torn tail is reported (``damage``) and, by a repairing scan (``repair=True``), cut:
  first copied, durably and 0600, beside the log as ``serverlog<N>.torn-<offset>``
  (``damage.kept`` names the copy); a repairing scan also truncates a live tail whose last
  write finished.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import attrs

from ... import wire
from ...wire import logfile, scanner
from ...wire.records import HEADER
from .errors import CorruptLogError, StorageError
from .modes import create_private, fsync_dir

__all__ = ["LogScan", "TailDamage", "records_end"]


@attrs.frozen
class TailDamage:
    """A torn tail that was (``repair=True``) or would be cut off."""

    path: Path
    offset: int
    dropped_bytes: int
    reason: str
    kept: Path | None = None  # where the cut bytes were copied (only when cut)


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
        chunk_size: int = scanner.CHUNK,
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
        for raws in self.batches():
            yield from raws

    def batches(self) -> Iterator[list[wire.RawRecord]]:
        """The records in runs, as the reader takes them (iterating record by record costs
        a generator step each). The counts above are updated per run."""
        if self._started:
            raise StorageError(f"scan of {self.path} is already under way or done")
        self._started = True
        return self._scan()

    def drain(self) -> LogScan:
        """Scan the whole file, dropping the records; return ``self``."""
        for _ in self:
            pass
        return self

    def _scan(self) -> Iterator[list[wire.RawRecord]]:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise StorageError(f"no log file {self.path}") from None
        try:
            # Where the records end: a log still written, or left by a crash, has a live
            # tail after them (wire.logfile); it is read up to there, like a log at rest.
            size, on_disk = records_end(fd)
            log = scanner.LogBytes(lambda n, at: os.pread(fd, n, at), size, self._max_record)
            reader = wire.RecordReader(
                on_disk=True,
                committer_id=self.committer_id,
                next_seq=self.next_seq,
                max_record_size=self._max_record,
            )
            read_to = 0
            while True:
                try:
                    raws = reader.next_raws()  # a run of records per call (accelerated)
                except wire.ProtocolError as exc:
                    self._damaged(log, exc)
                    break
                if raws:
                    # What the reader's offset and next seq were after the last record: on
                    # disk every record is logged (seq >= 0) and ends its raw bytes.
                    last = raws[-1]
                    self.records += len(raws)
                    self.end_offset = last.offset + len(last.raw)
                    self.next_seq = last.header.seq + 1
                    self.committer_id = last.header.committer_id
                    yield raws
                    continue
                if read_to >= log.end:
                    if reader.buffered:
                        self._damaged(log, None)
                    break
                # Asked before reading on, so a corrupt length never makes us buffer the
                # rest of the file waiting for a record that cannot complete.
                if reader.buffered >= wire.HEADER_SIZE and scanner.runs_past(log, reader.offset):
                    self._damaged(log, None)
                    break
                chunk = os.pread(fd, min(self._chunk, log.end - read_to), read_to)
                if not chunk:  # the file shrank under us
                    log = attrs.evolve(log, end=read_to)
                    continue
                read_to += len(chunk)
                reader.feed(chunk)
            if self.repair and self.damage is None and on_disk > log.end:
                _truncate(self.path, log.end)  # the live tail goes; the records are whole
        finally:
            os.close(fd)
        self.done = True

    def _damaged(self, log: scanner.LogBytes, exc: wire.ProtocolError | None) -> None:
        """Ask the scanner what the bytes from ``end_offset`` are: raise, or record (and
        cut) a torn tail."""
        start = self.end_offset
        header = log.read(wire.HEADER_SIZE, start)
        seq = int(HEADER.unpack(header)[3]) if len(header) == wire.HEADER_SIZE else self.next_seq
        if exc is None:
            failure = scanner.cut_failure(log, start)
        else:
            failure = exc.reason
            if exc.offset is not None and exc.offset != start:
                failure += f" (at offset {exc.offset})"
        trusted = self._trusted_committer
        damage = scanner.judge(
            log,
            start,
            failure,
            last=self.last,
            committer=self.committer_id if trusted is None else trusted,
            seq=self.next_seq,
            trusted=trusted is not None,
            wrong_ids=isinstance(exc, wire.CommitterError | wire.SequenceError),
        )
        if not damage.torn:
            untouched = "; the file is left as it is" if damage.problem is not None else ""
            raise CorruptLogError(self.path, start, seq, damage.reason + untouched)
        kept = _keep(log, self.path, start) if self.repair else None
        self.damage = TailDamage(self.path, start, log.end - start, damage.reason, kept)
        if self.repair:
            _truncate(self.path, start)


def records_end(fd: int) -> tuple[int, int]:
    """Where the records of the open log file ``fd`` end (its size, less a live tail:
    ``wire.logfile``), and its size: read while the file held still, since a coordinator
    may be closing it. StorageError if it never did."""
    try:
        return logfile.settled_data_end(
            lambda n, at: os.pread(fd, n, at), lambda: os.fstat(fd).st_size
        )
    except logfile.FileMovedError as exc:
        raise StorageError(f"cannot read where the log ends: {exc}") from None


def _keep(log: scanner.LogBytes, path: Path, start: int) -> Path:
    """Copy the bytes from ``start`` to the end beside the log (0600), durably, before they
    are cut: ``serverlog<N>.torn-<offset>``, or ``...-<k>`` if that name is taken by
    other bytes. Returns the copy's path."""
    for k in itertools.count():
        kept = path.with_name(f"{path.name}.torn-{start}" + (f"-{k}" if k else ""))
        try:
            out = create_private(kept, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            if _same_bytes(log, start, kept):
                return kept  # kept already by a recovery that crashed before the cut
            continue
        try:
            at = start
            while at < log.end:
                piece = log.read(scanner.CHUNK, at)
                if not piece:
                    break
                os.write(out, piece)
                at += len(piece)
            os.fsync(out)
        finally:
            os.close(out)
        fsync_dir(path.parent)
        return kept
    raise AssertionError("unreachable")  # pragma: no cover


def _same_bytes(log: scanner.LogBytes, start: int, other: Path) -> bool:
    try:
        if other.stat().st_size != log.end - start:
            return False
        with other.open("rb") as f:
            at = start
            while at < log.end:
                piece = log.read(scanner.CHUNK, at)
                if not piece or f.read(len(piece)) != piece:
                    return False
                at += len(piece)
    except OSError:
        return False
    return True


def _truncate(path: Path, length: int) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, length)
        os.fsync(fd)
    finally:
        os.close(fd)
