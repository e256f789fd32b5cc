"""The one varint implementation (``wire/varint.py``): unsigned LEB128 as the protobuf and
LEB128 specifications define it, its bound ``end``, and the zig-zag decoders' short paths
against an independent decoder written here from the definition."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.wire.errors import TruncatedInputError, VarintTooLongError
from ambrosia_py.wire.varint import (
    decode_uvarint,
    decode_zigzag_int,
    decode_zigzag_long,
    encode_uvarint,
    encode_zigzag_int,
    uvarint_size,
)

# Vectors from the protobuf encoding guide (150 is "96 01", 300 is "ac 02") and the
# LEB128 definition (7 bits a byte, low bits first, the high bit set on all but the last).
_VECTORS = [
    (0, "00"),
    (1, "01"),
    (127, "7f"),
    (128, "8001"),
    (150, "9601"),
    (300, "ac02"),
    (16383, "ff7f"),
    (16384, "808001"),
    (2**32 - 1, "ffffffff0f"),
    (2**63, "80808080808080808001"),
    (2**64 - 1, "ffffffffffffffffff01"),
]


@pytest.mark.parametrize(("value", "hex_"), _VECTORS)
def test_unsigned_vectors(value: int, hex_: str) -> None:
    raw = bytes.fromhex(hex_)
    assert encode_uvarint(value) == raw
    assert uvarint_size(value) == len(raw)
    assert decode_uvarint(raw + b"\xff", 0) == (value, len(raw))


def _leb128(raw: bytes, pos: int, end: int, max_bytes: int) -> tuple[int, int] | str:
    """An unsigned varint decoded from the definition: each byte's low 7 bits at 7 times
    its index, up to the first byte below 0x80; "truncated" or "long" otherwise."""
    for i in range(max_bytes):
        if pos + i >= end:
            return "truncated"
        if raw[pos + i] < 0x80:
            groups = raw[pos : pos + i + 1]
            return sum((b & 0x7F) << (7 * k) for k, b in enumerate(groups)), pos + i + 1
    return "long"


def _outcome(f: object, *args: object) -> tuple[int, int] | str:
    try:
        return f(*args)  # type: ignore[operator, no-any-return]
    except TruncatedInputError:
        return "truncated"
    except VarintTooLongError:
        return "long"


def _random_varints(rng: random.Random) -> bytes:
    """Runs of varint-like bytes: continuation bytes, final bytes, zero padding."""
    pick = rng.random()
    if pick < 0.3:
        return encode_uvarint(rng.getrandbits(rng.choice([7, 14, 21, 35, 64])))
    if pick < 0.5:
        return bytes(rng.choice([0x80, 0xFF, 0x81]) for _ in range(rng.randrange(12))) + bytes(
            [rng.randrange(0x80)]
        )
    return bytes(rng.randrange(256) for _ in range(rng.randrange(12)))


def test_decoding_matches_the_definition_on_random_and_malformed_bytes() -> None:
    rng = random.Random(20240521)
    for _ in range(5000):
        raw = b"".join(_random_varints(rng) for _ in range(rng.randrange(1, 4)))
        pos = rng.randrange(len(raw) + 1)
        end = rng.randrange(pos, len(raw) + 3)  # past the buffer, too: bounded by it
        for max_bytes in (5, 10):
            want = _leb128(raw, pos, min(end, len(raw)), max_bytes)
            assert _outcome(decode_uvarint, raw, pos, end, max_bytes) == want, (raw, pos, end)
        # The zig-zag decoders: the same bytes, mapped, and bounded to 32 or 64 bits.
        n32 = _leb128(raw, pos, min(end, len(raw)), 5)
        if isinstance(n32, tuple) and n32[0] > 0xFFFFFFFF:
            n32 = "long"
        want32 = n32 if isinstance(n32, str) else ((n32[0] >> 1) ^ -(n32[0] & 1), n32[1])
        assert _outcome(decode_zigzag_int, raw, pos, end) == want32, (raw, pos, end)
        n64 = _leb128(raw, pos, min(end, len(raw)), 10)
        if isinstance(n64, tuple) and n64[0] > 2**64 - 1:
            n64 = "long"
        want64 = n64 if isinstance(n64, str) else ((n64[0] >> 1) ^ -(n64[0] & 1), n64[1])
        assert _outcome(decode_zigzag_long, raw, pos, end) == want64, (raw, pos, end)


@pytest.mark.parametrize("decode", [decode_zigzag_int, decode_zigzag_long, decode_uvarint])
def test_end_bounds_the_varint(decode: object) -> None:
    raw = b"\x96\x01\x05"  # 150 (zig-zag 75), then 5
    assert _outcome(decode, raw, 0, 1) == "truncated"  # its second byte is past the end
    assert _outcome(decode, raw, 0, 2)[1] == 2  # type: ignore[index]
    assert _outcome(decode, raw, 2, 2) == "truncated"  # nothing before the end
    assert _outcome(decode, raw, 2, 99) == _outcome(decode, raw, 2)  # past the buffer


def test_errors_say_where_the_varint_starts() -> None:
    with pytest.raises(TruncatedInputError, match="ZigZagInt truncated") as info:
        decode_zigzag_int(b"\x00\x80\x80", 1)
    assert info.value.offset == 1
    with pytest.raises(VarintTooLongError, match="longer than 3 bytes") as long:
        decode_uvarint(b"\x01\x80\x80\x80\x01", 1, None, 3)
    assert long.value.offset == 1


def test_non_minimal_encodings_are_read() -> None:
    # AMBROSIA accepts them (BARE's codec refuses them on top: immortals/ockam/bare.py).
    assert decode_zigzag_int(b"\x80\x00") == (0, 2)
    assert decode_zigzag_int(b"\x82\x80\x00") == (1, 3)
    assert decode_uvarint(b"\xff\x80\x00") == (127, 3)


def test_negative_values_have_no_unsigned_form() -> None:
    with pytest.raises(OverflowError):
        encode_uvarint(-1)


@given(st.integers(0, 2**70))
def test_unsigned_round_trip(value: int) -> None:
    raw = encode_uvarint(value)
    assert len(raw) == uvarint_size(value) == max(1, -(-value.bit_length() // 7))
    assert all(b >= 0x80 for b in raw[:-1]) and raw[-1] < 0x80
    assert decode_uvarint(raw, 0, None, len(raw)) == (value, len(raw))


@given(st.integers(-(2**31), 2**31 - 1))
def test_zigzag_int_is_the_unsigned_varint_of_its_mapping(value: int) -> None:
    mapped = 2 * value if value >= 0 else -2 * value - 1  # 0, -1, 1, -2 ... to 0, 1, 2, 3 ...
    assert encode_zigzag_int(value) == encode_uvarint(mapped)
