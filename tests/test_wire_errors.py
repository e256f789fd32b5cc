"""Malformed input raises the documented error, naming what was wrong and where.

One deterministic test per error; the fuzz tests, which feed random and mutated input
to every parser, are in ``test_wire_fuzz.py``.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from ambrosia_py.wire import (
    HEADER_SIZE,
    BatchCountError,
    CheckBytesError,
    Checkpoint,
    CheckpointSizeError,
    CommitterError,
    CountReplayableRpcBatch,
    Direction,
    IncomingRpc,
    InvalidNameError,
    LogRecord,
    MalformedMessageError,
    Message,
    MessageReader,
    OutgoingRpc,
    ProtocolError,
    RecordLengthError,
    RecordReader,
    RpcType,
    SequenceError,
    TakeCheckpoint,
    TruncatedInputError,
    UnknownMessageTypeError,
    VarintTooLongError,
    Watermark,
    check_bytes,
    decode_disk_tail,
    decode_message,
    decode_messages,
    decode_zigzag_int,
    decode_zigzag_long,
    encode_disk_record,
    encode_message,
    encode_record,
    encode_zigzag_int,
    encode_zigzag_long,
    parse_header,
)
from tests.strategies import raw_record as record

FORK = IncomingRpc(3, RpcType.FORK, b"{}")
IMPULSE = IncomingRpc(4, RpcType.IMPULSE, b"\x01")


def frame(type_byte: int, data: bytes) -> bytes:
    """A framed message with any type byte and data."""
    return encode_zigzag_int(1 + len(data)) + bytes([type_byte]) + data


def read_all(data: bytes, **kwargs: object) -> list[LogRecord]:
    reader = RecordReader(**kwargs)  # type: ignore[arg-type]
    out = reader.records(data)
    reader.close()
    return out


def raised(fn: Callable[[], object], error: type[ProtocolError]) -> ProtocolError:
    """Run ``fn``; return the error it raised, which must be exactly of type ``error``."""
    with pytest.raises(ProtocolError) as info:
        fn()
    assert type(info.value) is error, repr(info.value)
    return info.value


# --- truncation -------------------------------------------------------------------------


@pytest.mark.parametrize("cut", [1, HEADER_SIZE - 1, HEADER_SIZE, HEADER_SIZE + 3])
def test_stream_ending_inside_a_record_is_truncated(cut: int) -> None:
    good = encode_record(1, 0, [FORK])
    bad = encode_record(1, 1, [FORK])[:cut]
    reader = RecordReader()
    assert reader.records(good + bad) == [LogRecord(1, 0, (FORK,))]
    err = raised(reader.close, TruncatedInputError)
    assert err.offset == len(good)
    assert f"stream ends inside a record ({cut} bytes left over)" in str(err)
    assert f"offset {len(good)}" in str(err)


def test_stream_ending_inside_a_checkpoint_blob_is_truncated() -> None:
    raw = encode_record(1, -2, [Checkpoint(b"0123456789")])
    reader = RecordReader()
    assert reader.records(raw[:-3]) == []
    err = raised(reader.close, TruncatedInputError)
    assert "stream ends inside a record" in str(err)
    assert err.offset == len(raw) - 10  # the blob has not been consumed


def test_complete_stream_closes_cleanly() -> None:
    reader = RecordReader()
    reader.records(encode_record(1, 0, [FORK]))
    reader.close()  # nothing left over: no error


@pytest.mark.parametrize("cut", [0, 1, 2, 5])
def test_truncated_message_decode(cut: int) -> None:
    raw = encode_message(OutgoingRpc("server", 3, RpcType.FORK, b"{}"))
    err = raised(lambda: decode_message(raw[: len(raw) - 1 - cut], 0), TruncatedInputError)
    assert err.offset == 0
    assert f"message of 13 bytes runs {cut + 1} bytes past the available data" in str(err)


def test_message_reader_close_inside_a_message_is_truncated() -> None:
    first = encode_message(TakeCheckpoint())
    reader = MessageReader()
    assert reader.messages(first + encode_message(OutgoingRpc("", 1, RpcType.FORK))[:3]) == [
        TakeCheckpoint()
    ]
    err = raised(reader.close, TruncatedInputError)
    assert err.offset == len(first)
    assert "stream ends inside a message (3 bytes left over)" in str(err)


def test_message_reader_close_inside_a_checkpoint_blob_is_truncated() -> None:
    reader = MessageReader()
    assert reader.messages(encode_message(Checkpoint(b"abcdef"))[:-1]) == []
    err = raised(reader.close, TruncatedInputError)
    assert "stream ends inside a message" in str(err)


def test_name_running_past_the_message_is_truncated() -> None:
    # An outgoing RPC whose destination length says 20 in a 5-byte message.
    raw = frame(0, encode_zigzag_int(20) + b"abc")
    err = raised(lambda: decode_message(raw, 0, Direction.TO_COORDINATOR), TruncatedInputError)
    assert "destination name of 20 bytes runs past the message end" in str(err)
    assert err.offset == 3


def test_message_running_past_its_record_is_truncated_with_seq() -> None:
    body = frame(0, b"\x00\x06\x01{}")
    raw = record(9, body[:-1])  # the message claims one byte more than the record has
    err = raised(lambda: read_all(raw), TruncatedInputError)
    assert err.seq == 9
    assert err.offset == HEADER_SIZE
    assert "record seq 9" in str(err)


def test_end_past_the_buffer_is_truncated() -> None:
    raw = encode_message(FORK)
    err = raised(lambda: decode_messages(raw, 0, len(raw) + 5), TruncatedInputError)
    assert err.offset == 0
    assert f"messages end at {len(raw) + 5}, past the {len(raw)}-byte buffer" in str(err)
    # A frame claiming one byte more than the buffer holds, with an end past the buffer.
    err = raised(lambda: decode_message(raw[:-1], 0, end=len(raw) + 5), TruncatedInputError)
    assert "runs 1 bytes past the available data" in str(err)


# --- varints ----------------------------------------------------------------------------


def test_int_varint_longer_than_5_bytes() -> None:
    err = raised(lambda: decode_zigzag_int(b"\x00\x80\x80\x80\x80\x80\x01", 1), VarintTooLongError)
    assert err.offset == 1
    assert "ZigZagInt longer than 5 bytes" in str(err)


def test_long_varint_longer_than_10_bytes() -> None:
    err = raised(lambda: decode_zigzag_long(b"\xff" * 10 + b"\x01"), VarintTooLongError)
    assert err.offset == 0
    assert "ZigZagLong longer than 10 bytes" in str(err)


def test_longest_valid_varints_decode() -> None:
    assert decode_zigzag_int(b"\x80\x80\x80\x80\x01") == (2**27, 5)
    assert decode_zigzag_long(b"\x80" * 9 + b"\x01") == (2**62, 10)


@pytest.mark.parametrize("last", [0x10, 0x7F])
def test_int_varint_beyond_32_bits(last: int) -> None:
    err = raised(lambda: decode_zigzag_int(b"\xff\xff\xff\xff" + bytes([last])), VarintTooLongError)
    assert err.offset == 0
    assert "exceeds 32 bits" in str(err)


def test_long_varint_beyond_64_bits() -> None:
    err = raised(lambda: decode_zigzag_long(b"\xff" * 9 + b"\x02"), VarintTooLongError)
    assert "exceeds 64 bits" in str(err)


@pytest.mark.parametrize("data", [b"", b"\x80", b"\x80\x80\x80\x80"])
def test_truncated_varint(data: bytes) -> None:
    err = raised(lambda: decode_zigzag_int(data), TruncatedInputError)
    assert err.offset == 0
    assert "ZigZagInt truncated" in str(err)


def test_too_long_varint_inside_a_record_names_seq_and_offset() -> None:
    # An incoming call whose method id varint runs to 6 bytes.
    body = frame(0, b"\x00" + b"\x80" * 6 + b"\x01")
    prefix = encode_record(1, 4, [FORK])
    err = raised(lambda: read_all(prefix + record(5, body)), VarintTooLongError)
    assert err.seq == 5
    # size, type, return-type byte, then the method id
    assert err.offset == len(prefix) + HEADER_SIZE + 3
    assert f"offset {err.offset}" in str(err)


def test_too_long_size_prefix_in_message_reader() -> None:
    first = encode_message(TakeCheckpoint())
    reader = MessageReader()
    err = raised(lambda: reader.messages(first + b"\xff" * 6), VarintTooLongError)
    assert err.offset == len(first)


# --- record length ----------------------------------------------------------------------


@pytest.mark.parametrize("length", [-5, 0, 23])
def test_record_length_below_header(length: int) -> None:
    prefix = encode_record(1, 0, [FORK])
    err = raised(lambda: read_all(prefix + record(1, b"", length=length)), RecordLengthError)
    assert err.offset == len(prefix)
    assert err.seq == 1
    assert f"record length {length} outside 24..{2**28}" in str(err)


def test_record_length_above_maximum() -> None:
    raw = encode_record(1, 3, [IncomingRpc(1, RpcType.FORK, b"x" * 100)])
    assert read_all(raw, max_record_size=len(raw))  # exactly the maximum is fine
    err = raised(lambda: read_all(raw, max_record_size=len(raw) - 1), RecordLengthError)
    assert err.offset == 0
    assert err.seq == 3
    assert f"record length {len(raw)} outside 24..{len(raw) - 1}" in str(err)


def test_header_lengths_checked_by_parse_header() -> None:
    err = raised(lambda: parse_header(record(1, b"", length=10)), RecordLengthError)
    assert err.offset == 0
    err = raised(lambda: parse_header(b"\x00" * 10, 0), TruncatedInputError)
    assert "record header needs 24 bytes, 10 present" in str(err)


@pytest.mark.parametrize("stored", [0, 24, 31])
def test_on_disk_record_with_positive_length(stored: int) -> None:
    body = encode_record(1, 0, [FORK])[HEADER_SIZE:]
    raw = record(0, body, length=stored) + b"\x00\x00"
    err = raised(lambda: read_all(raw, on_disk=True), RecordLengthError)
    assert err.offset == 0
    assert err.seq == 0
    assert f"on-disk record length field {stored} is not negative" in str(err)


def test_on_disk_record_with_too_small_length() -> None:
    raw = record(0, b"", length=-1) + b"\x00\x00"  # -1 stands for length 0
    err = raised(lambda: read_all(raw, on_disk=True), RecordLengthError)
    assert "record length 0 outside" in str(err)


# --- check bytes ------------------------------------------------------------------------


def test_check_bytes_mismatch() -> None:
    prefix = encode_record(1, 0, [FORK])
    bad = bytearray(encode_record(1, 1, [FORK]))
    bad[-1] ^= 0x01  # flip one bit of the arguments
    err = raised(lambda: read_all(prefix + bytes(bad)), CheckBytesError)
    assert err.offset == len(prefix)
    assert err.seq == 1
    assert "do not match contents" in str(err)
    assert f"record seq 1, offset {len(prefix)}" in str(err)
    # Without verification the corrupted record goes through, visibly changed.
    got = read_all(prefix + bytes(bad), verify=False)
    assert got[1].messages != (FORK,)


def test_control_record_check_bytes_are_verified() -> None:
    raw = record(-1, frame(11, b""), check=0)
    err = raised(lambda: read_all(raw), CheckBytesError)
    assert err.seq == -1


def test_checkpoint_record_check_bytes_must_be_zero() -> None:
    body = frame(8, encode_zigzag_long(2))
    raw = record(-2, body, check=check_bytes(body)) + b"ab"
    err = raised(lambda: read_all(raw), CheckBytesError)
    assert err.seq == -2
    assert "checkpoint record check bytes" in str(err)
    assert "expected 0" in str(err)


def test_on_disk_check_bytes_mismatch() -> None:
    body = encode_record(1, 0, [FORK])[HEADER_SIZE:]
    raw = bytearray(encode_disk_record(1, 0, body, [Watermark("a", 1, 2)]))
    raw[HEADER_SIZE + 2] ^= 0x40
    err = raised(lambda: read_all(bytes(raw), on_disk=True), CheckBytesError)
    assert (err.seq, err.offset) == (0, 0)


# --- sequence ids and committer ---------------------------------------------------------


def test_sequence_gap() -> None:
    first = encode_record(1, 5, [FORK])
    control = encode_record(1, -1, [TakeCheckpoint()])
    raw = first + control + encode_record(1, 7, [FORK])
    reader = RecordReader()
    assert [r.seq for r in reader.records(raw[: len(first) + len(control)])] == [5, -1]
    reader.feed(raw[len(first) + len(control) :])
    err = raised(reader.next_record, SequenceError)
    assert err.seq == 7
    assert err.offset == len(first) + len(control)
    assert "sequence id 7 where 6 was expected" in str(err)


@pytest.mark.parametrize("seq", [3, 5])
def test_sequence_going_backwards_or_repeating(seq: int) -> None:
    raw = encode_record(1, 5, [FORK]) + encode_record(1, seq, [FORK])
    err = raised(lambda: read_all(raw), SequenceError)
    assert err.seq == seq
    assert f"sequence id {seq} where 6 was expected" in str(err)


def test_first_sequence_id_given_by_caller() -> None:
    err = raised(lambda: read_all(encode_record(1, 1, [FORK]), next_seq=0), SequenceError)
    assert (err.seq, err.offset) == (1, 0)


@pytest.mark.parametrize("seq", [-3, -(2**63)])
def test_negative_sequence_ids_other_than_control_and_checkpoint(seq: int) -> None:
    err = raised(lambda: read_all(record(seq, frame(2, b""))), SequenceError)
    assert err.seq == seq
    assert f"sequence id {seq} not allowed here" in str(err)


def test_negative_sequence_id_on_disk() -> None:
    body = frame(2, b"")
    raw = encode_disk_record(1, -1, body)
    err = raised(lambda: read_all(raw, on_disk=True), SequenceError)
    assert err.seq == -1


def test_committer_change() -> None:
    first = encode_record(7, 0, [FORK])
    raw = first + encode_record(8, 1, [FORK])
    err = raised(lambda: read_all(raw), CommitterError)
    assert (err.seq, err.offset) == (1, len(first))
    assert "committer id 8, expected 7" in str(err)


def test_committer_given_by_caller() -> None:
    err = raised(lambda: read_all(encode_record(7, 0, [FORK]), committer_id=1), CommitterError)
    assert "committer id 7, expected 1" in str(err)


# --- message types and batches ----------------------------------------------------------


@pytest.mark.parametrize("type_byte", [16, 99, 255])
def test_unknown_message_type_names_type_and_seq(type_byte: int) -> None:
    prefix = encode_record(1, 41, [FORK])
    body = encode_message(FORK) + frame(type_byte, b"xyz")
    err = raised(lambda: read_all(prefix + record(42, body)), UnknownMessageTypeError)
    assert err.seq == 42
    assert err.offset == len(prefix) + HEADER_SIZE + len(encode_message(FORK)) + 1
    assert f"unknown message type {type_byte}" in str(err)
    assert "record seq 42" in str(err)


def test_unknown_message_type_in_control_record() -> None:
    err = raised(lambda: read_all(record(-1, frame(16, b""))), UnknownMessageTypeError)
    assert err.seq == -1
    assert "unknown message type 16 (record seq -1" in str(err)


def test_unknown_message_type_in_message_reader() -> None:
    first = encode_message(TakeCheckpoint())
    reader = MessageReader()
    err = raised(lambda: reader.messages(first + frame(20, b"")), UnknownMessageTypeError)
    assert err.offset == len(first) + 1
    assert "unknown message type 20" in str(err)


def test_unknown_message_type_inside_a_batch() -> None:
    raw = frame(5, encode_zigzag_int(1) + frame(77, b""))
    err = raised(lambda: decode_message(raw), UnknownMessageTypeError)
    assert "unknown message type 77" in str(err)


def _batch(
    type_byte: int, count: int, inner: list[Message], replayable: int | None = None
) -> bytes:
    data = encode_zigzag_int(count)
    if replayable is not None:
        data += encode_zigzag_int(replayable)
    return frame(type_byte, data + b"".join(encode_message(m) for m in inner))


@pytest.mark.parametrize(("type_byte", "replayable"), [(5, None), (13, 0)])
def test_batch_count_says_more_than_it_holds(type_byte: int, replayable: int | None) -> None:
    raw = _batch(type_byte, 3, [FORK, FORK], replayable)
    err = raised(lambda: decode_message(raw), BatchCountError)
    assert "batch states 3 messages but holds 2" in str(err)
    assert err.offset == 2


@pytest.mark.parametrize(("type_byte", "replayable"), [(5, None), (13, 0)])
def test_batch_count_says_fewer_than_it_holds(type_byte: int, replayable: int | None) -> None:
    raw = _batch(type_byte, 1, [FORK, FORK], replayable)
    err = raised(lambda: decode_message(raw), BatchCountError)
    assert "batch states 1 messages but holds more" in str(err)
    # Where the unexpected second message starts.
    assert err.offset == len(raw) - len(encode_message(FORK))


def test_batch_count_error_in_a_record_names_seq() -> None:
    raw = record(12, _batch(5, 0, [FORK]))
    err = raised(lambda: read_all(raw), BatchCountError)
    assert err.seq == 12
    assert "record seq 12" in str(err)


def test_negative_batch_count() -> None:
    err = raised(lambda: decode_message(_batch(5, -1, [])), BatchCountError)
    assert "negative batch count -1" in str(err)


@pytest.mark.parametrize("replayable", [-1, 1, 3])
def test_replayable_count_not_the_non_impulse_count(replayable: int) -> None:
    err = raised(lambda: decode_message(_batch(13, 2, [FORK, FORK], replayable)), BatchCountError)
    assert f"batch states {replayable} replayable messages but holds 2" in str(err)


def test_encoder_refuses_a_wrong_replayable_count() -> None:
    with pytest.raises(ValueError, match="replayable count 2, but the batch holds 1"):
        encode_message(CountReplayableRpcBatch((FORK, IMPULSE), 2))


def test_encoder_refuses_sender_on_a_fork() -> None:
    with pytest.raises(ValueError, match="FORK call carries no sender"):
        encode_message(IncomingRpc(3, RpcType.FORK, b"", sender="x"))


def test_batch_holding_a_non_rpc() -> None:
    raw = _batch(5, 2, [FORK, TakeCheckpoint()])
    err = raised(lambda: decode_message(raw), MalformedMessageError)
    assert "batch holds a TakeCheckpoint" in str(err)
    # size, type, count, the fork, then the offending message
    assert err.offset == 3 + len(encode_message(FORK))


def test_deeply_nested_batches_are_rejected_without_recursing() -> None:
    prev = inner = frame(5, encode_zigzag_int(0))
    for _ in range(5000):
        prev, inner = inner, frame(5, encode_zigzag_int(1) + inner)
    err = raised(lambda: decode_message(inner), MalformedMessageError)
    assert "batch holds a batch" in str(err)
    assert err.offset == len(inner) - len(prev)  # where the second level starts


# --- names ------------------------------------------------------------------------------

BAD_UTF8 = b"\xc3\x28"


def test_destination_not_utf8() -> None:
    raw = frame(0, encode_zigzag_int(2) + BAD_UTF8 + b"\x00\x06\x01")
    err = raised(lambda: decode_message(raw, 0, Direction.TO_COORDINATOR), InvalidNameError)
    assert err.offset == 3
    assert "destination name is not valid UTF-8" in str(err)


def test_sender_not_utf8_in_async_call() -> None:
    data = b"\x00\x06\x00" + encode_zigzag_int(2) + BAD_UTF8 + encode_zigzag_long(1)
    err = raised(lambda: decode_message(frame(0, data)), InvalidNameError)
    assert err.offset == 6
    assert "sender name is not valid UTF-8" in str(err)


def test_sender_not_utf8_in_return_value() -> None:
    data = b"\x02" + encode_zigzag_int(2) + BAD_UTF8 + encode_zigzag_long(1)
    err = raised(lambda: read_all(record(3, frame(0, data))), InvalidNameError)
    assert err.seq == 3
    assert err.offset == HEADER_SIZE + 4


def test_attach_to_not_utf8() -> None:
    err = raised(lambda: decode_message(frame(1, b"ab" + BAD_UTF8)), InvalidNameError)
    assert err.offset == 2
    assert "AttachTo name is not valid UTF-8" in str(err)


def test_watermark_name_not_utf8() -> None:
    tail = encode_zigzag_int(1) + encode_zigzag_int(2) + BAD_UTF8 + b"\x00" * 16 + b"\x00"
    err = raised(lambda: decode_disk_tail(tail), InvalidNameError)
    assert err.offset == 2
    assert "watermark name is not UTF-8" in str(err)
    body = encode_record(1, 0, [FORK])[HEADER_SIZE:]
    raw = encode_disk_record(1, 0, body)[: -len(encode_zigzag_int(0)) * 2] + tail
    err = raised(lambda: read_all(raw, on_disk=True), InvalidNameError)
    assert err.seq == 0
    assert err.offset == len(raw) - len(tail) + 2


# --- other malformed messages -----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "text"),
    [
        (b"\x00", "message size 0 (must be at least 1)"),
        (b"\x01", "message size -1 (must be at least 1)"),
        (frame(0, b"\x00\x06\x03"), "unknown RPC type 3"),
        (frame(0, b"\x04"), "unknown RPC return type 4"),
        (frame(0, b"\x01\x00\x02\x03"), "negative return value length -2"),
        (frame(0, b"\x02\x00\x02\x00"), "1 trailing bytes after return value"),
        (frame(2, b"\x00"), "TAKE_CHECKPOINT carries 1 unexpected bytes"),
        (frame(3, b"\x02\x04\x00"), "1 trailing bytes in COMMIT"),
        (frame(8, b"\x01"), "negative checkpoint length -1"),
    ],
)
def test_malformed_messages(raw: bytes, text: str) -> None:
    err = raised(lambda: decode_message(raw), MalformedMessageError)
    assert text in str(err)
    assert err.offset is not None


def test_message_reader_size_bounds() -> None:
    raw = encode_message(OutgoingRpc("", 1, RpcType.FORK, b"x" * 50))
    reader = MessageReader(max_message_size=10)
    err = raised(lambda: reader.messages(raw), MalformedMessageError)
    assert "message size 55 outside 1..10" in str(err)
    assert err.offset == 0


def test_checkpoint_above_the_maximum() -> None:
    raw = encode_record(1, -2, [Checkpoint(b"x" * 11)])
    err = raised(lambda: read_all(raw, max_checkpoint_size=10), CheckpointSizeError)
    assert err.seq == -2
    assert "checkpoint of 11 bytes exceeds the maximum 10" in str(err)
    reader = MessageReader(max_checkpoint_size=10)
    err = raised(
        lambda: reader.messages(encode_message(Checkpoint(b"x" * 11))), CheckpointSizeError
    )
    assert "checkpoint of 11 bytes exceeds the maximum 10" in str(err)


# --- readers stay failed ----------------------------------------------------------------


def test_record_reader_keeps_raising_after_an_error() -> None:
    good = encode_record(1, 0, [FORK])
    bad = bytearray(encode_record(1, 1, [FORK]))
    bad[-1] ^= 0xFF
    reader = RecordReader()
    assert reader.records(good) == [LogRecord(1, 0, (FORK,))]
    reader.feed(bytes(bad))
    first = raised(reader.next_record, CheckBytesError)
    # More valid input does not make it resync.
    reader.feed(encode_record(1, 2, [FORK]))
    for call in (reader.next_record, reader.next_raw, lambda: list(reader)):
        again = raised(call, CheckBytesError)
        assert (again.seq, again.offset, str(again)) == (first.seq, first.offset, str(first))


def test_record_reader_keeps_raising_after_a_decode_error() -> None:
    reader = RecordReader()
    reader.feed(record(0, frame(99, b"")) + encode_record(1, 1, [FORK]))
    raised(reader.next_record, UnknownMessageTypeError)
    raised(reader.next_record, UnknownMessageTypeError)


def test_message_reader_keeps_raising_after_an_error() -> None:
    reader = MessageReader()
    reader.feed(frame(99, b"") + encode_message(TakeCheckpoint()))
    raised(reader.next_message, UnknownMessageTypeError)
    raised(reader.next_message, UnknownMessageTypeError)
    # A frame that decodes badly fails the reader too, though the framing was intact.
    reader = MessageReader()
    reader.feed(frame(3, b"\x00") + encode_message(TakeCheckpoint()))
    raised(reader.next_message, TruncatedInputError)
    raised(reader.next_message, TruncatedInputError)
