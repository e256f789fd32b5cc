"""The byte facts of ``shared/reference/flow-transport.md``, checked against hand-built bytes.

Expected byte strings are written out from the layout with ``bytes.fromhex``, never with
the code under test.
"""

from __future__ import annotations

import ipaddress

import pytest
import xxhash

from ambrosia_py.flow import (
    CONNECT_PACKET_LENGTH,
    FLAG_IPV6,
    MIN_FRAME_LENGTH,
    MIN_FULL_CONNECT_PACKET_VERSION,
    OBJECT_SERIALIZER_FLAG,
    PACKET_LIMIT,
    PROTOCOL_VERSION,
    TOKEN_STREAM_FLAG,
    VERSION_FLAGS_MASK,
    WIRE_PROTOCOL_VERSION,
    ChecksumError,
    ConnectionState,
    ConnectPacket,
    ConnectPacketError,
    FlowConnection,
    FlowStateError,
    FrameLengthError,
    FrameReader,
    FrameReceived,
    PeerConnected,
    Token,
    WellKnown,
    compatible,
    connect_packet_size,
    encode_frame,
    encode_frame_bytes,
    frame_checksum,
)

LOCALHOST = int(ipaddress.IPv4Address("127.0.0.1"))


def test_constants() -> None:
    assert PACKET_LIMIT == 100 * 1024 * 1024
    assert CONNECT_PACKET_LENGTH == 40
    assert MIN_FRAME_LENGTH == 16
    assert TOKEN_STREAM_FLAG == 1
    assert OBJECT_SERIALIZER_FLAG == 0x1000_0000_0000_0000
    assert VERSION_FLAGS_MASK == 0xF000_0000_0000_0000
    assert FLAG_IPV6 == 1
    assert MIN_FULL_CONNECT_PACKET_VERSION == 0x0FDB_00B0_6103_0000
    assert PROTOCOL_VERSION == 0x0FDB_00B0_7300_0000
    assert WIRE_PROTOCOL_VERSION == 0x1FDB_00B0_7300_0000
    assert [int(w) for w in WellKnown] == [0, 1, 2, 10]


def test_xxh3_sanity_values() -> None:
    assert xxhash.xxh3_64_intdigest(b"") == 0x2D06800538D394C2
    assert xxhash.xxh3_64_intdigest(b"hello") == 0x9555E8555C62DCFD
    assert frame_checksum(b"", b"") == 0x2D06800538D394C2
    assert frame_checksum(b"he", b"llo") == 0x9555E8555C62DCFD


def test_ipv4_is_little_endian() -> None:
    packet = ConnectPacket.current(canonical_port=0, connection_id=0, canonical_ipv4=LOCALHOST)
    assert LOCALHOST == 0x7F000001
    assert packet.encode()[22:26] == bytes.fromhex("0100007f")  # after 4 + 8 + 2 + 8


OURS = ConnectPacket.current(canonical_port=1, connection_id=2, canonical_ipv4=LOCALHOST)
CONNECT_BYTES = bytes.fromhex(
    "28000000"  # length 40
    "00000073b000db1f"  # protocol version 0x1FDB00B073000000
    "9411"  # port 4500
    "0807060504030201"  # connection id 0x0102030405060708
    "0100007f"  # IPv4 127.0.0.1
    "0100"  # flags: FLAG_IPV6
    "20010db8000000000000000000000001"  # IPv6 2001:db8::1
)


def test_connect_packet_vector() -> None:
    packet = ConnectPacket(
        protocol_version=0x1FDB_00B0_7300_0000,
        canonical_port=4500,
        connection_id=0x0102_0304_0506_0708,
        canonical_ipv4=LOCALHOST,
        flags=FLAG_IPV6,
        ipv6=ipaddress.IPv6Address("2001:db8::1").packed,
    )
    assert len(CONNECT_BYTES) == 44
    assert packet.encode() == CONNECT_BYTES
    assert ConnectPacket.decode(CONNECT_BYTES) == packet
    assert packet.version == 0x0FDB_00B0_7300_0000


def test_a_connect_packet_longer_than_known_is_refused_from_its_first_14_bytes() -> None:
    """Reference, *ConnectPacket*: wait for 14 bytes, read the length; one larger than
    known (40) is a protocol error."""
    prefix = bytes.fromhex("29000000 00000073b000db1f 9411")  # length 41
    with pytest.raises(ConnectPacketError) as info:
        connect_packet_size(prefix)
    assert info.value.offset == 0
    assert connect_packet_size(CONNECT_BYTES[:14]) == 44
    conn = FlowConnection(OURS, dialer=False)
    with pytest.raises(ConnectPacketError):
        conn.receive_data(prefix)


def test_an_incompatible_peers_bytes_are_ignored_and_it_is_sent_only_pings() -> None:
    """Seed 004, *Protocol compatibility*: nothing sent after an incompatible peer's
    ConnectPacket is looked at, and the connection stays open; the reference lets us
    ping it. The peer is at version 0x0FDB00B074000000 (flag bit 60 set), we at
    0x0FDB00B073000000: more than the low 16 bits differ."""
    other = bytes.fromhex(
        "28000000 00000074b000db1f 9411 0807060504030201 0100007f 0000" + "00" * 16
    )
    conn = FlowConnection(OURS, dialer=False)
    ((connected,),) = [conn.receive_data(other)]
    assert isinstance(connected, PeerConnected) and connected.compatible is False
    assert connected.packet.version == 0x0FDB_00B0_7400_0000
    assert conn.receive_data(FRAME_BYTES + b"\xff" * 5) == []  # a valid frame, not parsed
    assert conn.state is ConnectionState.INCOMPATIBLE
    assert conn.ignored_bytes == len(FRAME_BYTES) + 5
    conn.connect_packet_bytes()  # kept open: the acceptor answers with its own
    with pytest.raises(FlowStateError):
        conn.send(TOKEN, b"hello")
    ping = bytes.fromhex("ffffffffffffffff 0100000000000000")
    expected = bytes.fromhex("10000000") + xxhash.xxh3_64_intdigest(ping).to_bytes(8, "little")
    assert b"".join(conn.send(Token.well_known(WellKnown.PING), b"")) == expected + ping
    same = FlowConnection(OURS, dialer=False)
    same.receive_data(CONNECT_BYTES)  # our version, other flags: compatible
    assert same.receive_data(FRAME_BYTES) == [FrameReceived(TOKEN, b"hello")]


def test_legacy_connect_packet_vector() -> None:
    legacy = bytes.fromhex(
        "16000000"  # length 22
        "0000000060000000"  # protocol version 0x0000006000000000 (before 6.3)
        "9411"
        "0807060504030201"
        "0100007f"
    )
    packet = ConnectPacket.decode(legacy)
    assert packet == ConnectPacket(0x60_0000_0000, 4500, 0x0102_0304_0506_0708, LOCALHOST)
    assert packet.flags == 0 and packet.ipv6 == bytes(16)
    assert packet.encode() == legacy


TOKEN = Token(0x0123_4567_89AB_CDEF, 0x0000_0002_0000_0001)
FRAME_BYTES = bytes.fromhex(
    "15000000"  # length 21 = 16 + 5
    "b54dc0170d7d8a7e"  # XXH3-64 of token + message, little-endian
    "efcdab8967452301"  # token first
    "0100000002000000"  # token second
    "68656c6c6f"  # b"hello"
)


def test_frame_vector() -> None:
    checked = FRAME_BYTES[12:]
    assert xxhash.xxh3_64_intdigest(checked) == 0x7E8A_7D0D_17C0_4DB5
    assert TOKEN.encode() == FRAME_BYTES[12:28]
    assert encode_frame_bytes(TOKEN, b"hello") == FRAME_BYTES
    parts = encode_frame(TOKEN, b"hello")
    assert parts[0] == FRAME_BYTES[:28]
    (frame,) = FrameReader().frames(FRAME_BYTES)
    assert frame.token == TOKEN and bytes(frame.message) == b"hello"


def test_tls_frame_vector() -> None:
    """Over TLS (seed 004, *Framing*): u32 length | token | message, no checksum."""
    tls = FRAME_BYTES[:4] + FRAME_BYTES[12:]
    assert tls == bytes.fromhex("15000000 efcdab8967452301 0100000002000000 68656c6c6f")
    assert encode_frame_bytes(TOKEN, b"hello", checksum=False) == tls
    (frame,) = FrameReader(checksum=False).frames(tls)
    assert frame.token == TOKEN and bytes(frame.message) == b"hello"


def test_frames_too_short_too_long_or_with_a_bad_checksum_are_refused() -> None:
    """A length under 16 or over 100 MiB is refused from the length alone; a flipped byte
    fails the XXH3 checksum (reference, *Frames*: each closes the connection)."""
    with pytest.raises(FrameLengthError) as info:
        FrameReader().frames(bytes.fromhex("0f000000"))
    assert info.value.offset == 0
    with pytest.raises(FrameLengthError):
        FrameReader().frames(bytes.fromhex("01004006"))  # 0x06400001 = 100 MiB + 1
    assert (100 << 20) + 1 == 0x0640_0001
    with pytest.raises(ChecksumError):
        FrameReader().frames(FRAME_BYTES[:-1] + b"O")


def test_empty_message_frame_vector() -> None:
    expected = (
        bytes.fromhex("10000000")
        + xxhash.xxh3_64_intdigest(TOKEN.encode()).to_bytes(8, "little")
        + TOKEN.encode()
    )
    assert encode_frame_bytes(TOKEN, b"") == expected


def test_encode_frame_does_not_copy_the_message() -> None:
    message = b"x" * 1000
    parts = encode_frame(TOKEN, message)
    assert len(parts) == 2 and len(parts[0]) == 28
    assert parts[1] is message
    view = memoryview(bytearray(b"abc"))
    assert encode_frame(TOKEN, view)[1] is view


# --- tokens ---------------------------------------------------------------------------------


def test_token_layout() -> None:
    assert Token(1, 2).encode() == bytes.fromhex("01000000000000000200000000000000")
    assert Token.decode(bytes.fromhex("0001000000000000000200000000000000"), 1) == Token(1, 2)


@pytest.mark.parametrize(
    ("token", "i", "expected"),
    [
        (Token(0, 0), 0, Token(0, 0)),
        (Token(0x10, 0x5), 3, Token(0x3_0000_0010, 0x8)),
        (Token(1, 0xAAAA_AAAA_0000_0007), 1, Token(0x1_0000_0001, 0xAAAA_AAAA_0000_0008)),
        # first wraps mod 2**64
        (Token(0xFFFF_FFFF_0000_0001, 0), 1, Token(0x0000_0000_0000_0001, 1)),
        # the low 32 bits of second wrap mod 2**32; the high 32 bits are untouched
        (Token(0, 0x1234_5678_FFFF_FFFF), 1, Token(0x1_0000_0000, 0x1234_5678_0000_0000)),
        # both wrap at once
        (
            Token(0xFFFF_FFFF_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFE),
            0xFFFF_FFFF,
            Token(0xFFFF_FFFE_FFFF_FFFF, 0xFFFF_FFFF_FFFF_FFFD),
        ),
    ],
)
def test_token_adjusted(token: Token, i: int, expected: Token) -> None:
    assert token.adjusted(i) == expected
    assert token.adjusted(i).is_stream == token.is_stream


def test_token_properties() -> None:
    token = Token(0xDEAD_BEEF_0000_0001, 0xCAFE_0000_0000_002A)
    assert token.is_stream
    assert not Token(2, 0).is_stream
    assert token.endpoint_index == 42


def test_well_known_tokens() -> None:
    assert Token.well_known(WellKnown.PING) == Token(0xFFFF_FFFF_FFFF_FFFF, 1)
    assert Token.well_known(WellKnown.ENDPOINT_NOT_FOUND).second == 0
    assert Token.well_known(WellKnown.UNAUTHORIZED).endpoint_index == 2
    assert Token.well_known(WellKnown.PROTOCOL_INFO).encode() == bytes.fromhex(
        "ffffffffffffffff0a00000000000000"
    )
    assert type(Token.well_known(WellKnown.PING).second) is int


@pytest.mark.parametrize("bad", [-1, 2**64])
def test_token_range_is_validated(bad: int) -> None:
    with pytest.raises(ValueError, match="u64"):
        Token(bad, 0)
    with pytest.raises(ValueError, match="u64"):
        Token(0, bad)


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_token_index_and_adjustment_are_u32(bad: int) -> None:
    with pytest.raises(ValueError):
        Token.well_known(bad)
    with pytest.raises(ValueError):
        Token(0, 0).adjusted(bad)


# --- compatibility ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "ok"),
    [
        (PROTOCOL_VERSION, PROTOCOL_VERSION, True),
        # flags are masked off
        (WIRE_PROTOCOL_VERSION, PROTOCOL_VERSION, True),
        (0xF000_0000_0000_0000 | PROTOCOL_VERSION, PROTOCOL_VERSION, True),
        # the low 16 bits may differ
        (0x0FDB_00B0_7300_0000, 0x0FDB_00B0_7300_FFFF, True),
        (0x1FDB_00B0_7300_0001, 0x0FDB_00B0_7300_1234, True),
        # anything above them may not
        (0x0FDB_00B0_7300_0000, 0x0FDB_00B0_7301_0000, False),
        (0x0FDB_00B0_7300_0000, 0x0FDB_00B0_7200_0000, False),
        (0x0FDB_00B0_7300_0000, 0x0EDB_00B0_7300_0000, False),
        (0x0FDB_00B0_7300_0000, 0x0FDB_00B0_6103_0000, False),
    ],
)
def test_compatible(a: int, b: int, ok: bool) -> None:
    assert compatible(a, b) is ok
    assert compatible(b, a) is ok
