"""The Wallaroo connector codec refusing bad input: malformed frames error by error
(truncated, oversize, trailing bytes, unknown tags, bad bools, UTF-8 and flags), each
naming its dialect, frame, field and stream offset, from ``decode`` and the reader alike;
errors that pickle with their fields; and fuzzing, where random or mutated bytes raise
only the documented errors and the reader holds bounded memory.

Split from ``test_wallaroo_codec.py`` (vectors, tables and round trips); the hex literals
are written out by hand from the seeds and the reference, not produced by our encoder.
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from immortals.wallaroo import (
    DEFAULT_MAX_FRAME_BYTES,
    LENGTH_PREFIX_BYTES,
    Dialect,
    EncodeError,
    FrameTooLargeError,
    Hello,
    InvalidBoolError,
    InvalidFlagsError,
    InvalidTextError,
    Ok,
    ProtocolError,
    TrailingBytesError,
    TruncatedFrameError,
    TruncatedStreamError,
    UnknownTagError,
    WallarooError,
    decode,
    encode,
)
from tests import strategies_wallaroo as s
from tests.wallaroo_reader import FrameReader

DRAFT, V3 = Dialect.DRAFT, Dialect.V3


# --- malformed input --------------------------------------------------------------------


def _bad(hex_: str, dialect: Dialect = DRAFT) -> ProtocolError:
    """The error reading ``hex_`` as a stream raises, from decode and from the reader
    alike (the same class, fields and offsets)."""
    data = bytes.fromhex(hex_)
    with pytest.raises(ProtocolError) as info:
        decode(data, dialect)
    reader = FrameReader(dialect)
    with pytest.raises(ProtocolError) as again:
        reader.feed(data)
        list(reader)
        reader.close()
    assert type(again.value) is type(info.value)
    assert str(again.value) == str(info.value)
    return info.value


def test_an_oversize_length_is_refused_before_its_body() -> None:
    reader = FrameReader(DRAFT, max_frame_bytes=16)
    with pytest.raises(FrameTooLargeError) as info:
        reader.feed(bytes.fromhex("11000000" + "4d"))
    err = info.value
    assert (err.size, err.limit, err.offset, err.field) == (17, 16, 0, "length")
    assert str(err) == "draft Frame.length at offset 0: frame of 17 bytes over the limit of 16"
    assert reader.buffered == 0
    # Failed for good.
    with pytest.raises(FrameTooLargeError):
        reader.feed(b"")
    with pytest.raises(FrameTooLargeError):
        reader.close()


def test_a_4_gib_length_holds_nothing() -> None:
    reader = FrameReader(V3)
    with pytest.raises(FrameTooLargeError) as info:
        reader.feed(b"\xff\xff\xff\xff" + b"\x00" * 1000)
    assert info.value.size == 2**32 - 1
    assert info.value.limit == DEFAULT_MAX_FRAME_BYTES
    assert reader.buffered == 0
    with pytest.raises(FrameTooLargeError):
        decode(b"\xff\xff\xff\xff", V3)


def test_frames_before_an_oversize_length_stay_readable() -> None:
    reader = FrameReader(V3, max_frame_bytes=64)
    with pytest.raises(FrameTooLargeError) as info:
        reader.feed(bytes.fromhex("00000005" + "01" + "00000064" + "00001000" + "05"))
    assert info.value.offset == 9
    assert reader.buffered == 9  # the OK; the bad length and its byte were dropped
    assert reader.next_frame() == Ok(100)
    with pytest.raises(FrameTooLargeError):
        reader.next_frame()


def test_unknown_tags() -> None:
    err = _bad("01000000" + "00")  # 0 is v3's HELLO, not a draft tag
    assert isinstance(err, UnknownTagError)
    assert (err.tag, err.frame, err.field, err.offset) == (0, "Frame", "tag", 4)
    assert str(err) == "draft Frame.tag at offset 4: unknown tag 0x00"
    err = _bad("00000001" + "09", V3)
    assert isinstance(err, UnknownTagError) and err.tag == 9
    err = _bad("00000001" + "48", V3)  # the draft's "H"
    assert isinstance(err, UnknownTagError)


def test_a_frame_too_short_for_its_tag() -> None:
    err = _bad("00000000")
    assert isinstance(err, TruncatedFrameError)
    assert (err.frame, err.field, err.offset) == ("Frame", "tag", 4)


def test_a_field_past_the_end_names_field_and_offset() -> None:
    # NOTIFY whose point of reference has 3 of its 8 bytes.
    err = _bad("0f000000" + "4e" + "0100000000000000" + "0100" + "73" + "000000")
    assert isinstance(err, TruncatedFrameError)
    assert (err.frame, err.field, err.offset) == ("Notify", "point_of_reference", 16)
    assert str(err) == "draft Notify.point_of_reference at offset 16: needs 8 bytes, 3 left"


def test_a_length_past_the_end() -> None:
    err = _bad("00000006" + "02" + "0009" + "626164", V3)
    assert isinstance(err, TruncatedFrameError)
    assert (err.frame, err.field, err.offset) == ("Error", "reason", 5)
    assert err.reason == "length 9 past the end of the frame (3 bytes left)"
    err = _bad("00000008" + "07" + "ffffffff" + "683a31", V3)
    assert (err.frame, err.field, err.offset) == ("Restart", "address", 5)


def test_a_count_past_the_end() -> None:
    err = _bad("00000019" + "06" + "0000000a" + "00000002" + "00" * 16, V3)
    assert isinstance(err, TruncatedFrameError)
    assert (err.frame, err.field, err.offset) == ("Ack", "acks", 9)
    assert err.reason == "count 2 needs 32 bytes, 16 left"
    err = _bad("00000009" + "06" + "0000000a" + "ffffffff", V3)
    assert err.reason == "count 4294967295 needs 68719476720 bytes, 0 left"


def test_a_partial_pair_in_the_draft() -> None:
    err = _bad("11000000" + "41" + "0a000000" + "0100000000000000" + "02000000")
    assert isinstance(err, TruncatedFrameError)
    assert (err.frame, err.field, err.offset) == ("Ack", "acks[0].point", 17)
    err = _bad("07000000" + "4f" + "64000000" + "0100")
    assert (err.frame, err.field, err.offset) == ("Ok", "points_of_reference[0].stream_id", 9)


def test_trailing_bytes() -> None:
    err = _bad("00000006" + "01" + "00000064" + "ff", V3)
    assert isinstance(err, TrailingBytesError)
    assert (err.frame, err.field, err.offset) == ("Ok", None, 9)
    assert str(err) == "v3 Ok at offset 9: 1 trailing byte after the last field"
    err = _bad("03000000" + "09" + "0000")
    assert (err.frame, err.offset, err.reason) == (
        "MigrationAck",
        5,
        "2 trailing bytes after the last field",
    )
    # A boundary ends at its message id.
    err = _bad("14000000" + "4d" + "0100000000000000" + "0200" + "0500000000000000" + "78")
    assert isinstance(err, TrailingBytesError)
    assert (err.frame, err.offset) == ("Message", 23)


def test_bytes_beyond_one_frame_are_trailing_for_decode() -> None:
    with pytest.raises(TrailingBytesError) as info:
        decode(bytes.fromhex("00000005" + "01" + "00000064" + "00"), V3)
    assert (info.value.frame, info.value.offset) == ("Frame", 9)


def test_bad_bools() -> None:
    err = _bad("12000000" + "04" + "02" + "0100000000000000" + "0000000000000000")
    assert isinstance(err, InvalidBoolError)
    assert (err.frame, err.field, err.offset) == ("NotifyAck", "success", 5)
    assert err.reason == "boolean 0x02, expected 0 or 1"


def test_bad_utf8_names_the_byte() -> None:
    err = _bad("00000006" + "02" + "0003" + "61ff62", V3)
    assert isinstance(err, InvalidTextError)
    assert (err.frame, err.field, err.offset) == ("Error", "reason", 8)
    assert err.reason.startswith("invalid UTF-8")
    # The cookie is opaque: any bytes.
    hello = "0000000b" + "00" + "0000" + "0002" + "ffff" + "0000" + "0000"
    assert decode(bytes.fromhex(hello), V3) == Hello("", b"\xff\xff", "", "")
    err = _bad("0000000b" + "00" + "0002" + "c328" + "0000" + "0000" + "0000", V3)
    assert (err.frame, err.field, err.offset) == ("Hello", "version", 7)


def test_bad_flags() -> None:
    msg = "13000000" + "4d" + "0100000000000000" + "{}" + "0500000000000000"
    err = _bad(msg.format("2000"))
    assert isinstance(err, InvalidFlagsError)
    assert (err.frame, err.field, err.offset) == ("Message", "flags", 13)
    assert err.reason == "reserved bits 0x0020 set (flags 0x0020)"
    err = _bad(msg.format("0080"))
    assert err.reason == "reserved bits 0x8000 set (flags 0x8000)"
    err = _bad(msg.format("1200"))  # BOUNDARY|EVENT_TIME
    assert isinstance(err, InvalidFlagsError)
    assert "BOUNDARY with EVENT_TIME" in err.reason


def test_errors_count_stream_offsets() -> None:
    ok = "05000000" + "4f" + "64000000"
    reader = FrameReader(DRAFT)
    reader.feed(bytes.fromhex(ok + ok + "12000000" + "04" + "07" + "00" * 16))
    assert reader.next_frame() == Ok(100)
    assert reader.next_frame() == Ok(100)
    with pytest.raises(InvalidBoolError) as info:
        reader.next_frame()
    assert info.value.offset == 9 + 9 + 5
    # Failed for good: the frames after are never read.
    with pytest.raises(InvalidBoolError):
        reader.feed(bytes.fromhex(ok))
    with pytest.raises(InvalidBoolError):
        list(reader)


def test_close_inside_a_frame() -> None:
    reader = FrameReader(V3)
    reader.feed(bytes.fromhex("00000005" + "01" + "00000064" + "00000009" + "0800"))
    with pytest.raises(TruncatedStreamError) as info:
        reader.close()
    err = info.value
    assert (err.frame, err.field, err.offset) == ("Frame", None, 9)
    assert (err.received, err.declared) == (6, 13)
    assert str(err) == "v3 Frame at offset 9: stream ended after 6 of the frame's 13 bytes"
    assert reader.next_frame() == Ok(100)  # complete frames stay readable
    with pytest.raises(TruncatedStreamError):
        reader.next_frame()
    reader = FrameReader(DRAFT)
    reader.feed(b"\x05\x00")
    with pytest.raises(TruncatedStreamError) as info:
        reader.close()
    assert (info.value.field, info.value.received, info.value.declared) == ("length", 2, None)
    assert info.value.reason == "stream ended after 2 of a 4-byte length"


def test_decode_of_a_partial_frame() -> None:
    with pytest.raises(TruncatedStreamError, match="after 8 of the frame's 9 bytes"):
        decode(bytes.fromhex("00000005" + "01" + "000000"), V3)
    with pytest.raises(TruncatedStreamError, match="after 3 of a 4-byte length"):
        decode(b"\x00\x00\x00")


@settings(max_examples=50)
@given(st.sampled_from(list(Dialect)), st.data())
def test_every_cut_of_a_frame_is_refused(dialect: Dialect, data: st.DataObject) -> None:
    enc = encode(data.draw(s.frames(dialect)), dialect)
    for cut in range(len(enc)):
        with pytest.raises(TruncatedStreamError):
            decode(enc[:cut], dialect)
        if not cut:
            continue  # an empty stream ends between frames
        reader = FrameReader(dialect)
        reader.feed(enc[:cut])
        assert list(reader) == []
        with pytest.raises(TruncatedStreamError):
            reader.close()


def test_errors_pickle_with_their_fields() -> None:
    errors: list[WallarooError] = [
        FrameTooLargeError("v3", 4, 100, 50),
        TruncatedStreamError("draft", 9, 3, None),
        TruncatedStreamError("v3", 9, 7, 13),
        UnknownTagError("draft", 4, 0x7F),
        InvalidFlagsError("draft", "Message", "flags", 13, "reserved"),
        EncodeError("Nack", None, "v3", "v3 has no NACK"),
    ]
    for err in errors:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err)
        assert str(back) == str(err)
        assert vars(back) == vars(err)


# --- fuzz -------------------------------------------------------------------------------

DOCUMENTED = (
    FrameTooLargeError,
    UnknownTagError,
    TruncatedFrameError,
    TrailingBytesError,
    InvalidBoolError,
    InvalidTextError,
    InvalidFlagsError,
    TruncatedStreamError,
)


@settings(max_examples=300)
@given(
    st.sampled_from(list(Dialect)),
    st.integers(1, 64),
    st.lists(st.binary(max_size=40), max_size=8),
)
def test_random_bytes_raise_only_documented_errors(
    dialect: Dialect, limit: int, chunks: list[bytes]
) -> None:
    reader = FrameReader(dialect, max_frame_bytes=limit)
    try:
        for chunk in chunks:
            reader.feed(chunk)
            for _ in reader:
                pass
            # Bounded: at most one partial frame within the limit.
            assert reader.buffered < LENGTH_PREFIX_BYTES + limit
        reader.close()
    except ProtocolError as err:
        assert type(err) in DOCUMENTED
        assert err.dialect == dialect.value and err.offset >= 0


@settings(max_examples=300)
@given(st.sampled_from(list(Dialect)), st.data())
def test_mutated_frames_raise_only_documented_errors(dialect: Dialect, data: st.DataObject) -> None:
    enc = bytearray(encode(data.draw(s.frames(dialect)), dialect))
    # Keep the length prefix (else most cases are a bad length) and flip body bytes.
    for at in data.draw(st.lists(st.integers(LENGTH_PREFIX_BYTES, len(enc) - 1), max_size=3)):
        enc[at] = data.draw(st.integers(0, 255))
    try:
        frame = decode(enc, dialect)
    except ProtocolError as err:
        assert type(err) in DOCUMENTED
        assert LENGTH_PREFIX_BYTES <= err.offset <= len(enc)
    else:
        assert encode(frame, dialect) == enc  # what decodes, re-encodes to the same bytes
