"""ConnectPacket: round trips, the legacy short form, and every way to get it wrong."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.flow import (
    CONNECT_PACKET_LENGTH,
    LEGACY_CONNECT_PACKET_LENGTH,
    MIN_FULL_CONNECT_PACKET_VERSION,
    PROTOCOL_VERSION,
    VERSION_FLAGS_MASK,
    WIRE_PROTOCOL_VERSION,
    ConnectPacket,
    ConnectPacketError,
    FlowError,
    connect_packet_size,
)
from tests.test_flow_strategies import connect_packets

FAST = settings(max_examples=200, deadline=None)
OURS = ConnectPacket.current(canonical_port=4500, connection_id=99, canonical_ipv4=0x7F000001)
LEGACY_VERSION = 0x0FDB_00B0_6000_0000


@FAST
@given(connect_packets())
def test_round_trip(packet: ConnectPacket) -> None:
    data = packet.encode()
    full = packet.version >= MIN_FULL_CONNECT_PACKET_VERSION
    assert len(data) == (44 if full else 26)
    assert struct.unpack_from("<I", data)[0] == (40 if full else 22)
    assert connect_packet_size(data[:14]) == len(data)
    assert ConnectPacket.decode(data) == packet
    assert ConnectPacket.decode(memoryview(bytearray(data))) == packet
    assert packet.version == packet.protocol_version & ~VERSION_FLAGS_MASK


def test_current_packet() -> None:
    assert OURS.protocol_version == WIRE_PROTOCOL_VERSION
    assert OURS.version == PROTOCOL_VERSION
    assert len(OURS.encode()) == 44
    assert OURS.encode()[:4] == bytes.fromhex("28000000")


def test_flags_count_in_the_version_boundary_only_when_masked() -> None:
    # a legacy version with flag bits set is still legacy
    packet = ConnectPacket(LEGACY_VERSION | 0x1000_0000_0000_0000, 1, 2, 3)
    assert len(packet.encode()) == 26
    boundary = ConnectPacket(MIN_FULL_CONNECT_PACKET_VERSION, 1, 2, 3)
    assert len(boundary.encode()) == 44
    older = ConnectPacket(MIN_FULL_CONNECT_PACKET_VERSION - 1, 1, 2, 3)
    assert len(older.encode()) == 26


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("protocol_version", 2**64),
        ("canonical_port", 2**16),
        ("connection_id", -1),
        ("canonical_ipv4", 2**32),
        ("flags", 2**16),
    ],
)
def test_field_ranges_are_validated(field: str, value: int) -> None:
    kwargs: dict[str, Any] = {
        "protocol_version": WIRE_PROTOCOL_VERSION,
        "canonical_port": 1,
        "connection_id": 1,
        "canonical_ipv4": 1,
        field: value,
    }
    with pytest.raises(ValueError, match=field):
        ConnectPacket(**kwargs)


def test_ipv6_must_be_16_bytes() -> None:
    with pytest.raises(ValueError, match="16 bytes"):
        ConnectPacket(WIRE_PROTOCOL_VERSION, 1, 1, 1, ipv6=bytes(15))


def test_a_legacy_packet_holds_no_flags_or_ipv6() -> None:
    with pytest.raises(ValueError, match="predates"):
        ConnectPacket(LEGACY_VERSION, 1, 1, 1, flags=1)
    with pytest.raises(ValueError, match="predates"):
        ConnectPacket(LEGACY_VERSION, 1, 1, 1, ipv6=b"\x01" * 16)


# --- malformed ------------------------------------------------------------------------------


def _with_length(data: bytes, length: int) -> bytes:
    return struct.pack("<I", length) + data[4:]


@pytest.mark.parametrize("length", [41, 44, 2**32 - 1])
def test_length_larger_than_40(length: int) -> None:
    data = _with_length(OURS.encode(), length)
    with pytest.raises(ConnectPacketError, match=f"length {length} is larger than 40") as info:
        ConnectPacket.decode(data)
    assert info.value.offset == 0
    with pytest.raises(ConnectPacketError, match="larger than 40"):
        connect_packet_size(data[:14])
    with pytest.raises(ConnectPacketError, match="larger than 40"):
        ConnectPacket.decode(data[:6])  # named even before the version is in


@pytest.mark.parametrize("length", [0, 10, 22, 39])
def test_full_version_needs_length_40(length: int) -> None:
    data = _with_length(OURS.encode(), length)
    with pytest.raises(ConnectPacketError, match=f"length {length} disagrees .* needs 40"):
        ConnectPacket.decode(data)


@pytest.mark.parametrize("length", [21, 23, 40])
def test_legacy_version_needs_length_22(length: int) -> None:
    legacy = ConnectPacket(LEGACY_VERSION, 1, 2, 3).encode()
    with pytest.raises(ConnectPacketError, match="needs 22"):
        ConnectPacket.decode(_with_length(legacy + bytes(18), length))


def test_truncated_and_trailing() -> None:
    data = OURS.encode()
    for cut in range(len(data)):
        with pytest.raises(ConnectPacketError):
            ConnectPacket.decode(data[:cut])
    with pytest.raises(ConnectPacketError, match="truncated: 43 bytes"):
        ConnectPacket.decode(data[:-1])
    with pytest.raises(ConnectPacketError, match="followed by extra bytes: 45 bytes"):
        ConnectPacket.decode(data + b"\x00")
    with pytest.raises(ConnectPacketError, match="needs 14 bytes to be sized, 13 present"):
        ConnectPacket.decode(data[:13])


def test_sizes() -> None:
    assert CONNECT_PACKET_LENGTH + 4 == 44
    assert LEGACY_CONNECT_PACKET_LENGTH + 4 == 26


@FAST
@given(st.binary(max_size=60))
def test_random_bytes_raise_only_connect_packet_errors(blob: bytes) -> None:
    try:
        packet = ConnectPacket.decode(blob)
    except ConnectPacketError as exc:
        assert exc.offset == 0
        return
    except FlowError:  # pragma: no cover - the wrong subclass
        pytest.fail("not a ConnectPacketError")
    assert packet.encode() == blob
