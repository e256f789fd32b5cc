"""Scanning a log file: verify it record by record and tell a torn tail from corruption.

Scanning a log (:class:`LogScan`, made by :meth:`.storage.InstanceFiles.scan_log`) streams
the file through :class:`ambrosia_py.wire.RecordReader` and verifies every record: check
bytes, committer id, consecutive sequence ids (across files: the caller passes the next
expected id). When a record fails, this module decides whether it is a *torn tail* (the
unfinished last write of a crashed coordinator, which recovery cuts off) or *corruption*
of input that was once durable (which must stop recovery:
:class:`~.errors.CorruptLogError`). A file with a live tail (a log being written, or left
by a crash: :mod:`ambrosia_py.wire.logfile`) is read up to where its records end, and
"the end of the file" below means there; a repairing scan truncates a live tail whose
last write finished. The rule:

* Damage starts at the offset of the first record that fails (records are contiguous, so
  that is the end of the last good record).
* A record whose check bytes verify but whose committer id or sequence id is wrong is
  never a torn write (a torn write cannot leave a complete body with matching check
  bytes); it is corruption, in any file (this covers sequence gaps across files).
* Any other failure is a torn tail only if the file is the last one (``last=True``),
  **no valid record follows the damaged point**, and the damaged bytes are what a write
  cut short leaves (below); otherwise it is corruption, and the file is left untouched.
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
* **What a cut write leaves** (:func:`_not_torn`): either only zero bytes (a file system
  that extended the file but lost the data after a power cut), or a *prefix of the record
  the log expects next*: the header bytes present agree with the expected committer id
  (the caller's, else the good records') and sequence id (when known), a length field,
  if present, is in on-disk form and in range, and the record is **cut short by the end
  of the file** (its stated length runs past it), or is complete and verified with only
  its watermark section cut; or, in a live tail, the first bytes of a write over the rest
  of the end marker before it (``logfile.cut_over_marker``). A record whose stated
  length fits in the file is complete: if its check bytes fail, it was damaged after it
  was written (perhaps acknowledged), and recovery stops, naming file, offset and seq.
* A damaged length field can make a complete last record look cut short. So a record
  that runs past the end is torn only if no shorter length makes it verify with its
  watermark section ending exactly at the end of the file (ends within the last 64 KiB
  are tried); if one does, the length was damaged and recovery stops.
* A torn tail that is cut (``repair=True``) is first copied, durably and 0600, beside the
  log as ``serverlog<N>.torn-<offset>``; ``damage.kept`` names the copy.

Limits: a damaged length that still runs past the end and matches no shorter record (the
damage hit the length *and* the body), or a flipped watermark count in the last record
that makes its section run past the end, cannot be told from a cut write: it is cut (and
kept). Zeros where a complete last record's body was (a lost page after a power cut) are
refused as damage, though that record was never acknowledged: the operator decides.

The check bytes cover the messages only (the on-disk watermarks are not covered; that is
the released format), so a flipped byte inside a watermark's fixed-size fields cannot be
detected by anyone; a flip that changes a watermark count or name length desynchronises
the stream and is found at the next record.
"""

from __future__ import annotations

import itertools
import os
import re
import struct
from collections.abc import Iterator
from pathlib import Path

import attrs
import xxhash

from .. import wire
from ..wire import logfile
from ..wire.records import HEADER
from .errors import CorruptLogError, StorageError
from .modes import create_private, fsync_dir

__all__ = ["LogScan", "TailDamage", "records_end"]

_CHUNK = 1 << 20  # bytes read per step while scanning
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_TAIL_WINDOW = 64 * 1024  # how far from the end a damaged length's true end is sought


@attrs.frozen
class TailDamage:
    """A torn or corrupt tail that was (``repair=True``) or would be cut off."""

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
                    self._damaged(fd, size, exc)
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
            if self.repair and self.damage is None and on_disk > size:
                _truncate(self.path, size)  # the live tail goes; the records are whole
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
        header = _pread(fd, wire.HEADER_SIZE, offset, size)
        if len(header) < wire.HEADER_SIZE:
            return True
        stored = int(_I32.unpack_from(header, 4)[0])
        return stored < 0 and offset + (-stored - 1) > size

    def _damaged(self, fd: int, size: int, exc: wire.ProtocolError | None) -> None:
        """Classify the failure at ``end_offset``: raise, or record (and cut) a torn tail."""
        start = self.end_offset
        header = _pread(fd, wire.HEADER_SIZE, start, size)
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
        committer = self._trusted_committer
        if committer is None:
            committer = self.committer_id
        damage = _not_torn(fd, start, size, committer, self.next_seq, self._max_record)
        if damage is not None:
            raise CorruptLogError(self.path, start, seq, f"{damage}; the file is left as it is")
        kept = _keep(fd, self.path, start, size) if self.repair else None
        self.damage = TailDamage(self.path, start, size - start, f"torn tail: {reason}", kept)
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


def _pread(fd: int, n: int, at: int, size: int) -> bytes:
    """``os.pread`` that stops at ``size``, where the records end: a live tail after them
    (``wire.logfile``) is not read."""
    return os.pread(fd, max(0, min(n, size - at)), at)


def _all_zero(fd: int, start: int, size: int) -> bool:
    """Whether every byte from ``start`` to the end of the file is zero."""
    at = start
    while at < size:
        piece = os.pread(fd, min(_CHUNK, size - at), at)
        if not piece or piece.count(0) != len(piece):
            return False
        at += len(piece)
    return True


def _header_problem(
    header: bytes, committer: int | None, seq: int | None, max_record: int
) -> str | None:
    """Why the header bytes present cannot begin the record this log expects next, or
    ``None``. Only the bytes present are judged: a cut header is a prefix of a good one."""
    n = len(header)
    if committer is not None:
        want = _I32.pack(committer)[: min(n, 4)]
        if header[: len(want)] != want:
            return (
                f"the header's committer id bytes {header[:4].hex()} are not those of "
                f"committer {committer}"
            )
    if n >= 8:
        stored = int(_I32.unpack_from(header, 4)[0])
        if stored >= 0:
            return f"the header's length field {stored} is not in on-disk form (negative)"
        length = -stored - 1
        if not wire.HEADER_SIZE <= length <= max_record:
            return f"the header's length {length} is outside {wire.HEADER_SIZE}..{max_record}"
    if seq is not None and n > 16:
        want = _I64.pack(seq)[: n - 16]
        if header[16:n] != want:
            return f"the header's sequence id bytes {header[16:n].hex()} are not those of seq {seq}"
    return None


def _not_torn(
    fd: int, start: int, size: int, committer: int | None, seq: int | None, max_record: int
) -> str | None:
    """Why the damaged bytes from ``start`` to the end are not a torn tail, or ``None``.

    A torn tail is what a write cut short by a crash leaves: all zeros (a file system that
    extended the file but lost the data), or a prefix of a record this log would hold
    next (see the module docstring). A record whose length fits in the file is complete:
    if it fails, it was damaged after it was written, and it may have been acknowledged.
    """
    if _all_zero(fd, start, size):
        return None
    header = _pread(fd, wire.HEADER_SIZE, start, size)
    over = logfile.cut_over_marker(header) if size - start == len(header) else None
    if over is not None and _header_problem(header[:over], committer, seq, max_record) is None:
        return None  # a write cut in its first bytes, over the end marker before it
    problem = _header_problem(header, committer, seq, max_record)
    if problem is not None:
        return f"not a record cut short: {problem}"
    if len(header) < wire.HEADER_SIZE:
        return None  # the header itself was cut
    parsed = wire.parse_header(header, on_disk=True, max_record_size=max_record)
    end = start + parsed.length
    if end <= size:
        if _body_hash(fd, start + wire.HEADER_SIZE, end) != parsed.check:
            return (
                f"a complete record ({parsed.length} bytes, all in the file) whose check "
                f"bytes do not match its body: damaged after it was written, not torn"
            )
        state = _tail_state(fd, end, size)
        if state == "cut":
            return None  # the write was cut inside the watermarks
        if state == "whole":
            return "a complete, verified record with whole watermarks failed to read"
        return f"a complete, verified record whose watermarks are malformed: {state}"
    shorter = _verifies_shorter(fd, start, size, parsed.check)
    if shorter is not None:
        return (
            f"the header states {parsed.length} bytes and {size - start} are present, but "
            f"the record verifies as {shorter} bytes with its watermarks ending the file: "
            f"a damaged length field, not a torn write"
        )
    return None


def _body_hash(fd: int, at: int, end: int) -> int:
    hasher = xxhash.xxh64()
    while at < end:  # in pieces: a record may be hundreds of megabytes
        piece = os.pread(fd, min(_CHUNK, end - at), at)
        if not piece:
            break
        hasher.update(piece)
        at += len(piece)
    return hasher.intdigest()


def _tail_state(fd: int, at: int, size: int) -> str:
    """``"whole"`` if the watermark section at ``at`` parses, ``"cut"`` if the end of the
    file cuts it, otherwise why it is malformed."""
    want = 256
    while True:
        tail = _pread(fd, want, at, size)
        try:
            wire.decode_disk_tail(tail)
        except wire.TruncatedInputError:
            if at + len(tail) >= size:
                return "cut"
            want *= 4
            continue
        except wire.ProtocolError as exc:
            return exc.reason
        return "whole"


def _verifies_shorter(fd: int, start: int, size: int, check: int) -> int | None:
    """The length with which the record at ``start`` verifies and its watermarks end the
    file exactly, if there is one: then its length field was damaged, not its write cut.

    Watermark sections are short, so only ends in the last :data:`_TAIL_WINDOW` bytes are
    tried (a damaged length with a longer section is not found, and the tail is cut).
    """
    low = max(start + wire.HEADER_SIZE, size - _TAIL_WINDOW)
    window = os.pread(fd, size - low, low)
    view = memoryview(window)
    for at in range(len(window) - 2, -1, -1):  # the shortest section is two bytes
        try:
            _, end = wire.decode_disk_tail(view, at)
        except wire.ProtocolError:
            continue
        if end == len(window) and _body_hash(fd, start + wire.HEADER_SIZE, low + at) == check:
            return low + at - start
    return None


def _keep(fd: int, path: Path, start: int, size: int) -> Path:
    """Copy the bytes from ``start`` to the end beside the log (0600), durably, before they
    are cut: ``serverlog<N>.torn-<offset>``, or ``...-<k>`` if that name is taken by
    other bytes. Returns the copy's path."""
    for k in itertools.count():
        kept = path.with_name(f"{path.name}.torn-{start}" + (f"-{k}" if k else ""))
        try:
            out = create_private(kept, os.O_WRONLY | os.O_EXCL)
        except FileExistsError:
            if _same_bytes(fd, start, size, kept):
                return kept  # kept already by a recovery that crashed before the cut
            continue
        try:
            at = start
            while at < size:
                piece = os.pread(fd, min(_CHUNK, size - at), at)
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


def _same_bytes(fd: int, start: int, size: int, other: Path) -> bool:
    try:
        if other.stat().st_size != size - start:
            return False
        with other.open("rb") as f:
            at = start
            while at < size:
                piece = os.pread(fd, min(_CHUNK, size - at), at)
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


def _record_at(
    fd: int, pos: int, size: int, committers: frozenset[int] | None, max_record: int
) -> bool:
    """Whether a complete, verifiable on-disk record (of one of ``committers``, if given)
    starts at ``pos``."""
    header = _pread(fd, wire.HEADER_SIZE, pos, size)
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
    # A (bogus) length may claim hundreds of megabytes: the body is hashed in pieces.
    if _body_hash(fd, pos + wire.HEADER_SIZE, pos + parsed.length) != parsed.check:
        return False
    return _tail_state(fd, pos + parsed.length, size) == "whole"


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
        chunk = _pread(fd, _CHUNK + overlap, pos, size)
        for match in pattern.finditer(chunk):
            if match.start() >= len(chunk) - overlap and pos + len(chunk) < size:
                break  # seen again, whole, in the next chunk
            if _record_at(fd, pos + match.start(), size, committers, max_record):
                return pos + match.start()
        pos += _CHUNK
    return None
