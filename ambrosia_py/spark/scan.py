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
* Bytes that cannot be framed as a valid record (a bad header, watermark sections that do
  not parse, a record running past the range) that are not a torn tail: a damaged
  region, from the failure to the next valid record, or to the end of the range
  (``check_ok`` false, no messages).
* A torn tail (the last write of a coordinator that crashed, or one being written now)
  ends the file's rows, as recovery cuts it.

Valid records, where the search for the next one after damage looks and for whose
records, and what is a torn tail are the one log scanner's rule
(:mod:`ambrosia_py.wire.scanner`), which recovery applies too: both hold the same records
of every log. This reader is a lenient caller of it (it reports damage and reads on), or a
strict one with ``fail_on_damage`` (a damaged record or region raises
:class:`~.errors.LogDamageError`). A span is ``final`` only at the end of the newest log of
an instance version: elsewhere nothing can be torn.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from typing import Any

import attrs

from .. import wire
from ..coordinator.storage.index import IndexEntry
from ..wire import scanner
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
    "whole_end",
]

_CHUNK = 4 << 20  # bytes read per refill of the window


@attrs.frozen
class Neighbour:
    """The committer id and seq of the record just before or after a span."""

    committer: int
    seq: int


@attrs.frozen
class Span:
    """Bytes ``[start, end)`` of a log. ``final``: ``end`` is where the newest log of an
    instance version ended when the span was planned, so a record cut there may be a torn
    tail; otherwise a record starts at ``end`` (a verified index entry, or the end of a
    record seen earlier), or the log is an older one (no write of a running coordinator
    can have been cut at its end). ``before`` and ``after``, when known, are the records
    around the span (for the neighbour check)."""

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
    damage: str | None = None  # what is wrong with a damaged record or region


class _Cut(Exception):
    """The record at the position runs past the end of the range."""


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
        # The one log scanner's view of the span: asked where the bytes are not a record.
        self.log = scanner.LogBytes(src.pread, span.end, max_record)
        # What the record after the last good one should carry, for the scanner's rule.
        before = span.before
        self.committer = None if before is None else before.committer
        self.next_seq = None if before is None else before.seq + 1
        self.times = {e.offset: e for e in entries if span.start <= e.offset < span.end}
        self.time_ns = self._time_before(entries)

    def _time_before(self, entries: Sequence[IndexEntry]) -> int | None:
        """The time of the last verified index entry before the span, if one of the last
        few before it verifies (the span's records come after it)."""
        before = [e for e in entries if e.offset < self.span.start][-3:]
        log = scanner.LogBytes(self.src.pread, self.src.data_size(), self.max_record)
        for e in reversed(before):
            header = scanner.record_at(log, e.offset)
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
        want = scanner.TAIL_PROBE
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
        :class:`wire.ProtocolError` when the bytes cannot be framed as a valid record (its
        watermark sections too must parse: they are not covered by the check bytes, but a
        record whose sections are broken is not a valid record, for recovery either)."""
        if not self._ensure(pos, pos + wire.HEADER_SIZE):
            raise _Cut()
        header = wire.parse_header(
            self.data, pos - self.base, on_disk=True, max_record_size=self.max_record
        )
        stop = pos + header.length
        if not self._ensure(pos, stop):
            raise _Cut()
        after = self._tail(pos, stop)
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
        self.committer = header.committer_id
        if header.seq >= 0:
            self.next_seq = header.seq + 1
        entry = self.times.get(pos)
        if entry is not None and entry.seq == header.seq:
            self.time_ns = entry.time_ns
        record.size = after - pos
        record.commit_time_ns = self.time_ns
        return record, after

    # --- after a failure -------------------------------------------------------------

    def _follower(self, pos: int, stop: int) -> int | None:
        """The first valid record in ``(pos, stop)``, of the committers the scanner seeks
        after damage at ``pos``."""
        whose = scanner.search_committers(self.log, pos, self.committer)
        return scanner.find_record(self.log, pos + 1, whose, stop)

    def records(self) -> Iterator[Record]:
        """The span's records, each whose check bytes verify checked against its neighbours.

        The check bytes do not cover the header, so a flipped committer id or seq would
        pass them: a record must agree with the record before it (same committer, the next
        seq) or with the one after it, when it has either; with no record before it to go
        by (at the start of a log, or after a damaged region), a record that disagrees
        with the one after it may still agree with the one after that (then that one is
        the damaged one). A record that agrees with none is damaged. Records in a log
        share the committer id and count up by one.

        Damage comes out in order: with ``fail_on_damage`` the first damaged record or
        region raises, as recovery stops at the first.
        """
        before = self.span.before
        expect = None if before is None else (before.committer, before.seq + 1)
        after = self.span.after
        beyond = (
            None
            if after is None
            else Record(0, 0, after.committer, after.seq, True, None, [], None)
        )
        items = self._items()
        ahead = deque(itertools.islice(items, 2))  # the two items after the one settled
        while ahead:
            item = ahead.popleft()
            coming = next(items, None)
            if coming is not None:
                ahead.append(coming)
            if item.check_ok:
                if expect is not None and (item.committer, item.seq) == expect:
                    yield item  # it follows the record before, as nearly every record does
                    expect = (expect[0], expect[1] + 1)
                    continue
                nxt, nxt2 = [*ahead, beyond, None][:2]  # what follows it, as far as known
                expect = yield from self._settle(item, expect, nxt, nxt2)
                continue
            if self.fail:
                raise LogDamageError(self.path, str(item.damage), offset=item.offset, seq=item.seq)
            yield item
            if item.seq is None:  # a region: how many records it held is unknown
                expect = None
            elif expect is not None:  # a damaged record took its seq
                expect = (expect[0], expect[1] + 1)

    def _settle(
        self,
        record: Record,
        expect: tuple[int, int] | None,
        nxt: Record | None,
        nxt2: Record | None,
    ) -> Generator[Record, None, tuple[int, int] | None]:
        """Yield ``record`` as it is, or damaged if it agrees with neither neighbour
        (``nxt2``: the record after ``nxt``); return the committer and seq the next record
        must have."""
        if nxt is not None and not nxt.check_ok:
            nxt = None  # a damaged record or region says nothing
        agrees_before = expect is not None and (record.committer, record.seq) == expect
        agrees_after = _follows(record, nxt, 1) or (
            expect is None and nxt is not None and _follows(record, nxt2, 2)
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
                failure = (
                    scanner.cut_failure(self.log, pos) if isinstance(exc, _Cut) else exc.reason
                )
                damage = scanner.judge(
                    self.log,
                    pos,
                    failure,
                    last=self.span.final,
                    committer=self.committer,
                    seq=self.next_seq,
                )
                if damage.torn:
                    return  # a torn tail ends the rows, as recovery cuts it
                stop = end if damage.follower is None else damage.follower
                why = "" if damage.problem is None else f"; {damage.problem}"
                reason = f"damaged region of {stop - pos} bytes: {failure}{why}"
                yield Record(pos, stop - pos, None, None, False, None, [], None, damage=reason)
                self.next_seq = None  # how many records the region held is unknown
                pos = stop
                continue
            if not record.check_ok:
                # A valid record inside the claimed extent: the length field was damaged.
                follower = self._follower(pos, after)
                stop = after if follower is None else follower
                if self.next_seq is not None:
                    self.next_seq += 1  # the damaged record took its seq
                record.damage = "check bytes do not match the record's contents"
                record.size = stop - pos
                yield record
                pos = stop
                continue
            yield record
            pos = after


def _follows(record: Record, other: Record | None, gap: int) -> bool:
    """Whether ``other`` is a verified record ``gap`` records after ``record``."""
    return (
        other is not None
        and other.check_ok
        and record.seq is not None
        and (other.committer, other.seq) == (record.committer, record.seq + gap)
    )


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
