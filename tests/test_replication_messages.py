"""The replicated log's frames (``coordinator/replication/messages.py``): hand-written byte
vectors from the layout in the module's docstring, round trips, the incremental reader,
and malformed frames, each refused naming the field and the offset."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.coordinator.replication import (
    Ack,
    Append,
    AskRole,
    CheckpointChunk,
    FrameReader,
    Group,
    Handover,
    Heartbeat,
    History,
    Message,
    NewTerm,
    OutboxTrim,
    Position,
    Probe,
    Refuse,
    ReplicationProtocolError,
    ReplicationRuleError,
    Resend,
    Roll,
    Silence,
    Sync,
    TakenChunk,
    decode_frame,
    encode_frame,
    encode_parts,
)
from ambrosia_py.wire.records import Watermark, encode_disk_record

# An on-disk record with no messages, written out byte by byte (reference ambrosia.md, log
# record header): committer id 1 (i32), length 24 stored as -24-1 = -25 (i32), check bytes
# XXH64 of the empty body with seed 0 (0xef46db3751d8e999, u64), seq 7 (i64); then the
# watermark sections: zigzag count 0, zigzag count 0.
EMPTY_RECORD_7 = bytes.fromhex(
    "01000000" "e7ffffff" "99e9d85137db46ef" "0700000000000000" "00" "00"
)  # fmt: skip

G3 = Group.of({0, 1, 2}, 2)
CHANGING = Group.of({0, 1, 2, 3}, 3, version=300, previous=G3)
TWO = Group.of({5, 129}, 1, version=1)

VECTORS: list[tuple[Message, str]] = [
    # length | version 1 | kind | fields (LEB128: 300 is "ac 02", 129 is "81 01")
    # a group: version | members (count, then each, increasing) | ack | changing, then
    # if changing the group it changes from (members | ack). Replicas 0, 1, 2
    # committing on 2, as the store's group 0:
    (NewTerm(5, G3), "0a 01 01 05 00 03 000102 02 00"),
    # group 300: replicas 0 to 3 committing on 3, changing from 0 to 2 committing on 2
    (NewTerm(6, CHANGING), "11 01 01 06 ac02 04 00010203 03 01 03 000102 02"),
    (Refuse(300), "04 01 08 ac02"),
    (Heartbeat(2, 129, 7), "06 01 05 02 8101 07"),
    (Ack(3, 10, 12), "05 01 06 03 0a 0c"),
    (Resend(1, 0), "04 01 07 01 00"),
    (
        Position(4, 20, History.of([(1, 0), (3, 15)]), G3),
        "12 01 02 04 14 02 0100 030f 00 03 000102 02 00 00 00",
    ),
    # group 1: replicas 5 and 129 committing on 1; incarnation 300
    (Position(4, 0, History(), TWO, False, 300), "0f 01 02 04 00 00 01 02 05 8101 01 00 00 ac02"),
    (
        Position(7, 0, History(), G3, recovering=True, incarnation=5),
        "0e 01 02 07 00 00 00 03 000102 02 00 01 05",
    ),
    # ... then version 2 of the instance from seq 300; the primary's log ends at 301
    (
        Sync(4, History.of([(1, 0), (4, 20)]), 2, 300, log_end=301, answers=129),
        "0f 01 03 04 02 0100 0414 02 ac02 ad02 8101",
    ),
    (CheckpointChunk(2, 40, 5, 2, b"cd"), "08 01 09 02 28 05 02 6364"),
    (CheckpointChunk(2, 40, 0, 0, b""), "06 01 09 02 28 00 00"),
    (Append(2, 7, 6, (EMPTY_RECORD_7,)), "21 01 04 02 07 06 01 1a" + EMPTY_RECORD_7.hex()),
    (Append(9, 3, 3, ()), "06 01 04 09 03 03 00"),
    # names in UTF-8 ("é" is c3 a9), each after its byte count
    (OutboxTrim(3, (("bank", 300), ("é", 1))), "0f 01 0a 03 02 04 62616e6b ac02 02 c3a9 01"),
    (OutboxTrim(1, ()), "04 01 0a 01 00"),
    (Probe(3, 300), "05 01 0b 03 ac02"),
    (Silence(3, 1, True), "05 01 0c 03 01 01"),
    (Silence(7, 2, False), "05 01 0c 07 02 00"),
    (Roll(3, 300), "05 01 0d 03 ac02"),
    (AskRole(3, 300), "05 01 0f 03 ac02"),
    (Handover(3, 2, 300), "06 01 10 03 02 ac02"),
    (TakenChunk(2, 40, 5, 2, b"cd"), "08 01 0e 02 28 05 02 6364"),
]


@pytest.mark.parametrize(("msg", "hex_"), VECTORS)
def test_vectors_encode_and_decode(msg: Message, hex_: str) -> None:
    frame = bytes.fromhex(hex_.replace(" ", ""))
    assert encode_frame(msg) == frame
    assert decode_frame(frame) == msg


def test_append_parts_leave_records_uncopied() -> None:
    record = encode_disk_record(1, 7, b"x" * 5000)
    parts = encode_parts(Append(1, 7, 0, (record,)))
    assert any(part is record for part in parts)
    decoded = decode_frame(b"".join(parts))
    assert isinstance(decoded, Append) and decoded.records == (record,)


def _record(seq: int, body: bytes = b"", marks: tuple[Watermark, ...] = ()) -> bytes:
    return encode_disk_record(3, seq, body, marks)


@st.composite
def sorted_history(draw: st.DrawFn) -> History:
    """Epochs strictly growing, starts never going down."""
    epochs = sorted(draw(st.sets(st.integers(1, 2**20), max_size=6)))
    starts = sorted(
        draw(st.lists(st.integers(0, 2**40), min_size=len(epochs), max_size=len(epochs)))
    )
    return History.of(zip(epochs, starts, strict=True))


positions = st.integers(0, 2**63 - 1)
members = st.frozensets(st.integers(0, 2**31 - 1), min_size=1, max_size=8)


@st.composite
def groups(draw: st.DrawFn) -> Group:
    """1 <= ack <= members; the group changed from (if any) has version 0 (unsaid)."""

    def one(version: int) -> Group:
        replicas = draw(members)
        return Group.of(replicas, draw(st.integers(1, len(replicas))), version=version)

    current = one(draw(st.integers(0, 2**40)))
    if draw(st.booleans()):
        return current
    return Group.of(current.replicas, current.k, version=current.version, previous=one(0))


@st.composite
def appends(draw: st.DrawFn) -> Append:
    first = draw(st.integers(0, 2**40))
    bodies = draw(st.lists(st.binary(max_size=40), max_size=5))
    marks = (Watermark("peer", 4, 4),) if draw(st.booleans()) else ()
    records = tuple(_record(first + i, body, marks) for i, body in enumerate(bodies))
    return Append(draw(positions), first, draw(positions), records)


@st.composite
def syncs(draw: st.DrawFn) -> Sync:
    """The primary's history ends in its epoch, at or before its log's end; what the
    term ships of its version starts at or before that end too."""
    history = draw(sorted_history())
    epoch = draw(st.integers(2**21, 2**40))
    start = (history.entries[-1].start if history.entries else 0) + draw(st.integers(0, 100))
    log_end = start + draw(st.integers(0, 100))
    since = draw(st.integers(0, log_end))
    version = draw(st.integers(0, 2**31 - 1))
    answers = draw(positions)
    return Sync(
        epoch, history.extended(epoch, start), version, since, log_end=log_end, answers=answers
    )


messages = st.one_of(
    st.builds(NewTerm, positions, groups()),
    st.builds(Refuse, positions),
    st.builds(
        lambda e, h, extra, g, r, i: Position(
            e, (h.entries[-1].start if h.entries else 0) + extra, h, g, r, i
        ),
        positions,
        sorted_history(),
        st.integers(0, 100),
        groups(),
        st.booleans(),
        positions,
    ),
    syncs(),
    appends(),
    st.builds(lambda a, b, e: Heartbeat(e, max(a, b), min(a, b)), positions, positions, positions),
    st.builds(lambda a, b, e: Ack(e, min(a, b), max(a, b)), positions, positions, positions),
    st.builds(Resend, positions, positions),
    st.builds(
        lambda e, s, data, pre, post: CheckpointChunk(e, s, pre + len(data) + post, pre, data),
        positions,
        positions,
        st.binary(min_size=1, max_size=50),
        st.integers(0, 1000),
        st.integers(0, 1000),
    ),
    st.builds(Roll, positions, positions),
    st.builds(AskRole, positions, positions),
    st.builds(Handover, positions, st.integers(0, 2**31 - 1), positions),
    st.builds(
        lambda e, s, data, pre: TakenChunk(e, s, pre + len(data), pre, data),
        positions,
        positions,
        st.binary(min_size=1, max_size=50),
        st.integers(0, 1000),
    ),
)


@given(st.lists(messages, max_size=6), st.data())
def test_round_trip_through_the_reader_in_any_cuts(
    msgs: list[Message], data: st.DataObject
) -> None:
    stream = b"".join(encode_frame(m) for m in msgs)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    reader = FrameReader()
    out: list[Message] = []
    for a, b in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        reader.receive_data(stream[a:b])
        while (msg := reader.next_message()) is not None:
            out.append(msg)
    assert out == msgs
    assert reader.buffered == 0


# --- malformed frames: (hex, the words the error must hold, the offset it names) --------

_R = EMPTY_RECORD_7.hex()
MALFORMED = [
    ("00", "frame of 0 bytes", 1),
    ("03 02 01 05", "frame version 2", 1),
    ("03 01 63 05", "unknown frame kind 99", 2),
    ("05 01 05 02 8101", "HEARTBEAT: field commit_end: varint truncated", 6),
    ("0d 01 01 " + "80" * 10 + "01", "NEW_TERM: field epoch: varint longer than 10 bytes", 3),
    ("0c 01 01 80808080808080808001", "NEW_TERM: field epoch is 9223372036854775808", 3),
    ("0b 01 01 05 00 03 000102 02 00 00", "NEW_TERM: 1 trailing bytes", 11),
    ("09 01 01 05 00 02 0001 03 00", "NEW_TERM: a group of 2 replicas committing on 3", 5),
    ("0a 01 01 05 00 03 000102 00 00", "NEW_TERM: a group of 3 replicas committing on 0", 5),
    ("08 01 01 05 00 03 000102", "NEW_TERM: field group ack: varint truncated", 9),
    ("0a 01 01 05 00 03 000201 02 00", "NEW_TERM: group member 1 out of order", 8),
    ("06 01 01 05 00 8002", "NEW_TERM: field group members is 256, over 255", 5),
    ("0a 01 01 05 00 03 000102 02 02", "NEW_TERM: field changing is 2, not 0 or 1", 10),
    ("0a 01 01 05 01 01 00 01 01 00 00", "NEW_TERM: a previous group of 0 replicas", 9),
    ("09 01 02 04 14 02 0300 0205", "POSITION: history[1] (2, 5) does not follow", 8),
    ("07 01 02 04 14 01 0000", "POSITION: history[0].epoch is 0", 6),
    ("08 01 02 04 14 83800400", "POSITION: field history count is 65539, over 65536", 5),
    ("07 01 02 04 02 01 0103", "POSITION: history starts an epoch past log_end 2", 4),
    ("06 01 03 04 01 0300", "SYNC: history does not end in the sender's epoch 4", 4),
    ("07 01 03 04 01 0400 02", "SYNC: field since: varint truncated", 8),
    ("08 01 03 04 01 0400 00 05", "SYNC: field log_end: varint truncated", 9),
    ("0a 01 03 04 01 0400 00 05 03 00", "SYNC: since 5 is past log_end 3", 8),
    ("0a 01 03 04 01 0405 00 00 03 00", "SYNC: history starts epoch 4 past log_end 3", 9),
    ("09 01 03 04 01 0400 00 00 03", "SYNC: field answers: varint truncated", 10),
    ("0d 01 02 04 00 00 00 03 000102 02 00 00", "POSITION: field incarnation: varint", 14),
    ("0d 01 02 04 00 00 00 03 000102 02 00 02", "POSITION: field recovering is 2, not 0 or 1", 13),
    ("09 01 02 04 00 00 00 00 00 00", "POSITION: a group of 0 replicas committing on 0", 7),
    ("05 01 05 02 04 05", "HEARTBEAT: commit_end 5 past log_end 4", 5),
    ("05 01 06 03 0d 0c", "ACK: durable_end 13 past log_end 12", 5),
    ("08 01 09 02 28 03 02 6364", "CHECKPOINT: 2 bytes at offset 2 run past total 3", 6),
    ("06 01 09 02 28 03 00", "CHECKPOINT: a chunk without data", 6),
    ("21 01 04 02 08 06 01 1a" + _R, "APPEND: records[0] has seq 7, expected 8", 8 + 16),
    ("21 01 04 02 07 06 01 1b" + _R, "APPEND: records[0] of 27 bytes runs past the frame", 7),
    ("22 01 04 02 07 06 01 1b" + _R + "00", "records[0]: 1 bytes after its watermarks", 8 + 26),
    (
        "21 01 04 02 07 06 01 1a" + _R.replace("99e9", "98e9"),
        "APPEND: records[0]: check bytes",
        8,
    ),
    (
        "21 01 04 02 07 06 01 1a" + _R.replace("e7ffffff", "18000000"),
        "APPEND: records[0]: on-disk record length field 24 is not negative",
        8,
    ),
    ("0b 01 04 02 07 06 01 04 01000000", "record header needs 24 bytes, 4 present", 8),
    ("06 01 0a 01 01 00 05", "TRIM: trims[0].name of 0 bytes, not 1..1024", 5),
    ("07 01 0a 01 01 01 ff 05", "TRIM: trims[0].name is not UTF-8", 6),
    ("0a 01 0a 01 02 01 61 01 01 61 02", "TRIM: trims[1] names 'a' a second time", 8),
    ("06 01 0a 01 01 05 61", "TRIM: trims[0].name runs past the frame", 5),
    ("05 01 0a 01 8120", "TRIM: field trim count is 4097, over 4096", 4),
    ("05 01 0c 03 01 02", "SILENCE: field silent is 2, not 0 or 1", 5),
    ("03 01 0b 03", "PROBE: field round: varint truncated", 4),
    ("03 01 0d 03", "ROLL: field seq: varint truncated", 4),
    ("05 01 0d 03 01 00", "ROLL: 1 trailing bytes", 5),
    ("04 01 0f 03 81", "ASK_ROLE: field log_end: varint truncated", 4),
    ("04 01 10 03 02", "HANDOVER: field log_end", 5),
    ("08 01 0e 02 28 03 02 6364", "TAKEN: 2 bytes at offset 2 run past total 3", 6),
    ("06 01 0e 02 28 03 00", "TAKEN: a chunk without data", 6),
]


@pytest.mark.parametrize(("hex_", "words", "offset"), MALFORMED)
def test_malformed_frames_are_refused_naming_field_and_offset(
    hex_: str, words: str, offset: int
) -> None:
    frame = bytes.fromhex(hex_.replace(" ", ""))
    with pytest.raises(ReplicationProtocolError) as info:
        decode_frame(frame)
    assert words in str(info.value)
    assert info.value.offset == offset


def test_errors_name_the_offset_in_the_stream_and_the_reader_stays_broken() -> None:
    reader = FrameReader()
    reader.receive_data(encode_frame(NewTerm(1, G3)) + bytes.fromhex("05 01 06 03 0d 0c"))
    assert reader.next_message() == NewTerm(1, G3)
    with pytest.raises(ReplicationProtocolError) as info:
        reader.next_message()
    assert info.value.offset == 11 + 5  # the first frame's 11 bytes, then the field's place
    with pytest.raises(ReplicationProtocolError):
        reader.receive_data(b"\x00")


def test_a_frame_over_the_limit_is_refused_before_it_is_buffered() -> None:
    reader = FrameReader(max_frame=100)
    reader.receive_data(bytes.fromhex("65"))  # 101, and nothing of the frame yet
    with pytest.raises(ReplicationProtocolError) as info:
        reader.next_message()
    assert "frame: 101 bytes, over the limit of 100" in str(info.value)
    assert info.value.offset == 0


def test_a_length_varint_cut_short_waits_and_one_too_long_is_refused() -> None:
    reader = FrameReader()
    reader.receive_data(b"\x80" * 9)
    assert reader.next_message() is None
    reader.receive_data(b"\x80")
    with pytest.raises(ReplicationProtocolError, match="frame: length: varint longer"):
        reader.next_message()


def test_a_cut_frame_and_bytes_after_one_are_refused() -> None:
    frame = encode_frame(Ack(1, 2, 3))
    with pytest.raises(ReplicationProtocolError, match="cut short"):
        decode_frame(frame[:-1])
    with pytest.raises(ReplicationProtocolError, match="1 bytes after the frame"):
        decode_frame(frame + b"\x00")


def test_encoding_refuses_values_no_frame_can_hold() -> None:
    with pytest.raises(ReplicationRuleError, match="epoch -1"):
        encode_frame(NewTerm(-1, G3))
    with pytest.raises(ReplicationRuleError, match="log_end 9223372036854775808"):
        encode_frame(Heartbeat(1, 2**63, 0))


def test_a_trim_naming_a_destination_twice_or_none_is_not_encoded() -> None:
    with pytest.raises(ReplicationRuleError, match="named twice"):
        encode_frame(OutboxTrim(1, (("a", 1), ("a", 2))))
    with pytest.raises(ReplicationRuleError, match="name of 0 bytes"):
        encode_frame(OutboxTrim(1, (("", 1),)))


def test_a_history_out_of_order_is_not_a_value() -> None:
    with pytest.raises(ReplicationRuleError, match="does not follow"):
        History.of([(2, 0), (2, 5)])
    with pytest.raises(ReplicationRuleError, match="does not follow"):
        History.of([(1, 5), (2, 4)])
    with pytest.raises(ReplicationRuleError, match="out of range"):
        History.of([(0, 0)])
