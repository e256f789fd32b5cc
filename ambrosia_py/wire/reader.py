"""Incremental readers: feed bytes in chunks of any size, take complete units out.

:class:`RecordReader` reads a stream of log records (what a coordinator sends its binding,
or a log file on disk), verifying check bytes, committer id and consecutive sequence ids,
and attaching each Checkpoint's blob, which follows its record.
:class:`~.message_reader.MessageReader` reads the bare messages a binding sends its
coordinator; the buffer both take units out of is :mod:`.buffer`'s.

Both are sans-IO: no sockets, no files. ``feed()`` appends bytes; ``next_*()`` returns the
next complete unit or ``None`` when more bytes are needed; ``close()`` says the stream
ended and raises :class:`TruncatedInputError` if it ended inside a unit. Each record is copied
out of the input buffer once; the messages decoded from it are views into that copy,
except the arguments of incoming calls and the values of replies under 8 KiB, copied out
on their own (see :func:`~.decoding.decode_messages`).
"""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import attrs

from .. import accel
from .buffer import DEFAULT_MAX_CHECKPOINT_SIZE, InputBuffer
from .decoding import calls_decoder, decode_messages
from .errors import (
    CheckpointSizeError,
    CommitterError,
    ProtocolError,
    SequenceError,
    TruncatedInputError,
)
from .messages import (
    Buffer,
    Checkpoint,
    CheckpointHeader,
    Direction,
    IncomingReturnValue,
    IncomingRpc,
    Message,
)
from .records import (
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    DEFAULT_MAX_RECORD_SIZE,
    HEADER_SIZE,
    DiskRecordTail,
    LogRecord,
    RecordHeader,
    TrimWatermark,
    Watermark,
    decode_disk_tail,
    parse_header,
    verify_check,
)

__all__ = ["RawRecord", "RecordReader"]


@attrs.frozen
class RawRecord:
    """A verified record before message decoding.

    ``body`` is the framed messages (a view of ``raw``); ``raw`` the record as read: in
    wire form from the wire, or from disk with its stored (negative) length and its
    watermark tail after the body. ``offset`` is its position in the stream; ``tail`` its on-disk
    watermarks (``None`` on the wire).
    """

    header: RecordHeader
    raw: bytes | memoryview = attrs.field(repr=False)
    offset: int
    tail: DiskRecordTail | None = None

    @property
    def seq(self) -> int:
        return self.header.seq

    @property
    def body(self) -> memoryview:
        return memoryview(self.raw)[HEADER_SIZE : self.header.length]


# The C accelerator (``_crecords.c``) reads clean records; anything else, and everything
# when it is not built, goes through the pure-Python twin below (``_next_raw_pure``).
_crecords = accel.load("ambrosia_py.wire._crecords")
if _crecords is not None:
    _crecords.configure(RecordHeader, RawRecord, DiskRecordTail, Watermark, TrimWatermark)

_calls_decoder = calls_decoder()  # the C loop over incoming calls and replies, if built
_CALLS = (IncomingRpc, IncomingReturnValue)  # what take_calls takes

_BATCH = 256  # records per :meth:`RecordReader.next_raws` call, by default


class RecordReader:
    """Reads log records from a byte stream fed in arbitrary chunks.

    ``on_disk`` selects the on-disk form (negative length, watermarks after the body).
    ``committer_id``, if given, must match every record; otherwise the first record's id is
    required of the rest. ``next_seq``, if given, is the sequence id the first logged
    record must have; logged records must then count up by one. Records with sequence id
    -1 (control) and -2 (checkpoint) are allowed on the wire only and skip the count.
    """

    def __init__(
        self,
        *,
        on_disk: bool = False,
        verify: bool = True,
        committer_id: int | None = None,
        next_seq: int | None = None,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        max_checkpoint_size: int = DEFAULT_MAX_CHECKPOINT_SIZE,
        direction: Direction = Direction.TO_BINDING,
        accelerated: bool = True,
    ) -> None:
        self._buf = InputBuffer()
        # ``accelerated=False`` keeps to the pure-Python twin (tests compare the two).
        self._accel = _crecords if accelerated else None
        self._on_disk = on_disk
        self._verify = verify
        self._committer = committer_id
        self._next_seq = next_seq
        self._max_record = max_record_size
        self._max_checkpoint = max_checkpoint_size
        self._direction = direction
        # A decoded record waiting for its checkpoint blobs.
        self._pending: tuple[RawRecord, list[Message]] | None = None
        self._failed: ProtocolError | None = None

    @property
    def offset(self) -> int:
        """Stream offset of the first byte not yet consumed."""
        return self._buf.offset

    @property
    def buffered(self) -> int:
        """Bytes fed but not yet consumed."""
        return self._buf.available

    @property
    def drained(self) -> bool:
        """Whether everything fed has been returned: no bytes, no record held back."""
        return self._pending is None and not self._buf.available

    @property
    def next_seq(self) -> int | None:
        """The sequence id the next logged record must carry, once known."""
        return self._next_seq

    def feed(self, data: Buffer) -> None:
        """Append bytes from the stream."""
        self._buf.feed(data)

    def close(self) -> None:
        """The stream has ended: raise if it ended inside a record or blob."""
        if self._pending is not None or self._buf.available:
            raise TruncatedInputError(
                f"stream ends inside a record ({self._buf.available} bytes left over)",
                offset=self._buf.offset,
            )

    def _fail(self, exc: ProtocolError) -> ProtocolError:
        self._failed = exc
        return exc

    @property
    def accelerated(self) -> bool:
        """Whether clean records are read by the C accelerator."""
        return self._accel is not None

    def next_raw(self) -> RawRecord | None:
        """The next complete, verified record without decoding its messages."""
        if self._failed is not None:
            raise self._failed
        c = self._accel
        if c is not None:
            out: list[RawRecord] = []
            self._take_clean(c, out, 1)
            if out:
                return out[0]
        return self._next_raw_pure()

    def next_raws(self, limit: int = _BATCH) -> list[RawRecord]:
        """The next complete, verified records, up to ``limit``: what as many
        :meth:`next_raw` calls would return, up to the first ``None``. An error raises
        only when no record precedes it; otherwise the records before it are returned
        and the next call raises it."""
        out: list[RawRecord] = []
        if self._failed is not None:
            raise self._failed
        c = self._accel
        while len(out) < limit:
            if c is not None:
                self._take_clean(c, out, limit)
                if len(out) >= limit:
                    break
            try:
                record = self._next_raw_pure()
            except ProtocolError:
                if out:
                    return out  # ``_failed`` holds the error for the next call
                raise
            if record is None:
                break
            out.append(record)
        return out

    def _take_clean(self, c: ModuleType, out: list[RawRecord], limit: int) -> None:
        buf = self._buf
        buf.pos, self._committer, self._next_seq = c.take_raws(
            buf.data,
            buf.pos,
            buf.consumed,
            self._on_disk,
            self._verify,
            self._committer,
            self._next_seq,
            self._max_record,
            limit,
            out,
        )

    def take_calls(self, limit: int = _BATCH) -> list[tuple[int, list[Message]]]:
        """The next records made only of incoming calls and replies, as (seq, calls), up to
        ``limit``: the records and messages :meth:`next_record` would give, without a
        :class:`LogRecord` each. Stops at the first other record (a control record, a
        checkpoint, a message the fast path leaves to Python, anything unclean or
        incomplete), which :meth:`next_record` then reads; errors, too, are its to raise."""
        if self._failed is not None or self._pending is not None or self._on_disk:
            return []
        c = self._accel
        if c is None or _calls_decoder is None or self._direction is not Direction.TO_BINDING:
            return self._take_calls_pure(limit)
        out: list[tuple[int, list[Message]]] = []
        buf = self._buf
        buf.pos, self._committer, self._next_seq = c.take_calls(
            buf.data,
            buf.pos,
            buf.consumed,
            False,
            self._verify,
            self._committer,
            self._next_seq,
            self._max_record,
            limit,
            _calls_decoder,
            out,
        )
        return out

    def _take_calls_pure(self, limit: int) -> list[tuple[int, list[Message]]]:
        """:meth:`take_calls`' pure-Python twin. It reads the record it stops at, too, and
        keeps it for :meth:`next_record` (``_pending``), so that it is decoded once."""
        out: list[tuple[int, list[Message]]] = []
        while len(out) < limit:
            try:
                raw = self._next_raw_pure()
                messages = [] if raw is None else self.decode(raw)
            except ProtocolError:
                if out:
                    return out  # ``_failed`` holds the error for the next call
                raise
            if raw is None:
                break
            if raw.seq < 0 or not all(type(m) in _CALLS for m in messages):
                self._pending = (raw, messages)
                break
            out.append((raw.seq, messages))
        return out

    def _next_raw_pure(self) -> RawRecord | None:
        """:meth:`next_raw`'s pure-Python twin: every record, clean or not."""
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        if buf.available < HEADER_SIZE:
            return None
        start = buf.offset
        try:
            header = parse_header(
                buf.data, buf.pos, on_disk=self._on_disk, max_record_size=self._max_record
            )
        except ProtocolError as exc:
            raise self._fail(exc.relocated(base=buf.consumed)) from None
        if buf.available < header.length:
            return None
        tail: DiskRecordTail | None = None
        total = header.length
        if self._on_disk:
            try:
                with memoryview(buf.data) as mv:
                    tail, end = decode_disk_tail(mv, buf.pos + header.length)
            except TruncatedInputError:
                return None
            except ProtocolError as exc:
                raise self._fail(exc.relocated(base=buf.consumed, seq=header.seq)) from None
            total = end - buf.pos
        self._check_header(header, start)
        raw = buf.take(total)
        record = RawRecord(header, raw, start, tail)
        if self._verify:
            try:
                verify_check(header, record.body, start)
            except ProtocolError as exc:
                raise self._fail(exc) from None
        if header.seq >= 0:
            self._next_seq = header.seq + 1
        return record

    def _check_header(self, header: RecordHeader, offset: int) -> None:
        if self._committer is None:
            self._committer = header.committer_id
        elif header.committer_id != self._committer:
            raise self._fail(
                CommitterError(
                    f"committer id {header.committer_id}, expected {self._committer}",
                    offset=offset,
                    seq=header.seq,
                )
            )
        seq = header.seq
        if seq < 0:
            if self._on_disk or seq not in (CONTROL_SEQ, CHECKPOINT_SEQ):
                raise self._fail(
                    SequenceError(f"sequence id {seq} not allowed here", offset=offset, seq=seq)
                )
            return
        if self._next_seq is not None and seq != self._next_seq:
            raise self._fail(
                SequenceError(
                    f"sequence id {seq} where {self._next_seq} was expected",
                    offset=offset,
                    seq=seq,
                )
            )

    def decode(self, record: RawRecord) -> list[Message]:
        """Decode a raw record's messages (checkpoints appear as headers)."""
        try:
            return decode_messages(
                memoryview(record.raw), HEADER_SIZE, record.header.length, self._direction
            )
        except ProtocolError as exc:
            raise self._fail(exc.relocated(base=record.offset, seq=record.seq)) from None

    def next_record(self) -> LogRecord | None:
        """The next complete record, its messages decoded and checkpoint blobs attached."""
        if self._pending is None:
            raw = self.next_raw()
            if raw is None:
                return None
            messages = self.decode(raw)
            self._pending = (raw, messages)
        raw, messages = self._pending
        for i, msg in enumerate(messages):
            if isinstance(msg, CheckpointHeader):
                if msg.length > self._max_checkpoint:
                    raise self._fail(
                        CheckpointSizeError(
                            f"checkpoint of {msg.length} bytes exceeds the maximum "
                            f"{self._max_checkpoint}",
                            offset=raw.offset,
                            seq=raw.seq,
                        )
                    )
                if self._buf.available < msg.length:
                    return None
                messages[i] = Checkpoint(self._buf.take(msg.length))
        self._pending = None
        return LogRecord(raw.header.committer_id, raw.seq, tuple(messages), raw.header.check)

    def __iter__(self) -> Iterator[LogRecord]:
        while (record := self.next_record()) is not None:
            yield record

    def records(self, data: Buffer) -> list[LogRecord]:
        """Feed ``data`` and return every record completed by it."""
        self.feed(data)
        return list(self)
