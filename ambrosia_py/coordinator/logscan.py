"""Scanning a log file: verify it record by record and tell a torn tail from corruption.

Scanning a log (:class:`LogScan`, made by :meth:`.storage.InstanceFiles.scan_log`) streams
the file through :class:`ambrosia_py.wire.RecordReader` and verifies every record: check
bytes, committer id, consecutive sequence ids (across files: the caller passes the next
expected id). When a record fails, this module decides whether it is a *torn tail* (the
unfinished last write of a crashed coordinator, which recovery cuts off) or *corruption*
of input that was once durable (which must stop recovery:
:class:`~.errors.CorruptLogError`). The rule:

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

import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs
import xxhash

from .. import wire
from ..wire.records import HEADER
from .errors import CorruptLogError, StorageError

__all__ = ["LogScan", "TailDamage"]

_CHUNK = 1 << 20  # bytes read per step while scanning
_I32 = struct.Struct("<i")


@attrs.frozen
class TailDamage:
    """A torn or corrupt tail that was (``repair=True``) or would be cut off."""

    path: Path
    offset: int
    dropped_bytes: int
    reason: str


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
