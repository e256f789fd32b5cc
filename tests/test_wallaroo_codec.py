"""The Wallaroo connector codec in both dialects: the reference's byte vectors and our own
from the seed's layouts, the tables, what a dialect cannot express, round trips of every
frame (whole and in arbitrary chunks). Malformed input and fuzzing are in
``test_wallaroo_errors.py``.

The hex literals are written out by hand from seed 000, seed 001 and the reference, not
produced by our encoder. Each is split as ``length | tag | fields``.
"""

from __future__ import annotations

import hashlib
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import immortals.wallaroo as wallaroo
from immortals.wallaroo import (
    DEFAULT_MAX_FRAME_BYTES,
    DIALECTS,
    DRAFT_VERSION,
    LENGTH_PREFIX_BYTES,
    NOTHING_SEEN,
    V3_VERSION,
    Ack,
    Dialect,
    EncodeError,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    WallarooError,
    decode,
    encode,
    end_of_stream,
    stream_id_for,
)
from immortals.wallaroo.codec import split_frames
from tests import strategies_wallaroo as s
from tests.wallaroo_reader import FrameReader

DRAFT, V3 = Dialect.DRAFT, Dialect.V3
F = MessageFlags

# --- byte vectors -----------------------------------------------------------------------

# The reference, *Dialect v3*, Examples.
REFERENCE_VECTORS: list[tuple[str, Frame]] = [
    ("00000005" + "01" + "00000064", Ok(100)),
    ("00000009" + "08" + "0000000000000001", EosMessage(1)),
]

# Seed 000 and 001, little-endian, ASCII tags (H=48 O=4f E=45 N=4e M=4d A=41 !=21), and
# the reference's tags 4 and 7 for NOTIFY_ACK and RESTART.
DRAFT_VECTORS: list[tuple[str, Frame]] = [
    (
        "1b000000" + "48"
        + "01000000000000000000000000000000"  # version 1, 16 bytes
        + "0200" + "636b"  # cookie b"ck"
        + "0100" + "70"  # program "p"
        + "0100" + "69",  # instance "i"
        Hello(1, b"ck", "p", "i"),
    ),
    (
        "17000000" + "48"
        + "c9f3424b57afdc1c4ce36604b45c70b8"  # DRAFT_VERSION, little-endian
        + "0000" + "0000" + "0000",
        Hello(DRAFT_VERSION, b"", "", ""),
    ),
    ("05000000" + "4f" + "64000000", Ok(100)),
    (
        "25000000" + "4f" + "64000000"
        + "0100000000000000" + "0700000000000000"
        + "ffffffffffffffff" + "0000000000000000",
        Ok(100, ((1, 7), (2**64 - 1, 0))),
    ),
    ("06000000" + "45" + "0300" + "626164", Error("bad")),
    (
        "14000000" + "4e" + "0100000000000000" + "0100" + "73" + "0000000000000000",
        Notify(1, "s"),
    ),
    (
        "15000000" + "4e" + "0201000000000000" + "0200" + "c3a9" + "2a00000000000000",
        Notify(0x0102, "é", 42),
    ),
    (
        "12000000" + "04" + "01" + "0100000000000000" + "ffffffffffffffff",
        NotifyAck(True, 1, NOTHING_SEEN),
    ),
    (
        # stream 1, flags 0, message id 2, payload "hi"
        "15000000" + "4d" + "0100000000000000" + "0000" + "0200000000000000" + "6869",
        Message(1, 2, b"hi"),
    ),
    (
        # a boundary flagged EOS: flags EOS|BOUNDARY = 6, no payload
        "13000000" + "4d" + "0100000000000000" + "0600" + "0500000000000000",
        Message(1, 5, None, F.EOS),
    ),
    (
        # flags EPHEMERAL|UNSTABLE_REFERENCE|EVENT_TIME = 0x19, event time 0x0102
        "1c000000" + "4d" + "0200000000000000" + "1900" + "0300000000000000"
        + "0201000000000000" + "78",
        Message(2, 3, b"x", F.EPHEMERAL | F.UNSTABLE_REFERENCE, event_time=0x0102),
    ),
    (
        # an empty payload is not a boundary in the draft
        "13000000" + "4d" + "0900000000000000" + "0000" + "0800000000000000",
        Message(9, 8, b""),
    ),
    ("05000000" + "41" + "0a000000", Ack(10)),
    (
        "15000000" + "41" + "0a000000" + "0100000000000000" + "0200000000000000",
        Ack(10, ((1, 2),)),
    ),
    (
        "15000000" + "21" + "03000000" + "0100000000000000" + "0900000000000000",
        Nack(3, 1, 9),
    ),
    ("08000000" + "07" + "03000000" + "683a31", Restart("h:1")),
    ("08000000" + "08" + "01000000" + "68" + "581b", Migrate("h", 7000)),
    ("01000000" + "09", MigrationAck()),
]  # fmt: skip

# The reference's v3 layouts, big-endian, tags 0..8.
V3_VECTORS: list[tuple[str, Frame]] = [
    (
        "00000012" + "00"
        + "0005" + "302e302e31"  # version "0.0.1"
        + "0002" + "636b" + "0001" + "70" + "0001" + "69",
        Hello(V3_VERSION, b"ck", "p", "i"),
    ),
    ("00000005" + "01" + "00000000", Ok(0)),
    ("00000006" + "02" + "0003" + "626164", Error("bad")),
    (
        "00000014" + "03" + "0000000000000001" + "0001" + "73" + "0000000000000102",
        Notify(1, "s", 0x0102),
    ),
    (
        "00000012" + "04" + "00" + "0000000000000001" + "0000000000000005",
        NotifyAck(False, 1, 5),
    ),
    (
        # stream 1, message 2, event time -1, key "k", payload "hi"
        "0000001e" + "05" + "0000000000000001" + "0000000000000002" + "ffffffffffffffff"
        + "0001" + "6b" + "6869",
        Message(1, 2, b"hi", event_time=-1, key=b"k"),
    ),
    (
        # no key (length 0) and no payload (nothing left)
        "0000001b" + "05" + "0000000000000001" + "0000000000000002" + "0000000000000000"
        + "0000",
        Message(1, 2, None, event_time=0),
    ),
    ("00000009" + "06" + "0000000a" + "00000000", Ack(10)),
    (
        "00000019" + "06" + "0000000a" + "00000001"
        + "0000000000000001" + "0000000000000002",
        Ack(10, ((1, 2),)),
    ),
    ("00000008" + "07" + "00000003" + "683a31", Restart("h:1")),
]  # fmt: skip

VECTORS = [(DRAFT, h, f) for h, f in DRAFT_VECTORS] + [
    (V3, h, f) for h, f in REFERENCE_VECTORS + V3_VECTORS
]


@pytest.mark.parametrize(("dialect", "hex_", "frame"), VECTORS)
def test_vectors(dialect: Dialect, hex_: str, frame: Frame) -> None:
    assert encode(frame, dialect).hex() == hex_
    assert decode(bytes.fromhex(hex_), dialect) == frame


@pytest.mark.parametrize("dialect", list(Dialect))
def test_every_frame_of_each_dialect_has_a_vector(dialect: Dialect) -> None:
    covered = {type(f) for d, _, f in VECTORS if d is dialect}
    assert covered == set(DIALECTS[dialect].tags)


def test_the_draft_is_the_default() -> None:
    assert encode(Ok(100)).hex() == "05000000" + "4f" + "64000000"
    assert decode(bytes.fromhex("05000000" + "4f" + "64000000")) == Ok(100)
    assert Dialect("v3") is V3


# --- the tables and constants -----------------------------------------------------------


def test_tables() -> None:
    draft, v3 = DIALECTS[DRAFT], DIALECTS[V3]
    assert {cls.__name__: chr(tag) for cls, tag in draft.tags.items() if tag > 32} == {
        "Hello": "H",
        "Ok": "O",
        "Error": "E",
        "Notify": "N",
        "Message": "M",
        "Ack": "A",
        "Nack": "!",
    }
    assert {cls.__name__: tag for cls, tag in draft.tags.items() if tag < 32} == {
        "NotifyAck": 4,
        "Restart": 7,
        "Migrate": 8,
        "MigrationAck": 9,
    }
    assert [v3.tags[c] for c in (Hello, Ok, Error, Notify, NotifyAck, Message, Ack)] == list(
        range(7)
    )
    assert (v3.tags[Restart], v3.tags[EosMessage]) == (7, 8)
    for spec in (draft, v3):
        assert {tag: cls for cls, tag in spec.tags.items()} == dict(spec.classes)
        assert (spec.short_length_bytes, spec.long_length_bytes) == (2, 4)
    assert (draft.byte_order, draft.version) == ("little", DRAFT_VERSION)
    assert (v3.byte_order, v3.version) == ("big", "0.0.1")


def test_constants() -> None:
    assert V3_VERSION == "0.0.1"
    assert NOTHING_SEEN == 2**64 - 1
    assert DEFAULT_MAX_FRAME_BYTES == 4 * 1024 * 1024
    assert LENGTH_PREFIX_BYTES == 4
    title = b"Wallaroo Connector Protocol: source-only, async, credit based flow"
    assert int(hashlib.sha256(title).hexdigest()[:32], 16) == DRAFT_VERSION


def test_stream_id_for_is_the_released_connectors() -> None:
    # sha256("abc") = ba7816bf8f01cfea 414140de...
    assert stream_id_for("abc") == 0xBA7816BF8F01CFEA
    assert stream_id_for(b"abc") == 0xBA7816BF8F01CFEA
    assert stream_id_for("é") == int(hashlib.sha256("é".encode()).hexdigest()[:16], 16)


def test_end_of_stream_in_each_dialect() -> None:
    draft = end_of_stream(DRAFT, 3, 41)
    assert draft == Message(3, 41, None, F.EOS)
    assert isinstance(draft, Message) and draft.eos and draft.boundary
    assert draft.wire_flags == F.EOS | F.BOUNDARY
    assert end_of_stream("v3", 3, 41) == EosMessage(3)


def test_public_names_are_exported() -> None:
    names = {
        "DEFAULT_MAX_FRAME_BYTES", "DIALECTS", "DRAFT_VERSION", "LENGTH_PREFIX_BYTES",
        "NOTHING_SEEN", "V3_VERSION", "Dialect", "DialectSpec", "decode",
        "encode", "end_of_stream", "stream_id_for", "Ack", "EosMessage", "Error", "Frame",
        "Hello", "Message", "MessageFlags", "Migrate", "MigrationAck", "Nack", "Notify",
        "NotifyAck", "Ok", "Restart", "EncodeError", "FrameTooLargeError",
        "InvalidBoolError", "InvalidFlagsError", "InvalidTextError", "ProtocolError",
        "TrailingBytesError", "TruncatedFrameError", "TruncatedStreamError",
        "UnknownTagError", "WallarooError",
    }  # fmt: skip
    assert names <= set(wallaroo.__all__)
    for name in names:
        assert getattr(wallaroo, name) is not None


# --- frame classes ----------------------------------------------------------------------


def test_frames_are_frozen_and_normalised() -> None:
    ok = Ok(1, [[1, 2]])  # type: ignore[list-item]
    assert ok.points_of_reference == ((1, 2),)
    assert Hello(1, bytearray(b"c"), "p", "i").cookie == b"c"
    assert Message(1, 2, bytearray(b"x"), 4).flags is F.EOS
    with pytest.raises(AttributeError):
        ok.initial_credits = 2  # type: ignore[misc]


@pytest.mark.parametrize(
    ("build", "where"),
    [
        (lambda: Ok(2**32), "Ok.initial_credits"),
        (lambda: Ok(1, ((2**64, 0),)), "Ok.points_of_reference[0]"),
        (lambda: Notify(-1, "s"), "Notify.stream_id"),
        (lambda: Notify(True, "s"), "Notify.stream_id"),
        (lambda: Hello(True, b"", "", ""), "Hello.version"),
        (lambda: Migrate("h", 65536), "Migrate.port"),
        (lambda: Hello(2**128, b"", "", ""), "Hello.version"),
        (lambda: Message(1, 2, None, F.BOUNDARY), "Message.flags"),
        (lambda: Message(1, 2, b"", F.EVENT_TIME), "Message.flags"),
        (lambda: Message(1, 2, b"", 0x40), "Message.flags"),
        (lambda: Message(1, 2, b"", event_time=2**64), "Message.event_time"),
        (lambda: Message(1, 2, b"", event_time=-(2**63) - 1), "Message.event_time"),
        (lambda: Ack(1, ((0, -1),)), "Ack.acks[0]"),
    ],
)
def test_constructors_refuse_what_no_dialect_can_carry(build: object, where: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(where)):
        build()  # type: ignore[operator]


def test_constructors_check_types() -> None:
    with pytest.raises(TypeError, match=r"Error\.reason"):
        Error(b"bad")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        NotifyAck(1, 1, 1)  # type: ignore[arg-type]


# --- what a dialect cannot express ------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "dialect", "field", "words"),
    [
        (Nack(1, 2), V3, None, "v3 has no NACK"),
        (Migrate("h", 1), V3, None, "v3 has no MIGRATE"),
        (MigrationAck(), V3, None, "v3 has no MIGRATION_ACK"),
        (EosMessage(1), DRAFT, None, "MESSAGE flagged EOS"),
        (Ok(1, ((1, 2),)), V3, "points_of_reference", "has no points_of_reference"),
        (Message(1, 2, b"x", key=b"k"), DRAFT, "key", "no key"),
        (Message(1, 2, None, event_time=5), DRAFT, "event_time", "boundary"),
        (Message(1, 2, b"x", event_time=-5), DRAFT, "event_time", "not a u64"),
        (Message(1, 2, b"x", F.EOS, event_time=0), V3, "flags", "no flags"),
        (Message(1, 2, b"x"), V3, "event_time", "always carries an event time"),
        (Message(1, 2, b"x", event_time=2**63), V3, "event_time", "not an i64"),
        (Message(1, 2, b"x", event_time=0, key=b""), V3, "key", "empty key"),
        (Message(1, 2, b"", event_time=0), V3, "payload", "empty payload"),
        (Message(1, 2, b"x", event_time=0, key=b"k" * 65536), V3, "key", "over the u16"),
        (Hello("0.0.1", b"", "", ""), DRAFT, "version", "expects an integer"),
        (Hello(1, b"", "", ""), V3, "version", "expects text"),
        (Error("x" * 65536), DRAFT, "reason", "65536 bytes, over the u16 length's 65535"),
        (Notify(1, "\ud800"), V3, "stream_name", "not encodable as UTF-8"),
        (Hello(1, b"c" * 65536, "", ""), DRAFT, "cookie", "over the u16"),
    ],
)
def test_encode_refuses_what_the_dialect_cannot_express(
    frame: Frame, dialect: Dialect, field: str | None, words: str
) -> None:
    with pytest.raises(EncodeError) as info:
        encode(frame, dialect)
    err = info.value
    assert (err.frame, err.field, err.dialect) == (type(frame).__name__, field, dialect.value)
    assert words in err.reason
    assert isinstance(err, ValueError) and isinstance(err, WallarooError)
    assert str(err).startswith(f"{type(frame).__name__}")
    assert f"cannot be encoded in {dialect.value}: " in str(err)


def test_encode_refuses_a_frame_over_the_limit() -> None:
    big = Message(1, 2, b"\x00" * 100)
    assert len(encode(big, max_frame_bytes=119)) == 4 + 119
    with pytest.raises(EncodeError) as info:
        encode(big, max_frame_bytes=118)
    assert info.value.frame == "Message"
    assert info.value.reason.startswith("a frame of 119 bytes is over the limit of 118")


def test_encode_refuses_what_is_not_a_frame() -> None:
    with pytest.raises(TypeError, match="str is not a connector frame"):
        encode("hello")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        encode(Ok(1), "v4")


# --- round trips ------------------------------------------------------------------------


@given(s.draft_frames)
def test_draft_round_trip(frame: Frame) -> None:
    assert decode(encode(frame, DRAFT), DRAFT) == frame


@given(s.v3_frames)
def test_v3_round_trip(frame: Frame) -> None:
    assert decode(encode(frame, V3), V3) == frame


def test_split_frames_cuts_whole_frames_and_stops_at_an_oversize_length() -> None:
    ok = bytes.fromhex("00000005" + "01" + "00000064")  # v3 OK(100): length, tag, credits
    body = ok[LENGTH_PREFIX_BYTES:]
    assert split_frames(bytearray(ok + ok[:6]), "big", 64) == ([body], 9, None)
    assert split_frames(bytearray(ok + ok), "big", 64, most=1) == ([body], 9, None)
    assert split_frames(bytearray(ok[:3]), "big", 64) == ([], 0, None)
    # A length of 65 over a limit of 64: reported where it starts, before its body came.
    over = bytearray(ok + bytes.fromhex("00000041") + b"\x05")
    assert split_frames(over, "big", 64) == ([body], 9, (9, 65))
    # The draft's lengths are little-endian: "05000000" is 5.
    draft_ok = bytes.fromhex("05000000" + "4f" + "64000000")
    assert split_frames(bytearray(draft_ok), "little", 5) == ([draft_ok[4:]], 9, None)
    assert split_frames(bytearray(draft_ok), "little", 4) == ([], 0, (0, 5))


@settings(max_examples=200)
@given(st.sampled_from(list(Dialect)), st.data())
def test_split_and_decode_in_any_chunking(dialect: Dialect, data: st.DataObject) -> None:
    """The codec's splitting and decoding, through the tests' reader, whatever the
    chunks the stream arrives in."""
    frames = data.draw(st.lists(s.frames(dialect), max_size=6))
    stream = b"".join(encode(f, dialect) for f in frames)
    reader = FrameReader(dialect)
    got: list[Frame] = []
    for chunk in data.draw(s.chunked(stream)):
        reader.feed(chunk)
        got.extend(reader)
    reader.close()
    assert got == frames
    assert (reader.buffered, reader.offset) == (0, len(stream))


def test_reader_next_frame_and_buffered() -> None:
    reader = FrameReader(V3)
    assert reader.next_frame() is None
    reader.feed(bytes.fromhex("00000005" + "01" + "000000"))
    assert (reader.next_frame(), reader.buffered) == (None, 8)
    reader.feed(bytes.fromhex("64" + "00000009" + "08"))
    assert reader.next_frame() == Ok(100)
    assert (reader.next_frame(), reader.buffered, reader.offset) == (None, 5, 9)
    reader.feed(bytes.fromhex("0000000000000001"))
    assert list(reader) == [EosMessage(1)]
    reader.close()


def test_reader_reads_a_frame_of_exactly_the_limit() -> None:
    frame = encode(Message(1, 2, b"\x00" * 100))
    reader = FrameReader(DRAFT, max_frame_bytes=119)
    reader.feed(frame)
    assert list(reader) == [Message(1, 2, b"\x00" * 100)]
    assert decode(frame, max_frame_bytes=119) == Message(1, 2, b"\x00" * 100)
