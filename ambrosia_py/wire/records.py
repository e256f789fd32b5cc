"""Log records: the 24-byte header, the wire form and the on-disk form.

Wire form (seed 002, Message Formats; reference ambrosia.md, Log record header):
``committer id i32 | total length i32 | check bytes u64 | sequence id i64 | messages``,
all little-endian. The check bytes are XXH64 (seed 0) of the bytes after the header.
Sequence id -1 marks the coordinator's control records, -2 the record that carries the
checkpoint to recover from (its check bytes are 0). A Checkpoint message's blob follows
the record and is counted neither in the message size nor in the record length.

On-disk form (reference ambrosia.md, Files on disk): the same header with the length
stored as ``-length-1``, then, not counted in the length, the coordinator's watermarks
(zigzag count; per entry zigzag name length, name, i64 last seq, i64 last replayable seq)
and trim watermarks (zigzag count; per entry zigzag name length, name, i64 trim seq).
The check bytes cover the messages only, so the coordinator can forward a record to its
binding by rewriting the length and dropping the watermarks.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

import attrs
import xxhash

from .errors import (
    CheckBytesError,
    InvalidNameError,
    MalformedMessageError,
    RecordLengthError,
    TruncatedInputError,
)
from .messages import Buffer, Message, Payload, frame_parts
from .messages import _name as _framed_name
from .varint import decode_zigzag_int, encode_zigzag_int

__all__ = [
    "CHECKPOINT_SEQ",
    "CONTROL_SEQ",
    "DEFAULT_MAX_RECORD_SIZE",
    "HEADER",
    "HEADER_SIZE",
    "DiskRecordTail",
    "LogRecord",
    "RecordHeader",
    "TrimWatermark",
    "Watermark",
    "check_bytes",
    "coalesce_parts",
    "decode_disk_tail",
    "disk_to_wire",
    "encode_disk_record",
    "encode_disk_tail",
    "encode_marks_tail",
    "encode_record",
    "encode_record_parts",
    "frame_record",
    "parse_header",
    "record_headers",
    "verify_check",
]

HEADER = struct.Struct("<iiQq")
HEADER_SIZE = HEADER.size  # 24
CONTROL_SEQ = -1
CHECKPOINT_SEQ = -2
DEFAULT_MAX_RECORD_SIZE = 256 * 1024 * 1024
_I64 = struct.Struct("<q")
_QQ = struct.Struct("<qq")  # a watermark's two sequence numbers


def check_bytes(body: Buffer) -> int:
    """XXH64 (seed 0) of a record's bytes after the header."""
    return int(xxhash.xxh64_intdigest(body))


@attrs.frozen
class RecordHeader:
    """A parsed record header. ``length`` is the total (header included), always positive."""

    committer_id: int
    length: int
    check: int
    seq: int


def parse_header(
    buf: Payload,
    pos: int = 0,
    *,
    on_disk: bool = False,
    max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
) -> RecordHeader:
    """Parse and bound-check the header at ``pos`` (the 24 bytes must be present)."""
    if len(buf) - pos < HEADER_SIZE:
        raise TruncatedInputError(
            f"record header needs {HEADER_SIZE} bytes, {len(buf) - pos} present", offset=pos
        )
    committer, length, check, seq = HEADER.unpack_from(buf, pos)
    if on_disk:
        if length >= 0:
            raise RecordLengthError(
                f"on-disk record length field {length} is not negative (expected -length-1)",
                offset=pos,
                seq=seq,
            )
        length = -length - 1
    if length < HEADER_SIZE or length > max_record_size:
        raise RecordLengthError(
            f"record length {length} outside {HEADER_SIZE}..{max_record_size}",
            offset=pos,
            seq=seq,
        )
    return RecordHeader(committer, length, check, seq)


@attrs.frozen
class LogRecord:
    """A decoded record: its header fields and its messages, in order.

    Checkpoint messages hold their blob (read from behind the record).
    """

    committer_id: int
    seq: int
    messages: tuple[Message, ...] = attrs.field()
    check: int = attrs.field(default=0, eq=False)


def frame_record(committer_id: int, seq: int, body: Buffer) -> bytes:
    """The 24-byte wire header for ``body`` (framed messages, no checkpoint blobs)."""
    check = 0 if seq == CHECKPOINT_SEQ else check_bytes(body)
    return HEADER.pack(committer_id, HEADER_SIZE + len(body), check, seq)


_COALESCE = 4096  # payloads at least this large travel as their own buffer, uncopied


def coalesce_parts(parts: Iterable[Buffer]) -> list[Buffer]:
    """Join runs of small buffers; leave large ones as they are (no copy)."""
    out: list[Buffer] = []
    small: list[Buffer] = []
    for part in parts:
        if len(part) >= _COALESCE:
            if small:
                out.append(b"".join(small))
                small = []
            out.append(part)
        else:
            small.append(part)
    if small:
        out.append(b"".join(small))
    return out


def encode_record_parts(committer_id: int, seq: int, messages: Sequence[Message]) -> list[Buffer]:
    """A record in wire form as buffers: header, messages, then any checkpoint blobs.

    Large payloads are not copied: they appear as their own buffers, ready for
    ``writev``/``writelines``; the check bytes are computed over the parts in turn.
    """
    body: list[Buffer] = []
    blobs: list[Buffer] = []
    for msg in messages:
        body.extend(frame_parts(msg))
        blob = getattr(msg, "blob", None)
        if blob is not None:
            blobs.append(blob)
    chunks = coalesce_parts(body)
    wire_header, _ = record_headers(committer_id, seq, chunks)
    return [wire_header, *chunks, *blobs]


def record_headers(committer_id: int, seq: int, body: Sequence[Buffer]) -> tuple[bytes, bytes]:
    """The wire and on-disk headers of a record whose body is the buffers ``body``.

    The check bytes are computed over the buffers in turn, so a coordinator can write and
    forward a record without joining its messages.
    """
    length = HEADER_SIZE + sum(map(len, body))
    if seq == CHECKPOINT_SEQ:
        check = 0
    elif len(body) == 1:
        check = check_bytes(body[0])
    else:
        hasher = xxhash.xxh64()
        for c in body:
            hasher.update(c)
        check = hasher.intdigest()
    return (
        HEADER.pack(committer_id, length, check, seq),
        HEADER.pack(committer_id, -length - 1, check, seq),
    )


def encode_record(committer_id: int, seq: int, messages: Sequence[Message]) -> bytes:
    """A record in wire form, joined into one ``bytes``."""
    return b"".join(encode_record_parts(committer_id, seq, messages))


# --- on-disk form ------------------------------------------------------------------------


@attrs.frozen
class Watermark:
    """Per sender: the last input sequence numbers this coordinator has processed."""

    name: str
    last_seq: int
    last_replayable_seq: int


@attrs.frozen
class TrimWatermark:
    """Per destination: where this coordinator's buffered output was trimmed."""

    name: str
    seq: int


@attrs.frozen
class DiskRecordTail:
    """What follows the messages of an on-disk record."""

    watermarks: tuple[Watermark, ...] = attrs.field(default=())
    trims: tuple[TrimWatermark, ...] = attrs.field(default=())


def encode_disk_tail(
    watermarks: Iterable[Watermark] = (), trims: Iterable[TrimWatermark] = ()
) -> bytes:
    """The watermark sections of an on-disk record."""
    wms = list(watermarks)
    trs = list(trims)
    out = bytearray(encode_zigzag_int(len(wms)))
    for w in wms:
        out += _framed_name(w.name) + _QQ.pack(w.last_seq, w.last_replayable_seq)
    out += encode_zigzag_int(len(trs))
    for t in trs:
        out += _framed_name(t.name) + _I64.pack(t.seq)
    return bytes(out)


_NO_TRIMS = encode_zigzag_int(0)


def encode_marks_tail(marks: Mapping[str, int]) -> bytes:
    """:func:`encode_disk_tail` of one watermark per sender, ``(name, seq - 1, seq - 1)``
    for each ``name: seq`` (the next sequence number expected), and no trim watermarks:
    what a coordinator writes after each record, built without the objects (names framed
    once, both numbers packed in one call)."""
    parts = [encode_zigzag_int(len(marks))]
    for name, seq in marks.items():
        parts += (_framed_name(name), _QQ.pack(seq - 1, seq - 1))
    parts.append(_NO_TRIMS)
    return b"".join(parts)


def encode_disk_record(
    committer_id: int,
    seq: int,
    body: Buffer,
    watermarks: Iterable[Watermark] = (),
    trims: Iterable[TrimWatermark] = (),
) -> bytes:
    """A record in on-disk form: header (length as -length-1), body, watermarks."""
    length = HEADER_SIZE + len(body)
    header = HEADER.pack(committer_id, -length - 1, check_bytes(body), seq)
    return b"".join((header, body, encode_disk_tail(watermarks, trims)))


def _name_at(buf: memoryview, pos: int, what: str) -> tuple[str, int]:
    n, pos2 = decode_zigzag_int(buf, pos)
    if n < 0:
        raise MalformedMessageError(f"negative {what} name length {n}", offset=pos)
    if pos2 + n > len(buf):
        raise TruncatedInputError(f"{what} name runs past the data", offset=pos2)
    try:
        return str(buf[pos2 : pos2 + n], "utf-8"), pos2 + n
    except UnicodeDecodeError as exc:
        raise InvalidNameError(f"{what} name is not UTF-8: {exc.reason}", offset=pos2) from None


def _i64_at(buf: memoryview, pos: int, what: str) -> tuple[int, int]:
    if pos + 8 > len(buf):
        raise TruncatedInputError(f"{what} truncated", offset=pos)
    return int(_I64.unpack_from(buf, pos)[0]), pos + 8


_MAX_WATERMARKS = 1 << 20


def decode_disk_tail(buf: Payload, pos: int = 0) -> tuple[DiskRecordTail, int]:
    """Parse the watermark sections at ``pos``; return them and the position after."""
    mv = buf if isinstance(buf, memoryview) else memoryview(buf)
    start = pos
    count, pos = decode_zigzag_int(mv, pos)
    if not 0 <= count <= _MAX_WATERMARKS:
        raise MalformedMessageError(f"watermark count {count} out of range", offset=start)
    wms = []
    for _ in range(count):
        name, pos = _name_at(mv, pos, "watermark")
        a, pos = _i64_at(mv, pos, "watermark seq")
        b, pos = _i64_at(mv, pos, "watermark replayable seq")
        wms.append(Watermark(name, a, b))
    tstart = pos
    tcount, pos = decode_zigzag_int(mv, pos)
    if not 0 <= tcount <= _MAX_WATERMARKS:
        raise MalformedMessageError(f"trim watermark count {tcount} out of range", offset=tstart)
    trims = []
    for _ in range(tcount):
        name, pos = _name_at(mv, pos, "trim watermark")
        s, pos = _i64_at(mv, pos, "trim seq")
        trims.append(TrimWatermark(name, s))
    return DiskRecordTail(tuple(wms), tuple(trims)), pos


def disk_to_wire(header: RecordHeader, body: Buffer) -> bytes:
    """The wire form of an on-disk record: length positive again, no watermarks."""
    return HEADER.pack(header.committer_id, header.length, header.check, header.seq) + bytes(body)


def verify_check(header: RecordHeader, body: Buffer, offset: int | None = None) -> None:
    """Raise :class:`CheckBytesError` unless ``body`` matches the header's check bytes."""
    if header.seq == CHECKPOINT_SEQ:
        if header.check != 0:
            raise CheckBytesError(
                f"checkpoint record check bytes {header.check:#018x}, expected 0",
                offset=offset,
                seq=header.seq,
            )
        return
    actual = check_bytes(body)
    if actual != header.check:
        raise CheckBytesError(
            f"check bytes {header.check:#018x} do not match contents ({actual:#018x})",
            offset=offset,
            seq=header.seq,
        )
