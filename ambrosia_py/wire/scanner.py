"""The one log scanner: which bytes of a log file are records, and what the rest is.

Recovery (``coordinator/storage/scan.py``) and the Spark reader (``spark/scan.py``) read a log's
good records each their own fast way (:class:`~.reader.RecordReader`; a window of bytes).
Where the bytes at an offset do not read as a record, both ask this module what they are,
so both hold the same records of every log. It owns:

* :func:`record_at`: whether a *valid record* starts at an offset: a header whose length
  field is in on-disk form (``-length-1``) and in range, whose committer id is one of
  those sought (if any are), that ends by the end of the bytes, whose watermark sections
  parse there and whose check bytes match its body (0 for a checkpoint record, seq -2,
  as :func:`~.records.verify_check` has it).
* :func:`find_record`: the first valid record after damage, of the committers
  :func:`search_committers` names: the caller's if it trusts one (recovery: the
  instance's), else the one of the good records before the damage and the one the damaged
  header states (if it parses); any committer when neither is known. Every byte offset is
  considered, not just the one a (possibly corrupt) length field points at, so a corrupt
  length cannot hide the records behind it. Candidates are found with a regular
  expression over the header's fixed-position bytes (committer id, the sign byte of the
  length), so the search runs at memory speed, chunk by chunk. A valid record embedded in
  a damaged record's body counts too: the search errs towards damage, never towards
  dropping what follows.
* :func:`judge`: the torn-tail rule, recovery's safety (reference ambrosia.md, *Files on
  disk*; ``docs/security.md``). Damage starts at the offset of the first record that
  fails (records are contiguous, so that is the end of the last good record). Then, in
  this order:

  1. The reader refused the record for its committer id or seq alone and it is a valid
     record: it is *intact*. A torn write cannot leave a complete body with matching
     check bytes, so this is damage, in any file (a sequence gap across files too).
  2. A valid record follows: damage. The coordinator appends one batch per write and
     makes it durable before the next, so an unfinished write is always at the very end;
     data behind a damaged record was acknowledged once and must not be dropped.
  3. The bytes do not end the last log (``last`` false: an older log, or a range a
     record is known to follow): damage.
  4. The bytes are not what a cut write leaves (:func:`why_not_torn`): damage.
  5. Otherwise: a *torn tail*, the unfinished last write of a coordinator that crashed.

* **What a cut write leaves** (:func:`why_not_torn`): either only zero bytes (a file system
  that extended the file but lost the data after a power cut), or a *prefix of the
  record the log expects next*: the header bytes present agree with the expected
  committer id and sequence id (when known), a length field, if present, is in on-disk
  form and in range, and the record is **cut short by the end** (its stated length runs
  past it), or is complete and verified with only its watermark sections (or a
  Checkpoint's blob, which follows them) cut; or, in a live tail, the first bytes of a
  write over the rest of the end marker before it (``logfile.cut_over_marker``). A
  record whose stated length fits is complete: if its check bytes fail, it was damaged
  after it was written (perhaps acknowledged).
* **The tail window.** A damaged length field can make a complete last record look cut
  short. So a record that runs past the end is torn only if no shorter length makes it
  verify with its watermark sections ending exactly at the end (ends within the last
  :data:`TAIL_WINDOW` bytes are tried); if one does, the length was damaged.

Limits: a damaged length that still runs past the end and matches no shorter record (the
damage hit the length *and* the body), or a flipped watermark count in the last record
that makes its sections run past the end, cannot be told from a cut write: it is torn.
Zeros where a complete last record's body was (a lost page after a power cut) are damage,
though that record was never acknowledged: the operator decides. The check bytes cover
the messages only (the released format), so a flipped byte inside a watermark's
fixed-size fields cannot be detected by anyone; a flip that changes a watermark count or
name length breaks the record's framing (then it is not a valid record) or
desynchronises the stream (found at the next record).

Callers apply the same rule, strictly or leniently: a *strict* caller stops at the first
damage (recovery raises ``CorruptLogError`` and cuts a torn tail; Spark with
``on_damage=fail`` raises ``LogDamageError``); a *lenient* caller reports the damage and
reads on from the record that follows it (Spark with ``on_damage=report``). Both end a
file's records at a torn tail.

Sans-IO: the caller passes how to read the file (``pread(size, offset)``), as
:mod:`.logfile` has it, and where its records end.
"""

from __future__ import annotations

import contextlib
import enum
import re
import struct

import attrs
import xxhash

from . import logfile
from .decoding import decode_messages
from .errors import ProtocolError, TruncatedInputError
from .messages import CheckpointHeader
from .records import (
    CHECKPOINT_SEQ,
    DEFAULT_MAX_RECORD_SIZE,
    HEADER_SIZE,
    RecordHeader,
    decode_disk_tail,
    parse_header,
)

__all__ = [
    "CHUNK",
    "TAIL_PROBE",
    "TAIL_WINDOW",
    "Damage",
    "LogBytes",
    "Verdict",
    "cut_failure",
    "find_record",
    "judge",
    "record_at",
    "runs_past",
    "search_committers",
    "why_not_torn",
]

CHUNK = 1 << 20  # bytes read per step while searching, hashing or checking for zeros
TAIL_PROBE = 256  # watermark bytes read first (most sections are shorter)
TAIL_WINDOW = 64 * 1024  # how far from the end a damaged length's true end is sought
_PATTERN_WIDTH = 8  # a candidate is told by the header's first 8 bytes
_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")


@attrs.frozen
class LogBytes:
    """The bytes ``[0, end)`` of a log file, read through ``pread`` (``(size, offset) ->
    bytes``, short at the end). ``end`` is where its records end (its size less a live
    tail: :mod:`.logfile`), or where a reader's range ends; nothing at or after it is
    read, and records must end by it."""

    pread: logfile.Pread
    end: int
    max_record: int = DEFAULT_MAX_RECORD_SIZE

    def read(self, n: int, at: int) -> bytes:
        """Up to ``n`` bytes at ``at``, stopping at :attr:`end`."""
        n = min(n, self.end - at)
        return self.pread(n, at) if n > 0 else b""

    def check(self, start: int, stop: int) -> int:
        """XXH64 of bytes ``[start, stop)``, read in pieces (a bogus length may claim
        hundreds of megabytes)."""
        hasher = xxhash.xxh64()
        while start < stop:
            piece = self.read(min(CHUNK, stop - start), start)
            if not piece:
                break
            hasher.update(piece)
            start += len(piece)
        return int(hasher.intdigest())


def _sections(log: LogBytes, at: int) -> int | str | None:
    """Where the watermark sections at ``at`` end if they parse by ``log.end``; ``None``
    if the end (or a file that shrank meanwhile) cuts them; else why they are malformed."""
    want = TAIL_PROBE
    while True:
        data = log.read(want, at)
        try:
            _, used = decode_disk_tail(data)
        except TruncatedInputError:
            if at + len(data) >= log.end or len(data) < want:
                return None
            want *= 4
            continue
        except ProtocolError as exc:
            return exc.reason
        return at + used


def _verifies(log: LogBytes, pos: int, header: RecordHeader) -> bool:
    if header.seq == CHECKPOINT_SEQ:
        return header.check == 0
    return log.check(pos + HEADER_SIZE, pos + header.length) == header.check


def record_at(
    log: LogBytes, pos: int, committers: frozenset[int] | None = None
) -> RecordHeader | None:
    """The header of the valid record at ``pos`` (see the module docstring), of one of
    ``committers`` if given, else ``None``."""
    raw = log.read(HEADER_SIZE, pos)
    if len(raw) < HEADER_SIZE:
        return None
    try:
        header = parse_header(raw, on_disk=True, max_record_size=log.max_record)
    except ProtocolError:
        return None
    if committers is not None and header.committer_id not in committers:
        return None
    if pos + header.length > log.end:
        return None
    if not isinstance(_sections(log, pos + header.length), int):
        return None  # checked before the body: reading a few bytes is cheaper than hashing
    return header if _verifies(log, pos, header) else None


def _candidates(
    committers: frozenset[int] | None, remaining: int, max_record: int
) -> re.Pattern[bytes]:
    """Offsets whose bytes could start an on-disk header: a committer id sought (any if
    ``None``), then a length field whose top byte fits a negative length no larger than
    the rest of the bytes."""
    longest = min(remaining, max_record)
    lowest = (-longest - 1) >> 24  # top byte (signed) of the most negative allowed field
    top = re.escape(bytes([lowest & 0xFF])) + b"-\xff" if lowest < -1 else b"\xff"
    if committers is None:
        who = b"...."
    else:
        who = b"|".join(re.escape(_I32.pack(c)) for c in sorted(committers))
    return re.compile(b"(?=(?:" + who + b")...[" + top + b"])", re.DOTALL)


def find_record(
    log: LogBytes, start: int, committers: frozenset[int] | None, stop: int | None = None
) -> int | None:
    """The first offset in ``[start, stop)`` (``stop``: the end) where a valid record of
    one of ``committers`` (any committer if ``None``) starts."""
    stop = log.end if stop is None else min(stop, log.end)
    if log.end - start < HEADER_SIZE or (committers is not None and not committers):
        return None
    pattern = _candidates(committers, log.end - start, log.max_record)
    at = start
    while at < stop:
        step = min(CHUNK, stop - at)
        chunk = log.read(step + _PATTERN_WIDTH - 1, at)
        for match in pattern.finditer(chunk):
            if match.start() >= step:
                break  # the next chunk starts there
            if record_at(log, at + match.start(), committers) is not None:
                return at + match.start()
        at += step
    return None


def search_committers(
    log: LogBytes, start: int, committer: int | None, *, trusted: bool = False
) -> frozenset[int] | None:
    """Whose records count as following damage at ``start``: ``committer`` alone if the
    caller trusts it (recovery's, from the instance's state); otherwise the expected one
    (the good records') and the one the damaged header states, if it parses; ``None``
    (any committer) when neither is known."""
    if trusted and committer is not None:
        return frozenset((committer,))
    found = set() if committer is None else {committer}
    raw = log.read(HEADER_SIZE, start)
    if len(raw) == HEADER_SIZE:
        with contextlib.suppress(ProtocolError):  # a header that does not parse says nothing
            found.add(parse_header(raw, on_disk=True, max_record_size=log.max_record).committer_id)
    return frozenset(found) if found else None


def runs_past(log: LogBytes, pos: int) -> bool:
    """Whether the record at ``pos`` cannot end by ``log.end``: its header is cut, or its
    length field (in on-disk form) states more bytes than are left. A reader asks before
    reading on, so that a corrupt length never makes it wait for the rest of the file."""
    raw = log.read(HEADER_SIZE, pos)
    if len(raw) < HEADER_SIZE:
        return True
    stored = int(_I32.unpack_from(raw, 4)[0])
    return stored < 0 and pos + (-stored - 1) > log.end


def cut_failure(log: LogBytes, pos: int) -> str:
    """What failed at ``pos`` when the bytes there run past the end."""
    present = log.end - pos
    if present < HEADER_SIZE:
        return f"incomplete record header ({present} of {HEADER_SIZE} bytes)"
    return f"record or its watermarks run past the end ({present} bytes present)"


class Verdict(enum.Enum):
    """What damaged bytes are (the order :func:`judge` decides in)."""

    INTACT = "intact"  # a valid record whose committer id or seq the reader refused
    FOLLOWED = "followed"  # a valid record follows
    NOT_LAST = "not last"  # the bytes do not end the last log
    NOT_TORN = "not torn"  # not what a cut write leaves
    TORN = "torn"  # the unfinished last write: cut (recovery), ends the records (readers)


@attrs.frozen
class Damage:
    """Bytes from ``offset`` that do not read as a record, judged. ``failure`` says what
    failed there; ``follower`` is the valid record that follows (``FOLLOWED``);
    ``problem`` why the bytes are not a cut write (``NOT_TORN``)."""

    offset: int
    verdict: Verdict
    failure: str
    follower: int | None = None
    problem: str | None = None

    @property
    def torn(self) -> bool:
        return self.verdict is Verdict.TORN

    @property
    def reason(self) -> str:
        """The failure and the verdict, in one line."""
        verdict = self.verdict
        if verdict is Verdict.INTACT:
            return f"{self.failure}; the record itself is intact, not a torn write"
        if verdict is Verdict.FOLLOWED:
            return f"{self.failure}; a valid record follows at offset {self.follower}"
        if verdict is Verdict.NOT_LAST:
            return f"{self.failure} in a log that is not the last"
        if verdict is Verdict.NOT_TORN:
            return f"{self.problem}"
        return f"torn tail: {self.failure}"


def judge(
    log: LogBytes,
    start: int,
    failure: str,
    *,
    last: bool,
    committer: int | None,
    seq: int | None,
    trusted: bool = False,
    wrong_ids: bool = False,
) -> Damage:
    """Judge the bytes from ``start`` (where ``failure`` happened) to ``log.end``: torn
    tail or damage (the rule is the module docstring's).

    ``last``: the bytes end the last log, where a crash may have cut a write. ``committer``
    and ``seq``: what the record there should carry (the caller's, or after the good
    records before; ``None`` if unknown); ``trusted``: ``committer`` is the instance's
    own, not inferred. ``wrong_ids``: the reader refused the record for its committer id
    or seq alone.
    """
    if wrong_ids and record_at(log, start) is not None:
        return Damage(start, Verdict.INTACT, failure)
    whose = search_committers(log, start, committer, trusted=trusted)
    follower = find_record(log, start + 1, whose)
    if follower is not None:
        return Damage(start, Verdict.FOLLOWED, failure, follower=follower)
    if not last:
        return Damage(start, Verdict.NOT_LAST, failure)
    problem = why_not_torn(log, start, committer, seq)
    if problem is not None:
        return Damage(start, Verdict.NOT_TORN, failure, problem=problem)
    return Damage(start, Verdict.TORN, failure)


def why_not_torn(log: LogBytes, start: int, committer: int | None, seq: int | None) -> str | None:
    """Why the bytes from ``start`` to the end are not what a write cut short leaves, or
    ``None`` if they are (see the module docstring). ``committer`` and ``seq``: what the
    record expected next carries, where known."""
    if _all_zero(log, start):
        return None
    header = log.read(HEADER_SIZE, start)
    over = logfile.cut_over_marker(header) if log.end - start == len(header) else None
    if over is not None and _header_problem(header[:over], committer, seq, log.max_record) is None:
        return None  # a write cut in its first bytes, over the end marker before it
    problem = _header_problem(header, committer, seq, log.max_record)
    if problem is not None:
        return f"not a record cut short: {problem}"
    if len(header) < HEADER_SIZE:
        return None  # the header itself was cut
    parsed = parse_header(header, on_disk=True, max_record_size=log.max_record)
    stop = start + parsed.length
    if stop <= log.end:
        if not _verifies(log, start, parsed):
            return (
                f"a complete record ({parsed.length} bytes, all in the file) whose check "
                f"bytes do not match its body: damaged after it was written, not torn"
            )
        after = _sections(log, stop)
        if after is None or (isinstance(after, int) and _blobs_cut(log, start, parsed, after)):
            return None  # the write was cut inside the watermarks, or a checkpoint's blob
        if isinstance(after, str):
            return f"a complete, verified record whose watermarks are malformed: {after}"
        return "a complete, verified record with whole watermarks failed to read"
    shorter = _verifies_shorter(log, start, parsed.check)
    if shorter is not None:
        return (
            f"the header states {parsed.length} bytes and {log.end - start} are present, "
            f"but the record verifies as {shorter} bytes with its watermarks ending the "
            f"file: a damaged length field, not a torn write"
        )
    return None


def _all_zero(log: LogBytes, start: int) -> bool:
    at = start
    while at < log.end:
        piece = log.read(CHUNK, at)
        if not piece or piece.count(0) != len(piece):
            return False
        at += len(piece)
    return True


def _header_problem(
    header: bytes, committer: int | None, seq: int | None, max_record: int
) -> str | None:
    """Why the header bytes present cannot begin the record the log expects next, or
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
        if not HEADER_SIZE <= length <= max_record:
            return f"the header's length {length} is outside {HEADER_SIZE}..{max_record}"
    if seq is not None and n > 16:
        want = _I64.pack(seq)[: n - 16]
        if header[16:n] != want:
            return f"the header's sequence id bytes {header[16:n].hex()} are not those of seq {seq}"
    return None


def _blobs_cut(log: LogBytes, start: int, header: RecordHeader, after: int) -> bool:
    """Whether the checkpoint blobs the record's messages announce (they follow its
    watermarks) run past the end. Coordinators never log one; the released form may."""
    body = log.read(header.length - HEADER_SIZE, start + HEADER_SIZE)
    try:
        messages = decode_messages(body, 0, len(body))
    except ProtocolError:
        return False
    blobs = sum(m.length for m in messages if isinstance(m, CheckpointHeader))
    return blobs > 0 and after + blobs > log.end


def _verifies_shorter(log: LogBytes, start: int, check: int) -> int | None:
    """The length with which the record at ``start`` verifies and its watermarks end the
    bytes exactly, if there is one: then its length field was damaged, not its write cut.
    Watermark sections are short, so only ends in the last :data:`TAIL_WINDOW` bytes are
    tried (a damaged length with a longer section is not found, and the tail is torn)."""
    low = max(start + HEADER_SIZE, log.end - TAIL_WINDOW)
    window = memoryview(log.read(log.end - low, low))
    for at in range(len(window) - 2, -1, -1):  # the shortest sections are two bytes
        try:
            _, end = decode_disk_tail(window, at)
        except ProtocolError:
            continue
        if end == len(window) and log.check(start + HEADER_SIZE, low + at) == check:
            return low + at - start
    return None
