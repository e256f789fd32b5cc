"""Round trips through the wire core, and the chunking property of the readers."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.wire import (
    HEADER_SIZE,
    Checkpoint,
    CheckpointHeader,
    Direction,
    DiskRecordTail,
    IncomingRpc,
    LogRecord,
    Message,
    MessageReader,
    RecordReader,
    RpcType,
    TakeCheckpoint,
    TrimWatermark,
    Watermark,
    decode_message,
    decode_messages,
    decode_zigzag_int,
    decode_zigzag_long,
    encode_disk_record,
    encode_message,
    encode_record,
    encode_zigzag_int,
    encode_zigzag_long,
)
from ambrosia_py.wire.messages import Buffer, encode_message_parts, frame_parts
from ambrosia_py.wire.records import (
    check_bytes,
    decode_disk_tail,
    disk_to_wire,
    encode_disk_tail,
    encode_marks_tail,
    encode_record_parts,
    parse_header,
)
from tests import strategies as s

FAST = settings(max_examples=200, deadline=None)


# --- varints ----------------------------------------------------------------------------


@FAST
@given(s.ints32)
def test_zigzag_int_round_trip(value: int) -> None:
    raw = encode_zigzag_int(value)
    assert 1 <= len(raw) <= 5
    assert decode_zigzag_int(raw) == (value, len(raw))
    # Followed by other bytes, the decoder stops at the end of the varint.
    assert decode_zigzag_int(b"\x99" + raw + b"\x01", 1) == (value, 1 + len(raw))


@FAST
@given(s.ints64)
def test_zigzag_long_round_trip(value: int) -> None:
    raw = encode_zigzag_long(value)
    assert 1 <= len(raw) <= 10
    assert decode_zigzag_long(raw) == (value, len(raw))
    assert decode_zigzag_long(raw + b"\x7f") == (value, len(raw))


@pytest.mark.parametrize("value", [-(2**31), -(2**31) + 1, -1, 0, 1, 2**31 - 2, 2**31 - 1])
def test_zigzag_int_range_edges(value: int) -> None:
    raw = encode_zigzag_int(value)
    assert decode_zigzag_int(raw) == (value, len(raw))


@pytest.mark.parametrize("value", [-(2**63), -(2**63) + 1, -(2**31) - 1, 2**31, 2**63 - 1])
def test_zigzag_long_range_edges(value: int) -> None:
    raw = encode_zigzag_long(value)
    assert decode_zigzag_long(raw) == (value, len(raw))


@FAST
@given(st.one_of(st.integers(max_value=-(2**31) - 1), st.integers(min_value=2**31)))
def test_zigzag_int_rejects_values_outside_32_bits(value: int) -> None:
    with pytest.raises(OverflowError, match="ZigZagInt out of range"):
        encode_zigzag_int(value)


@FAST
@given(st.one_of(st.integers(max_value=-(2**63) - 1), st.integers(min_value=2**63)))
def test_zigzag_long_rejects_values_outside_64_bits(value: int) -> None:
    with pytest.raises(OverflowError, match="ZigZagLong out of range"):
        encode_zigzag_long(value)


# --- messages ---------------------------------------------------------------------------


def _decode_whole(raw: bytes, direction: Direction) -> Message:
    msg, end = decode_message(raw, 0, direction)
    if isinstance(msg, CheckpointHeader):
        # decode_message leaves the blob, which follows the frame, to the caller.
        assert end + msg.length == len(raw)
        return Checkpoint(raw[end:])
    assert end == len(raw)
    return msg


@pytest.mark.parametrize("name", sorted(s.MESSAGE_STRATEGIES))
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_message_round_trip(name: str, data: st.DataObject) -> None:
    msg = data.draw(s.MESSAGE_STRATEGIES[name])
    direction = s.MESSAGE_DIRECTIONS[name]
    raw = encode_message(msg)
    assert b"".join(encode_message_parts(msg)) == raw
    assert _decode_whole(raw, direction) == msg
    # The same message inside a larger buffer decodes at its position.
    decoded, end = decode_message(b"\xaa\xbb" + raw + b"\xcc", 2, direction)
    assert end == 2 + sum(len(p) for p in frame_parts(msg))
    if not isinstance(msg, Checkpoint):
        assert decoded == msg


@FAST
@given(s.messages(Direction.TO_COORDINATOR))
def test_outgoing_message_round_trip(msg: Message) -> None:
    assert _decode_whole(encode_message(msg), Direction.TO_COORDINATOR) == msg


@FAST
@given(s.messages(Direction.TO_BINDING))
def test_incoming_message_round_trip(msg: Message) -> None:
    assert _decode_whole(encode_message(msg), Direction.TO_BINDING) == msg


@FAST
@given(st.lists(s.messages(Direction.TO_BINDING, with_checkpoints=False), max_size=8))
def test_decode_messages_round_trip(msgs: list[Message]) -> None:
    # decode_messages reads runs of small calls in C where it is built; the messages are
    # the same either way.
    body = b"".join(encode_message(m) for m in msgs)
    assert decode_messages(b"\x00" + body + b"\x00", 1, 1 + len(body)) == msgs


@FAST
@given(s.incoming_rpcs)
def test_decode_messages_agrees_with_decode_message(msg: Message) -> None:
    raw = encode_message(msg)
    assert decode_messages(raw, 0, len(raw)) == [decode_message(raw)[0]] == [msg]


# --- records ----------------------------------------------------------------------------


@FAST
@given(s.log_records())
def test_record_round_trip(rec: LogRecord) -> None:
    raw = encode_record(rec.committer_id, rec.seq, rec.messages)
    assert b"".join(encode_record_parts(rec.committer_id, rec.seq, rec.messages)) == raw
    header = parse_header(raw)
    assert (header.committer_id, header.seq) == (rec.committer_id, rec.seq)
    blob = sum(len(m.blob) for m in rec.messages if isinstance(m, Checkpoint))
    assert header.length + blob == len(raw)
    body = raw[HEADER_SIZE : header.length]
    assert header.check == (0 if rec.seq == -2 else check_bytes(body))
    reader = RecordReader()
    got = reader.records(raw)
    reader.close()
    assert got == [rec]
    assert got[0].check == header.check
    assert reader.next_seq == (rec.seq + 1 if rec.seq >= 0 else None)


@FAST
@given(s.committer_ids, s.checkpoints, st.binary(min_size=1, max_size=64))
def test_checkpoint_record_round_trip(committer: int, small: Checkpoint, pattern: bytes) -> None:
    # Blobs large and small: large payloads travel as their own (uncopied) buffers.
    big = pattern * (5000 // len(pattern) + 1)
    for cp in (small, Checkpoint(big)):
        raw = encode_record(committer, -2, [cp])
        header = parse_header(raw)
        assert header.check == 0
        assert header.length + len(cp.blob) == len(raw)
        reader = RecordReader()
        assert reader.records(raw) == [LogRecord(committer, -2, (cp,))]
        reader.close()


@FAST
@given(
    s.committer_ids,
    st.integers(0, 2**62),
    s.logged_bodies(),
    s.watermark_lists,
    s.trim_watermark_lists,
)
def test_disk_record_round_trip(
    committer: int,
    seq: int,
    msgs: list[Message],
    wms: list[Watermark],
    trims: list[TrimWatermark],
) -> None:
    wire = encode_record(committer, seq, msgs)
    body = wire[HEADER_SIZE:]
    disk = encode_disk_record(committer, seq, body, wms, trims)
    header = parse_header(disk, on_disk=True)
    assert header == parse_header(wire)
    # The stored length is -length-1; the watermarks follow, uncounted.
    assert int.from_bytes(disk[4:8], "little", signed=True) == -len(wire) - 1
    assert disk[len(wire) :] == encode_disk_tail(wms, trims)

    reader = RecordReader(on_disk=True)
    raw = reader.next_raw()
    assert raw is None
    reader.feed(disk)
    raw = reader.next_raw()
    assert raw is not None
    reader.close()
    assert raw.tail == DiskRecordTail(tuple(wms), tuple(trims))
    assert bytes(raw.body) == body
    assert raw.offset == 0
    assert disk_to_wire(raw.header, raw.body) == wire
    assert reader.decode(raw) == msgs


@FAST
@given(s.watermark_lists, s.trim_watermark_lists)
def test_disk_tail_round_trip(wms: list[Watermark], trims: list[TrimWatermark]) -> None:
    raw = encode_disk_tail(wms, trims)
    assert decode_disk_tail(b"\x07" + raw + b"\x08", 1) == (
        DiskRecordTail(tuple(wms), tuple(trims)),
        1 + len(raw),
    )


@FAST
@given(st.dictionaries(s.names, st.integers(-(2**63) + 1, 2**63 - 1), max_size=6))
def test_the_marks_tail_is_the_disk_tail_of_one_watermark_per_sender(marks: dict[str, int]) -> None:
    """The coordinator's fast form: what encode_disk_tail writes for (name, seq - 1, seq - 1)
    per sender and no trims, and it reads back as that."""
    raw = encode_marks_tail(marks)
    wms = tuple(Watermark(name, seq - 1, seq - 1) for name, seq in marks.items())
    assert raw == encode_disk_tail(wms)
    assert decode_disk_tail(raw) == (DiskRecordTail(wms, ()), len(raw))


@FAST
@given(s.committer_ids, st.integers(0, 2**40), st.lists(s.logged_bodies(), min_size=1, max_size=5))
def test_disk_log_reads_as_a_stream(
    committer: int, first: int, bodies: list[list[Message]]
) -> None:
    log = b"".join(
        encode_disk_record(
            committer,
            first + i,
            encode_record(committer, first + i, msgs)[HEADER_SIZE:],
            [Watermark(f"peer{i}", i, i)],
        )
        for i, msgs in enumerate(bodies)
    )
    reader = RecordReader(on_disk=True, committer_id=committer, next_seq=first)
    got = reader.records(log)
    reader.close()
    assert got == [LogRecord(committer, first + i, tuple(m)) for i, m in enumerate(bodies)]


# --- chunking ---------------------------------------------------------------------------


def _record_stream(records: list[tuple[int, list[Message]]], committer: int) -> bytes:
    return b"".join(encode_record(committer, seq, msgs) for seq, msgs in records)


def _read_records(data: Sequence[Buffer], *, on_disk: bool = False) -> list[LogRecord]:
    reader = RecordReader(on_disk=on_disk)
    out: list[LogRecord] = []
    for chunk in data:
        out.extend(reader.records(chunk))
    reader.close()
    return out


@FAST
@given(s.record_streams(), st.data())
def test_record_reader_chunking(
    stream: tuple[int, list[tuple[int, list[Message]]]], data: st.DataObject
) -> None:
    committer, records = stream
    raw = _record_stream(records, committer)
    expected = [LogRecord(committer, seq, tuple(msgs)) for seq, msgs in records]
    assert _read_records([raw]) == expected
    cuts = data.draw(s.split_points(len(raw)))
    assert _read_records(s.chunks(raw, cuts)) == expected


@settings(max_examples=30, deadline=None)
@given(s.record_streams())
def test_record_reader_one_byte_at_a_time(
    stream: tuple[int, list[tuple[int, list[Message]]]],
) -> None:
    committer, records = stream
    raw = _record_stream(records, committer)
    expected = [LogRecord(committer, seq, tuple(msgs)) for seq, msgs in records]
    one_by_one = [raw[i : i + 1] for i in range(len(raw))]
    assert _read_records(one_by_one) == expected
    # bytearray and memoryview chunks are copied, never kept by reference.
    assert _read_records([bytearray(c) for c in one_by_one]) == expected
    assert _read_records([memoryview(raw)[: len(raw) // 2], memoryview(raw)[len(raw) // 2 :]]) == (
        expected
    )


def test_record_reader_chunking_with_large_records_and_blobs() -> None:
    # Records and blobs of 64 KiB and more are handed over without copying; the bytes
    # after them must survive the hand-over intact.
    big_args = bytes(range(256)) * 300
    blob = bytes(reversed(range(256))) * 400
    records: list[tuple[int, list[Message]]] = [
        (-2, [Checkpoint(blob)]),
        (7, [IncomingRpc(1, RpcType.FORK, big_args)]),
        (-1, [TakeCheckpoint()]),
        (8, [IncomingRpc(2, RpcType.IMPULSE, b"x")]),
    ]
    raw = _record_stream(records, 5)
    expected = [LogRecord(5, seq, tuple(msgs)) for seq, msgs in records]
    for size in (1000, 4096, 65536, 70000, len(raw)):
        parts = [raw[i : i + size] for i in range(0, len(raw), size)]
        assert _read_records(parts) == expected
        assert _read_records([bytearray(p) for p in parts]) == expected


@FAST
@given(s.committer_ids, st.integers(0, 2**40), st.lists(s.logged_bodies(), min_size=1, max_size=4))
def test_disk_record_reader_chunking(
    committer: int, first: int, bodies: list[list[Message]]
) -> None:
    log = b"".join(
        encode_disk_record(
            committer,
            first + i,
            encode_record(committer, first + i, msgs)[HEADER_SIZE:],
            [Watermark("a" * i, i, -i)],
            [TrimWatermark("b" * i, i)] * (i % 3),
        )
        for i, msgs in enumerate(bodies)
    )
    expected = _read_records([log], on_disk=True)
    assert [r.seq for r in expected] == [first + i for i in range(len(bodies))]
    assert _read_records([log[i : i + 1] for i in range(len(log))], on_disk=True) == expected


def _read_messages(data: list[bytes]) -> list[Message]:
    reader = MessageReader()
    out: list[Message] = []
    for chunk in data:
        out.extend(reader.messages(chunk))
    reader.close()
    return out


outgoing_streams = st.lists(s.messages(Direction.TO_COORDINATOR), min_size=1, max_size=6).map(
    lambda ms: [*ms, Checkpoint(b"blob-" + bytes(len(ms)))]
)


@FAST
@given(outgoing_streams, st.data())
def test_message_reader_chunking(msgs: list[Message], data: st.DataObject) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    assert _read_messages([raw]) == msgs
    cuts = data.draw(s.split_points(len(raw)))
    assert _read_messages(s.chunks(raw, cuts)) == msgs


@settings(max_examples=30, deadline=None)
@given(outgoing_streams)
def test_message_reader_one_byte_at_a_time(msgs: list[Message]) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    assert _read_messages([raw[i : i + 1] for i in range(len(raw))]) == msgs


@FAST
@given(outgoing_streams)
def test_message_reader_frames(msgs: list[Message]) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    reader = MessageReader()
    reader.feed(raw)
    offset = 0
    for msg in msgs:
        frame = reader.next_frame()
        assert frame is not None
        assert frame.type == msg.TYPE
        assert frame.offset == offset
        framed = b"".join(frame_parts(msg))
        assert bytes(frame.raw) == framed
        # The first part of frame_parts is the size varint and the type byte.
        assert frame.data_start == len(frame_parts(msg)[0])
        assert frame.raw[frame.data_start - 1] == msg.TYPE
        if isinstance(msg, Checkpoint):
            assert frame.blob is not None and bytes(frame.blob) == bytes(msg.blob)
            offset += len(msg.blob)
        else:
            assert frame.blob is None
        assert reader.decode(frame) == msg
        offset += len(framed)
    assert reader.next_frame() is None
    assert reader.offset == len(raw)
