"""The :class:`FlowConnection` state machine, driven by bytes and calls, state by state."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.flow import (
    PROTOCOL_VERSION,
    ChecksumError,
    ConnectionClosed,
    ConnectionState,
    ConnectPacket,
    ConnectPacketError,
    Event,
    FlowConnection,
    FlowError,
    FlowStateError,
    FrameLengthError,
    FrameReceived,
    PeerConnected,
    Token,
    WellKnown,
    encode_frame_bytes,
)
from tests.test_flow_strategies import connect_packets, frames, peer_packets, splits

FAST = settings(max_examples=150, deadline=None)
PING = Token.well_known(WellKnown.PING)
TOKEN = Token(0x1234_0000_0000_0002, 0x0000_0000_0000_0005)
DIALER = ConnectPacket.current(canonical_port=4500, connection_id=1, canonical_ipv4=0x7F000001)
ACCEPTOR = ConnectPacket.current(canonical_port=4501, connection_id=2, canonical_ipv4=0x7F000001)
# the low 16 bits differ: still compatible
NEAR = ConnectPacket(PROTOCOL_VERSION | 0xBEEF, 4502, 3, 0x7F000001)
OTHER = ConnectPacket(0x1FDB_00B0_7400_0000, 1, 4, 2)  # a different version


def _acceptor_with_peer(peer: ConnectPacket = DIALER) -> tuple[FlowConnection, list[Event]]:
    conn = FlowConnection(ACCEPTOR, dialer=False)
    events = conn.receive_data(peer.encode())
    return conn, events


def _stream(items: list[tuple[Token, bytes]]) -> bytes:
    return b"".join(encode_frame_bytes(t, m) for t, m in items)


def test_handshake_both_ways() -> None:
    dialer = FlowConnection(DIALER, dialer=True)
    acceptor = FlowConnection(ACCEPTOR, dialer=False)
    assert dialer.state is acceptor.state is ConnectionState.AWAIT_PEER
    hello = dialer.connect_packet_bytes()
    assert len(hello) == 44 and dialer.connect_sent
    assert acceptor.receive_data(hello) == [PeerConnected(DIALER, True)]
    assert acceptor.peer == DIALER and acceptor.compatible is True
    reply = acceptor.connect_packet_bytes() + b"".join(acceptor.send(TOKEN, b"hi"))
    assert dialer.receive_data(reply) == [
        PeerConnected(ACCEPTOR, True),
        FrameReceived(TOKEN, b"hi"),
    ]
    assert dialer.state is ConnectionState.COMPATIBLE
    assert acceptor.receive_data(b"".join(dialer.send(TOKEN, memoryview(b"yo")))) == [
        FrameReceived(TOKEN, b"yo")
    ]
    assert dialer.receive_data(b"") == [ConnectionClosed(clean=True)]
    assert dialer.state is ConnectionState.CLOSED


def test_frame_received_message_is_bytes() -> None:
    conn, _ = _acceptor_with_peer()
    big = bytes(100_000)
    (event,) = conn.receive_data(encode_frame_bytes(TOKEN, big))
    assert isinstance(event, FrameReceived) and type(event.message) is bytes
    assert event.message == big


def test_compatible_across_low_16_bits() -> None:
    _, events = _acceptor_with_peer(NEAR)
    assert events == [PeerConnected(NEAR, True)]


@FAST
@given(st.data(), frames, st.one_of(peer_packets(), connect_packets()))
def test_any_chunking_gives_the_same_events(
    data: st.DataObject, items: list[tuple[Token, bytes]], peer: ConnectPacket
) -> None:
    stream = peer.encode() + _stream(items)
    whole = FlowConnection(ACCEPTOR, dialer=False).receive_data(stream)
    conn = FlowConnection(ACCEPTOR, dialer=False)
    events: list[Event] = []
    for chunk in data.draw(splits(stream)):
        events.extend(conn.receive_data(memoryview(chunk)))
    assert events == whole
    ok = peer.version & ~0xFFFF == PROTOCOL_VERSION & ~0xFFFF
    assert events[0] == PeerConnected(peer, ok)
    expected = [FrameReceived(t, m) for t, m in items] if ok else []
    assert events[1:] == expected
    assert conn.ignored_bytes == (0 if ok else len(stream) - len(peer.encode()))
    assert conn.receive_data(b"") == [ConnectionClosed(clean=True if ok else not items)]


def test_one_byte_at_a_time() -> None:
    stream = DIALER.encode() + _stream([(TOKEN, b"a"), (PING, b""), (TOKEN, b"bc" * 50)])
    conn = FlowConnection(ACCEPTOR, dialer=False)
    events: list[Event] = []
    for i in range(len(stream)):
        events.extend(conn.receive_data(stream[i : i + 1]))
    assert events == [
        PeerConnected(DIALER, True),
        FrameReceived(TOKEN, b"a"),
        FrameReceived(PING, b""),
        FrameReceived(TOKEN, b"bc" * 50),
    ]


# --- incompatible peers ---------------------------------------------------------------------


def test_incompatible_peer_is_ignored_but_may_be_pinged() -> None:
    conn, events = _acceptor_with_peer(OTHER)
    assert events == [PeerConnected(OTHER, False)]
    assert conn.state is ConnectionState.INCOMPATIBLE and conn.compatible is False
    garbage = encode_frame_bytes(TOKEN, b"x") + b"\xff" * 10  # not even parsed
    assert conn.receive_data(garbage) == []
    assert conn.ignored_bytes == len(garbage)
    conn.connect_packet_bytes()  # the acceptor keeps the connection open
    with pytest.raises(FlowStateError, match="only pings may be sent"):
        conn.send(TOKEN, b"x")
    with pytest.raises(FlowStateError):
        conn.send(PING.adjusted(1), b"x")
    assert b"".join(conn.send(PING, b"")) == encode_frame_bytes(PING, b"")
    assert conn.receive_data(b"") == [ConnectionClosed(clean=False)]


def test_incompatible_bytes_in_the_same_chunk_as_the_packet_are_ignored() -> None:
    conn = FlowConnection(ACCEPTOR, dialer=False)
    assert conn.receive_data(OTHER.encode() + b"\x00" * 7) == [PeerConnected(OTHER, False)]
    assert conn.ignored_bytes == 7


# --- sending out of turn --------------------------------------------------------------------


def test_send_before_the_peers_packet_raises() -> None:
    conn = FlowConnection(DIALER, dialer=True)
    conn.connect_packet_bytes()
    for token in (TOKEN, PING):
        with pytest.raises(FlowStateError, match="ConnectPacket has not arrived"):
            conn.send(token, b"x")
    conn.receive_data(ACCEPTOR.encode()[:20])
    with pytest.raises(FlowStateError):
        conn.send(TOKEN, b"x")


def test_send_before_our_packet_raises() -> None:
    conn, _ = _acceptor_with_peer()
    with pytest.raises(FlowStateError, match="before our ConnectPacket"):
        conn.send(TOKEN, b"x")


@pytest.mark.parametrize("early", [True, False])
def test_connect_packet_is_sent_once(early: bool) -> None:
    acceptor = FlowConnection(ACCEPTOR, dialer=False)
    if early:  # the acceptor may send it on accept or after the dialer's has arrived
        assert acceptor.connect_packet_bytes() == ACCEPTOR.encode()
    acceptor.receive_data(DIALER.encode())
    if not early:
        assert acceptor.connect_packet_bytes() == ACCEPTOR.encode()
    with pytest.raises(FlowStateError, match="already sent"):
        acceptor.connect_packet_bytes()
    assert acceptor.send(TOKEN, b"x")


def test_no_connect_packet_after_the_connection_ended() -> None:
    conn = FlowConnection(DIALER, dialer=True)
    conn.receive_data(b"")
    with pytest.raises(FlowStateError, match="state CLOSED"):
        conn.connect_packet_bytes()


def test_closed_connection_refuses_everything() -> None:
    conn, _ = _acceptor_with_peer()
    conn.connect_packet_bytes()
    assert conn.receive_data(b"") == [ConnectionClosed(clean=True)]
    with pytest.raises(FlowStateError, match="closed"):
        conn.send(TOKEN, b"x")
    with pytest.raises(FlowStateError, match="after the end of the stream"):
        conn.receive_data(b"x")


def test_send_respects_the_frame_limit() -> None:
    conn = FlowConnection(DIALER, dialer=True, max_frame_length=20)
    conn.connect_packet_bytes()
    conn.receive_data(ACCEPTOR.encode())
    conn.send(TOKEN, b"1234")
    with pytest.raises(FrameLengthError):
        conn.send(TOKEN, b"12345")


# --- end of stream --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prefix", "clean"),
    [
        (b"", True),
        (DIALER.encode()[:10], False),
        (DIALER.encode()[:30], False),
        (DIALER.encode(), True),
        (DIALER.encode() + encode_frame_bytes(TOKEN, b"x"), True),
        (DIALER.encode() + encode_frame_bytes(TOKEN, b"x")[:-1], False),
    ],
)
def test_eof_is_clean_only_at_a_boundary(prefix: bytes, clean: bool) -> None:
    conn = FlowConnection(ACCEPTOR, dialer=False)
    if prefix:
        conn.receive_data(prefix)
    assert conn.receive_data(b"")[-1] == ConnectionClosed(clean)


# --- protocol errors ------------------------------------------------------------------------


def test_bad_connect_packet_fails_the_connection_for_good() -> None:
    conn = FlowConnection(ACCEPTOR, dialer=False)
    bad = (41).to_bytes(4, "little") + DIALER.encode()[4:]
    assert conn.receive_data(bad[:13]) == []  # not sized until 14 bytes are in
    with pytest.raises(ConnectPacketError, match="larger than 40") as info:
        conn.receive_data(bad[13:])
    assert conn.state is ConnectionState.ERROR
    with pytest.raises(ConnectPacketError) as again:
        conn.receive_data(b"more")
    assert again.value is info.value
    with pytest.raises(FlowStateError, match="protocol error"):
        conn.send(TOKEN, b"x")


def test_frame_errors_name_the_stream_offset() -> None:
    conn, _ = _acceptor_with_peer()
    good = encode_frame_bytes(TOKEN, b"ok")
    bad = bytearray(encode_frame_bytes(TOKEN, b"hello"))
    bad[-1] ^= 1
    with pytest.raises(ChecksumError) as info:
        conn.receive_data(good + bytes(bad))
    assert info.value.offset == 44 + len(good)
    conn2, _ = _acceptor_with_peer()
    with pytest.raises(FrameLengthError) as info2:
        conn2.receive_data((3).to_bytes(4, "little"))
    assert info2.value.offset == 44


@FAST
@given(st.binary(max_size=120), st.data())
def test_random_input_raises_only_flow_errors(blob: bytes, data: st.DataObject) -> None:
    conn = FlowConnection(ACCEPTOR, dialer=False, max_frame_length=4096)
    stream = DIALER.encode() + blob if data.draw(st.booleans()) else blob
    try:
        for chunk in data.draw(splits(stream)):
            conn.receive_data(chunk)
        conn.receive_data(b"")
    except FlowError as exc:
        assert conn.state is ConnectionState.ERROR
        with pytest.raises(type(exc)):
            conn.receive_data(b"x")
