"""Reading the records in a byte range of one log file, damage and torn tails included.

The on-disk form is the released AMBROSIA's (reference ambrosia.md, Files on disk): the
24-byte header with the length stored as ``-length-1``, the framed messages, the
watermark sections; a Checkpoint message's blob follows the record (as
:class:`ambrosia_py.wire.RecordReader` reads it). Records are parsed with the wire
package's own functions, so this reader agrees with the coordinator on every byte.

What comes out of a range (:func:`read_span`), one :class:`Record` at a time:

* A record whose check bytes verify: its decoded messages (batches are kept whole here;
  :mod:`.rows` flattens them). If its messages do not decode, the log is not one this
  reader understands: :class:`~.errors.LogFormatError`, naming file, offset and seq.
* A record whose framing holds but whose check bytes fail: a damaged record
  (``check_ok`` false, no messages). If a valid record starts inside the extent it claims,
  its length was damaged: the damaged record ends there.
* A record whose check bytes verify but whose committer id and seq (which they do not
  cover) agree with neither neighbouring record: a damaged record too (see
  :meth:`_SpanScan.records`).
* Bytes that cannot be framed as a record (a bad header or watermark section, or a
  record running past the range), followed by a valid record: a damaged region, from the
  failure to that record (``check_ok`` false, no messages).
* Bytes at the end of the file that cannot be framed and that no valid record follows: a
  torn tail (the last write of a coordinator that crashed, or one being written now).
  It ends the file's rows, as recovery would cut it. As in the coordinator's log scan, a
  last record that runs past the end but verifies with a shorter length ending the file
  is not torn but damaged (its length field). The limit is the log scan's too: a flipped
  watermark count in the last record that runs past the end looks like a write cut inside
  the watermarks, and ends the rows.

With ``fail_on_damage`` a damaged record or region raises
:class:`~.errors.LogDamageError` instead. A valid record is one whose header is in
on-disk form and in range, whose check bytes match and whose watermark sections parse,
all inside the range; candidates after a failure are offsets whose length field is
negative and whose committer id is one already seen (or, for records under 16 MiB, any
committer id), so the search is cheap and bounded by the distance to the next record.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import attrs
import xxhash

from .. import wire
from ..coordinator.logindex import IndexEntry
from ..wire.records import HEADER
from .errors import LogDamageError, LogFormatError
from .frames import frame_ends
from .fs import Location, LogInput

__all__ = [
    "Neighbour",
    "Record",
    "Span",
    "decode_body",
    "messages_of",
    "read_span",
    "verify_record_at",
    "whole_end",
]

_CHUNK = 4 << 20  # bytes read per refill
_SEARCH = 8 << 20  # bytes searched per step after a failure
_TAIL_PROBE = 256
_TAIL_WINDOW = 64 * 1024  # how far from the end a damaged length's true end is sought


@attrs.frozen
class Neighbour:
    """The committer id and seq of the record just before or after a span."""

    committer: int
    seq: int


@attrs.frozen
class Span:
    """Bytes ``[start, end)`` of a log. ``final``: ``end`` is where the file ended when the
    span was planned, so a record cut there is a torn tail; otherwise a record starts at
    ``end`` (a verified index entry, or the end of a record seen earlier). ``before`` and
    ``after``, when known, are the records around the span (for the neighbour check)."""

    start: int
    end: int
    final: bool
    before: Neighbour | None = None
    after: Neighbour | None = None


@attrs.define(slots=True)
class Record:
    """A record, or a damaged record or region (``check_ok`` false, no messages).

    ``messages`` is ``None`` until decoded (:func:`messages_of`): most records are read
    without making message objects (:mod:`.rows` and :mod:`.calls` read calls straight
    from the bytes). The framed messages are ``body``, which is ``raw[body_start:]`` up
    to its length. A record holding only RPC messages has ``ends``, where each ends in
    ``raw`` (:mod:`.frames`); any other is decoded at once (a Checkpoint's blobs, which
    follow the record, attached).
    """

    offset: int
    size: int  # on-disk bytes: header, messages, watermarks, checkpoint blobs
    committer: int | None
    seq: int | None
    check_ok: bool
    body: memoryview | None  # the framed messages
    messages: list[wire.Message] | None
    commit_time_ns: int | None
    raw: bytes = b""
    body_start: int = 0
    ends: Any = None  # where each framed message ends in ``raw`` (:mod:`.frames`)


class _Cut(Exception):
    """The record at the position runs past the end of the range."""


def _tail_end(src: LogInput, at: int, end: int) -> int | None:
    """The end of the watermark sections at ``at`` if they parse within ``end``."""
    want = _TAIL_PROBE
    while True:
        data = src.pread(min(want, end - at), at)
        try:
            _, used = wire.decode_disk_tail(data)
        except wire.TruncatedInputError:
            if at + len(data) >= end:
                return None
            want *= 4
            continue
        except wire.ProtocolError:
            return None
        return at + used


def _body_check(src: LogInput, start: int, stop: int) -> int:
    hasher = xxhash.xxh64()
    while start < stop:
        piece = src.pread(min(_CHUNK, stop - start), start)
        if not piece:
            break
        hasher.update(piece)
        start += len(piece)
    return int(hasher.intdigest())


def verify_record_at(
    src: LogInput, pos: int, end: int, max_record: int = wire.DEFAULT_MAX_RECORD_SIZE
) -> wire.RecordHeader | None:
    """The header of a valid on-disk record at ``pos`` that ends by ``end``, else ``None``."""
    raw = src.pread(wire.HEADER_SIZE, pos)
    if len(raw) < wire.HEADER_SIZE:
        return None
    try:
        header = wire.parse_header(raw, on_disk=True, max_record_size=max_record)
    except wire.ProtocolError:
        return None
    stop = pos + header.length
    if stop > end:
        return None
    if header.seq == wire.CHECKPOINT_SEQ:
        if header.check != 0:
            return None
    elif _body_check(src, pos + wire.HEADER_SIZE, stop) != header.check:
        return None
    return header if _tail_end(src, stop, end) is not None else None


def decode_body(path: str, record: Record) -> list[wire.Message]:
    """The messages of a record whose check bytes verify; if they do not decode, the log
    is not one this reader understands: :class:`LogFormatError`."""
    assert record.body is not None
    try:
        return wire.decode_messages(record.body, 0, len(record.body))
    except wire.ProtocolError as exc:
        at = record.offset + wire.HEADER_SIZE + (exc.offset or 0)
        raise LogFormatError(
            path,
            f"the record's check bytes verify but its messages do not decode: "
            f"{exc.reason} (at offset {at})",
            offset=record.offset,
            seq=record.seq,
        ) from None


def messages_of(path: str, record: Record) -> list[wire.Message]:
    """The record's messages, decoded now if they were not yet (see :class:`Record`)."""
    if record.messages is None:
        record.messages = decode_body(path, record)
    return record.messages


def _candidates(committers: set[int]) -> re.Pattern[bytes]:
    """Offsets that could start an on-disk header: a known committer id then a negative
    length field, or any committer id then the top byte of a length under 16 MiB."""
    known = b"|".join(re.escape(c.to_bytes(4, "little", signed=True)) for c in sorted(committers))
    alternatives = [known + b"...[\x80-\xff]"] if known else []
    alternatives.append(b".......\xff")
    return re.compile(b"(?=(?:" + b"|".join(alternatives) + b"))", re.DOTALL)


class _SpanScan:
    def __init__(
        self,
        src: LogInput,
        path: str,
        span: Span,
        entries: Sequence[IndexEntry],
        fail_on_damage: bool,
        max_record: int,
    ) -> None:
        self.src = src
        self.path = path
        self.span = span
        self.fail = fail_on_damage
        self.max_record = max_record
        self.base = span.start
        self.data = b""
        self.committers: set[int] = set()
        self.times = {e.offset: e for e in entries if span.start <= e.offset < span.end}
        self.time_ns = self._time_before(entries)

    def _time_before(self, entries: Sequence[IndexEntry]) -> int | None:
        """The time of the last verified index entry before the span, if one of the last
        few before it verifies (the span's records come after it)."""
        before = [e for e in entries if e.offset < self.span.start][-3:]
        size = self.src.data_size()
        for e in reversed(before):
            header = verify_record_at(self.src, e.offset, size, self.max_record)
            if header is not None and header.seq == e.seq:
                return e.time_ns
        return None

    # --- the window of bytes ---------------------------------------------------------

    def _ensure(self, pos: int, stop: int) -> bool:
        """Make bytes ``[pos, stop)`` available; False if they run past the range or file."""
        if stop > self.span.end:
            return False
        have = self.base + len(self.data)
        if stop <= have:
            return True
        keep = self.data[pos - self.base :] if pos < have else b""
        at = pos + len(keep)
        want = min(max(stop - at, _CHUNK), self.span.end - at)
        chunk = self.src.pread(want, at)
        self.data = keep + chunk
        self.base = pos
        return self.base + len(self.data) >= stop

    # --- one record ------------------------------------------------------------------

    def _tail(self, pos: int, at: int) -> int:
        """The end of the watermark sections at ``at`` (the record starts at ``pos``)."""
        want = _TAIL_PROBE
        while True:
            whole = self._ensure(pos, at + want)
            if not whole:
                self._ensure(pos, self.span.end)
            try:
                _, used = wire.decode_disk_tail(memoryview(self.data), at - self.base)
            except wire.TruncatedInputError:
                if not whole:
                    if self.span.final:
                        raise _Cut() from None
                    raise  # a record starts at the end of the span: these are damaged
                want *= 4
                continue
            return self.base + used

    def _record_at(self, pos: int) -> tuple[Record, int]:
        """The record at ``pos`` and the offset after it; raises :class:`_Cut` or a
        :class:`wire.ProtocolError` when the bytes cannot be framed as a record."""
        if not self._ensure(pos, pos + wire.HEADER_SIZE):
            raise _Cut()
        header = wire.parse_header(
            self.data, pos - self.base, on_disk=True, max_record_size=self.max_record
        )
        stop = pos + header.length
        if not self._ensure(pos, stop):
            raise _Cut()
        try:
            after = self._tail(pos, stop)
        except wire.ProtocolError:
            # Damaged watermarks (not covered by the check bytes): the record ends at its
            # messages, and the next step reports the watermarks as a damaged region.
            after = stop
        off = pos - self.base
        body = memoryview(self.data)[off + wire.HEADER_SIZE : off + header.length]
        if header.seq == wire.CHECKPOINT_SEQ:
            check_ok = header.check == 0
        else:
            check_ok = wire.check_bytes(body) == header.check
        if not check_ok:
            damaged = Record(
                pos, after - pos, header.committer_id, header.seq, False, None, [], None
            )
            return damaged, after
        record = Record(
            pos,
            0,
            header.committer_id,
            header.seq,
            True,
            body,
            None,
            None,
            self.data,
            off + wire.HEADER_SIZE,
        )
        record.ends = frame_ends(self.data, off + wire.HEADER_SIZE, off + header.length)
        if record.ends is None:
            # A Checkpoint's blob follows the record: decode to learn its length.
            messages = decode_body(self.path, record)
            for i, msg in enumerate(messages):
                if isinstance(msg, wire.CheckpointHeader):
                    if not self._ensure(pos, after + msg.length):
                        raise _Cut()
                    at = after - self.base
                    messages[i] = wire.Checkpoint(memoryview(self.data)[at : at + msg.length])
                    after += msg.length
            record.messages = messages
        self.committers.add(header.committer_id)
        entry = self.times.get(pos)
        if entry is not None and entry.seq == header.seq:
            self.time_ns = entry.time_ns
        record.size = after - pos
        record.commit_time_ns = self.time_ns
        return record, after

    # --- after a failure -------------------------------------------------------------

    def _find(self, lo: int, hi: int) -> int | None:
        """The first offset in ``[lo, hi)`` where a valid record (ending inside the range)
        starts."""
        pattern = _candidates(self.committers)
        overlap = wire.HEADER_SIZE - 1
        at = lo
        while at < hi:
            chunk = self.src.pread(min(_SEARCH, hi - at) + overlap, at)
            for m in pattern.finditer(chunk):
                q = at + m.start()
                if q >= hi:
                    break
                if verify_record_at(self.src, q, self.span.end, self.max_record) is not None:
                    return q
            at += _SEARCH
        return None

    def _length_damaged(self, pos: int) -> bool:
        """Whether the record at ``pos``, which runs past the end, verifies with a shorter
        length and watermarks that end the range exactly: a damaged length field, not a
        cut write (as the coordinator's log scan judges it). Ends within the last
        :data:`_TAIL_WINDOW` bytes are tried."""
        raw = self.src.pread(wire.HEADER_SIZE, pos)
        if len(raw) < wire.HEADER_SIZE:
            return False
        check = int(HEADER.unpack(raw)[2])  # whatever the (damaged) length field says
        end = self.span.end
        low = max(pos + wire.HEADER_SIZE, end - _TAIL_WINDOW)
        window = memoryview(self.src.pread(end - low, low))
        for at in range(len(window) - 2, -1, -1):  # the shortest watermarks are two bytes
            try:
                _, stop = wire.decode_disk_tail(window, at)
            except wire.ProtocolError:
                continue
            if (
                stop == len(window)
                and _body_check(self.src, pos + wire.HEADER_SIZE, low + at) == check
            ):
                return True
        return False

    def _region(self, pos: int, stop: int, reason: str, seq: int | None) -> Record:
        if self.fail:
            raise LogDamageError(self.path, reason, offset=pos, seq=seq)
        return Record(pos, stop - pos, None, None, False, None, [], None)

    def records(self) -> Iterator[Record]:
        """The span's records, each whose check bytes verify checked against its neighbours.

        The check bytes do not cover the header, so a flipped committer id or seq would
        pass them: a record must agree with the record before it (same committer, the next
        seq) or with the one after it, when it has either. One that agrees with neither is
        damaged. Records in a log share the committer id and count up by one.
        """
        before = self.span.before
        expect = None if before is None else (before.committer, before.seq + 1)
        pending: Record | None = None
        for item in self._items():
            if pending is not None:
                expect = yield from self._settle(pending, expect, item if item.check_ok else None)
                pending = None
            if item.check_ok:
                pending = item
                continue
            yield item
            if item.seq is None:  # a region: how many records it held is unknown
                expect = None
            elif expect is not None:  # a damaged record took its seq
                expect = (expect[0], expect[1] + 1)
        if pending is not None:
            after = self.span.after
            nxt = (
                None
                if after is None
                else Record(0, 0, after.committer, after.seq, True, None, [], None)
            )
            yield from self._settle(pending, expect, nxt)

    def _settle(
        self, record: Record, expect: tuple[int, int] | None, nxt: Record | None
    ) -> Generator[Record, None, tuple[int, int] | None]:
        """Yield ``record`` as it is, or damaged if it agrees with neither neighbour;
        return the committer and seq the next record must have."""
        agrees_before = expect is not None and (record.committer, record.seq) == expect
        agrees_after = (
            nxt is not None
            and record.seq is not None
            and (nxt.committer, nxt.seq) == (record.committer, record.seq + 1)
        )
        if agrees_before or agrees_after or (expect is None and nxt is None):
            assert record.committer is not None and record.seq is not None
            yield record
            return record.committer, record.seq + 1
        wanted = "" if expect is None else f" (committer {expect[0]}, seq {expect[1]} expected)"
        if self.fail:
            raise LogDamageError(
                self.path,
                f"the header's committer id {record.committer} and seq {record.seq} do not "
                f"follow the records around it{wanted}",
                offset=record.offset,
                seq=record.seq,
            )
        yield Record(
            record.offset, record.size, record.committer, record.seq, False, None, [], None
        )
        return None if expect is None else (expect[0], expect[1] + 1)

    def _items(self) -> Iterator[Record]:
        pos = self.span.start
        end = self.span.end
        while pos < end:
            try:
                record, after = self._record_at(pos)
            except (_Cut, wire.ProtocolError) as exc:
                follower = self._find(pos + 1, end)
                if follower is None:
                    if self.span.final and not self._length_damaged(pos):
                        return  # a torn tail
                    follower = end
                if isinstance(exc, _Cut):
                    reason = f"damaged region of {follower - pos} bytes: no record can be framed"
                else:
                    reason = f"damaged region of {follower - pos} bytes: {exc.reason}"
                yield self._region(pos, follower, reason, None)
                pos = follower
                continue
            if not record.check_ok:
                # A valid record inside the claimed extent: the length field was damaged.
                follower = self._find(pos + 1, after)
                stop = after if follower is None else follower
                if self.fail:
                    raise LogDamageError(
                        self.path,
                        "check bytes do not match the record's contents",
                        offset=pos,
                        seq=record.seq,
                    )
                record.size = stop - pos
                yield record
                pos = stop
                continue
            yield record
            pos = after


def read_span(
    location: Location,
    span: Span,
    entries: Sequence[IndexEntry] = (),
    *,
    fail_on_damage: bool = False,
    max_record_size: int = wire.DEFAULT_MAX_RECORD_SIZE,
) -> Iterator[Record]:
    """The records in ``span`` of the log at ``location`` (see the module docstring).

    ``entries`` are the log's index entries (for ``commit_time``); each is trusted only
    where a record with its seq is found at its offset.
    """
    with location.open() as src:
        scan = _SpanScan(src, location.shown, span, entries, fail_on_damage, max_record_size)
        yield from scan.records()


def whole_end(location: Location, start: int, end: int) -> int:
    """Where the whole records (and damaged regions a valid record follows) from
    ``start`` end, up to ``end``: what a reader may take now of a log still being written."""
    stop = start
    for record in read_span(location, Span(start, end, final=True)):
        stop = record.offset + record.size
    return stop
