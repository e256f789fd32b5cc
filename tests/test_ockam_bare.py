"""The BARE primitives: the reference's uint vectors, round trips, and every rejection
the strict :class:`Reader` makes, each naming ``Struct.field`` and the offset."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from immortals.ockam import DecodeError, bare
from immortals.ockam.bare import MAX_UINT, Reader
from tests import strategies_ockam as s

# Reference, *BARE primitives*: 0 -> 00, 127 -> 7f, 128 -> 80 01, 300 -> ac 02.
UINT_VECTORS = [
    (0, "00"),
    (127, "7f"),
    (128, "8001"),
    (300, "ac02"),
    (16383, "ff7f"),
    (16384, "808001"),
    (MAX_UINT, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hex_"), UINT_VECTORS)
def test_uint_vectors(value: int, hex_: str) -> None:
    assert bare.uint(value).hex() == hex_
    r = Reader(bytes.fromhex(hex_), "T")
    assert r.uint("f") == value
    r.end()
    assert bare.uint_size(value) == len(bytes.fromhex(hex_))


@pytest.mark.parametrize(("value", "hex_"), [(0, "00"), (-1, "01"), (1, "02"), (-2, "03")])
def test_int_zigzag_vectors(value: int, hex_: str) -> None:
    assert bare.int_(value).hex() == hex_
    assert Reader(bytes.fromhex(hex_), "T").int_("f") == value


@given(s.uints)
def test_uint_round_trip(n: int) -> None:
    enc = bare.uint(n)
    assert len(enc) == bare.uint_size(n)
    r = Reader(enc, "T")
    assert r.uint("f") == n
    r.end()


@given(s.ints64)
def test_int_round_trip(n: int) -> None:
    r = Reader(bare.int_(n), "T")
    assert r.int_("f") == n
    r.end()


@given(st.text(), st.binary(), st.none() | st.text(), st.lists(s.uints))
def test_composite_round_trip(text: str, blob: bytes, opt: str | None, items: list[int]) -> None:
    enc = bare.string(text) + bare.data(blob) + bare.optional(opt, bare.string)
    enc += bare.list_(items, bare.uint) + bare.u8(7)
    assert bare.string_size(text) == len(bare.string(text))
    r = Reader(memoryview(enc), "T")
    assert r.string("a") == text
    assert r.data("b") == blob
    assert r.optional("c", Reader.string) == opt
    assert r.list_("d", Reader.uint) == tuple(items)
    assert r.u8("e") == 7
    r.end()


@pytest.mark.parametrize("bad", [-1, MAX_UINT + 1, 2**70])
def test_uint_encoder_refuses_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError):
        bare.uint(bad)


@pytest.mark.parametrize("bad", [-(2**63) - 1, 2**63])
def test_int_encoder_refuses_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError):
        bare.int_(bad)


@pytest.mark.parametrize("bad", [-1, 256])
def test_u8_encoder_refuses_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError):
        bare.u8(bad)


def _fails(hex_: str, read: str, *args: object) -> DecodeError:
    r = Reader(bytes.fromhex(hex_), "S")
    with pytest.raises(DecodeError) as info:
        getattr(r, read)("f", *args)
    assert info.value.what == "S.f"
    return info.value


@pytest.mark.parametrize(
    ("hex_", "reason"),
    [
        ("", "truncated: varint ends with no bytes left"),
        ("80", "truncated: varint ends after 1 byte"),
        ("ffff", "truncated: varint ends after 2 bytes"),
        ("8000", "non-minimal varint (2 bytes)"),
        ("ff00", "non-minimal varint (2 bytes)"),
        ("80808000", "non-minimal varint (4 bytes)"),
        ("ffffffffffffffffff02", "varint value does not fit in 64 bits"),
        ("ffffffffffffffffff7f", "varint value does not fit in 64 bits"),
        ("ffffffffffffffffff00", "non-minimal varint (10 bytes)"),
        ("ffffffffffffffffff8001", "varint longer than 10 bytes"),
        ("8080808080808080808001", "varint longer than 10 bytes"),
    ],
)
def test_malformed_varints(hex_: str, reason: str) -> None:
    err = _fails(hex_, "uint")
    assert (err.offset, err.reason) == (0, reason)
    assert str(err) == f"S.f at offset 0: {reason}"


def test_error_reads_like_the_example() -> None:
    r = Reader(bytes.fromhex("01c801") + b"hello", "PushRequest")
    assert r.uint("request_id") == 1
    with pytest.raises(DecodeError) as info:
        r.data("data")
    assert str(info.value) == "PushRequest.data at offset 1: length 200 past the end (5 bytes left)"


def test_errors_pickle_with_their_fields() -> None:
    err = _fails("05aa", "string")
    back = pickle.loads(pickle.dumps(err))
    assert (back.what, back.offset, back.reason, str(back)) == (
        err.what,
        err.offset,
        err.reason,
        str(err),
    )


@pytest.mark.parametrize("read", ["string", "data"])
def test_length_past_the_end(read: str) -> None:
    err = _fails("0461", read)
    assert err.reason == "length 4 past the end (1 bytes left)"


@pytest.mark.parametrize(("hex_", "at"), [("02c328", 1), ("04616263ff", 4)])
def test_invalid_utf8(hex_: str, at: int) -> None:
    err = _fails(hex_, "string")
    assert err.offset == 0
    assert f"invalid UTF-8 at byte {at}" in err.reason


def test_lone_surrogate_bytes_are_invalid_utf8() -> None:
    _fails("03eda080", "string")  # U+D800 encoded as if it were a character


@pytest.mark.parametrize("flag", ["02", "ff"])
def test_bad_optional_flag(flag: str) -> None:
    err = _fails(flag + "00", "optional", Reader.uint)
    assert err.reason == f"optional flag 0x{flag}, expected 0 or 1"


def test_optional_flag_truncated() -> None:
    assert "truncated" in _fails("", "optional", Reader.uint).reason


def test_enum_out_of_range() -> None:
    assert _fails("02", "enum", 2).reason == "enum value 2 out of range 0..1"
    assert Reader(b"\x01", "S").enum("f", 2) == 1


def test_union_tag_unknown() -> None:
    assert _fails("02", "union_tag", {0, 1}).reason == "unknown union tag 2 (expected 0, 1)"
    assert Reader(b"\x01", "S").union_tag("f", {0, 1}) == 1


def test_list_count_larger_than_the_bytes_left_is_refused_up_front() -> None:
    # A count of 2**63 must not allocate anything.
    err = _fails(bare.uint(2**63).hex() + "00", "list_", Reader.uint)
    assert err.reason.startswith(f"count {2**63} exceeds the 1 bytes left")


def test_list_items_are_named_by_index() -> None:
    r = Reader(bytes.fromhex("02" + "05" + "80"), "S")
    with pytest.raises(DecodeError) as info:
        r.list_("items", Reader.uint)
    assert (info.value.what, info.value.offset) == ("S.items[1]", 2)


def test_trailing_bytes() -> None:
    r = Reader(b"\x01\x02\x03", "S")
    r.uint("f")
    with pytest.raises(DecodeError) as info:
        r.end()
    assert str(info.value) == "S at offset 1: 2 trailing bytes"


def test_u8_truncated() -> None:
    assert _fails("", "u8").reason == "truncated: expected 1 byte, none left"


def test_sub_reader_counts_offsets_in_the_outer_buffer() -> None:
    r = Reader(bytes.fromhex("aa" + "03" + "0180ff"), "Outer", start=1)
    assert r.pos == 1
    inner = r.sub("data", "Inner")
    r.end()
    assert inner.uint("a") == 1
    assert inner.remaining == 2
    with pytest.raises(DecodeError) as info:
        inner.uint("b")
    assert (info.value.what, info.value.offset) == ("Inner.b", 3)
    assert "truncated" in info.value.reason


def test_sub_reader_stops_at_its_end() -> None:
    r = Reader(bytes.fromhex("0101" + "05"), "Outer")
    inner = r.sub("data", "Inner")
    inner.uint("a")
    with pytest.raises(DecodeError):
        inner.uint("b")  # the byte after the data field is not the inner reader's


def test_reader_bounds_are_checked() -> None:
    with pytest.raises(ValueError):
        Reader(b"ab", "S", start=3)
    with pytest.raises(ValueError):
        Reader(b"ab", "S", start=2, end=1)


def test_reader_accepts_non_byte_memoryviews() -> None:
    view = memoryview(bytes.fromhex("ac02" + "0000")).cast("H")
    r = Reader(view, "S")
    assert r.uint("f") == 300
    assert r.remaining == 2


@given(st.binary(max_size=40))
def test_random_bytes_only_ever_raise_decode_error(buf: bytes) -> None:
    r = Reader(buf, "S")
    try:
        r.uint("a")
        r.int_("b")
        r.string("c")
        r.data("d")
        r.optional("e", Reader.string)
        r.list_("f", Reader.data)
        r.enum("g", 3)
        r.union_tag("h", (0, 4))
        r.u8("i")
        r.end()
    except DecodeError as err:
        assert 0 <= err.offset <= len(buf)
        assert err.what.startswith("S")
