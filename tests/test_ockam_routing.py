"""Ockam routing messages and the TCP transport's u16 framing: a hand-written vector,
round trips, strict decoding, the routing steps, the frame limit and the frame reader
under arbitrary chunking."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from immortals.ockam import (
    MAX_FRAME,
    Address,
    AddressType,
    DecodeError,
    FrameReader,
    FrameTooLargeError,
    OckamError,
    TransportMessage,
    decode_message,
    encode_message,
    forward_via,
    frame,
    hop,
    max_payload_size,
    reply_to,
)
from tests import strategies_ockam as s

SERVICE = Address.local("stream_service")
PEER = Address.tcp("127.0.0.1", 4000)

# version 1 | onward [local "stream_service"] | return [tcp "127.0.0.1:4000"] | data "hi"
VECTOR = (
    "01"
    + "01" + "00" + "0e" + "73747265616d5f73657276696365"
    + "01" + "01" + "0e" + "3132372e302e302e313a34303030"
    + "02" + "6869"
)  # fmt: skip


def test_vector() -> None:
    msg = TransportMessage(1, (SERVICE,), (PEER,), b"hi")
    assert encode_message(msg).hex() == VECTOR
    assert decode_message(bytes.fromhex(VECTOR)) == msg


def test_empty_routes() -> None:
    assert encode_message(TransportMessage(1, (), (), b"")) == bytes.fromhex("01000000")


def test_addresses() -> None:
    assert Address(AddressType.LOCAL, b"stream_service") == SERVICE
    assert PEER.value == b"127.0.0.1:4000"
    assert PEER.text == "127.0.0.1:4000"
    assert Address.tcp("::1", 80).text == "[::1]:80"
    assert str(PEER) == "TCP:127.0.0.1:4000"
    assert str(Address(7, b"\xff")) == "7:\\xff"
    with pytest.raises(ValueError):
        Address(256, b"")
    with pytest.raises(ValueError):
        Address.tcp("h", 65536)


@given(s.transport_messages)
def test_round_trip(msg: TransportMessage) -> None:
    enc = encode_message(msg)
    assert decode_message(enc) == msg
    assert decode_message(memoryview(enc)) == msg


def test_routes_are_stored_as_tuples() -> None:
    msg = TransportMessage(1, [SERVICE], [PEER], b"")
    assert msg.onward_route == (SERVICE,)
    assert msg.return_route == (PEER,)


# --- strict decoding --------------------------------------------------------------------


def _bad(hex_: str) -> DecodeError:
    with pytest.raises(DecodeError) as info:
        decode_message(bytes.fromhex(hex_))
    return info.value


@pytest.mark.parametrize("version", ["00", "02", "8001"])
def test_version_must_be_1(version: str) -> None:
    err = _bad(version + "000000")
    assert (err.what, err.offset) == ("TransportMessage.version", 0)
    assert err.reason.endswith("expected 1")


def test_field_errors_name_the_route_position() -> None:
    err = _bad("01" + "02" + "00" + "0161" + "00" + "05" + "00" + "00")
    assert (err.what, err.offset) == ("TransportMessage.onward_route[1].value", 6)
    err = _bad("01" + "00" + "01" + "01")
    assert (err.what, err.offset) == ("TransportMessage.return_route[0].value", 4)
    err = _bad("01" + "00" + "00" + "05" + "00")
    assert err.what == "TransportMessage.payload"
    assert err.reason == "length 5 past the end (1 bytes left)"
    err = _bad("01" + "ff7f" + "00")
    assert err.what == "TransportMessage.onward_route"
    assert err.reason.startswith("count 16383 exceeds")
    err = _bad("01000000" + "00")
    assert (err.what, err.offset, err.reason) == ("TransportMessage", 4, "1 trailing byte")
    err = _bad("01" + "8080808080808080808001" + "0000")
    assert err.reason == "varint longer than 10 bytes"


@settings(max_examples=100)
@given(s.transport_messages)
def test_every_truncation_raises_decode_error(msg: TransportMessage) -> None:
    enc = encode_message(msg)
    for cut in range(len(enc)):
        with pytest.raises(DecodeError):
            decode_message(enc[:cut])


@settings(max_examples=300)
@given(st.binary(max_size=48))
def test_random_bytes_only_raise_decode_errors(buf: bytes) -> None:
    try:
        decode_message(buf)
    except OckamError as err:
        assert isinstance(err, DecodeError)


# --- routing steps ----------------------------------------------------------------------


def test_hop_drops_own_address() -> None:
    app = Address.local("app")
    msg = TransportMessage(1, (PEER, SERVICE), (app,), b"x")
    assert hop(msg, PEER) == TransportMessage(1, (SERVICE,), (app,), b"x")


def test_hop_refuses_a_message_for_someone_else() -> None:
    msg = TransportMessage(1, (SERVICE,), (), b"")
    with pytest.raises(OckamError, match=r"stream_service.*received by LOCAL:app"):
        hop(msg, Address.local("app"))
    with pytest.raises(OckamError, match="empty onward route"):
        hop(TransportMessage(1, (), (), b""), SERVICE)


def test_forward_and_reply() -> None:
    app = Address.local("app")
    received = hop(TransportMessage(1, (PEER, SERVICE), (app,), b"req"), PEER)
    forwarded = forward_via(received, PEER)
    assert forwarded.return_route == (PEER, app)
    worker = Address.local("stream_my_stream")
    reply = reply_to(forwarded, b"resp", worker)
    assert reply == TransportMessage(1, (PEER, app), (worker,), b"resp")


# --- TCP framing ------------------------------------------------------------------------


def test_frame_prefix_is_u16_big_endian() -> None:
    assert frame(b"\x01" * 300)[:2] == bytes.fromhex("012c")
    assert frame(b"ab") == bytes.fromhex("00026162")


def test_frame_limit() -> None:
    assert len(frame(b"\x00" * MAX_FRAME)) == MAX_FRAME + 2
    with pytest.raises(FrameTooLargeError) as info:
        frame(b"\x00" * (MAX_FRAME + 1))
    assert (info.value.size, info.value.limit) == (65536, 65535)
    assert "65536" in str(info.value) and "65535" in str(info.value)
    with pytest.raises(ValueError):
        frame(b"")


def test_frame_reader_reads_the_largest_frame() -> None:
    body = bytes(range(256)) * 255 + b"\x01" * 255
    assert len(body) == MAX_FRAME
    reader = FrameReader()
    assert reader.feed(frame(body)[:-1]) == []
    assert reader.feed(frame(body)[-1:]) == [body]
    assert reader.buffered == 0


@given(st.lists(s.transport_messages, max_size=5), st.data())
def test_frame_reader_any_chunking(msgs: list[TransportMessage], data: st.DataObject) -> None:
    encoded = [encode_message(m) for m in msgs]
    stream = b"".join(frame(e) for e in encoded)
    reader = FrameReader()
    got: list[bytes] = []
    for chunk in data.draw(s.chunked(stream)):
        got.extend(reader.feed(chunk))
    reader.eof()
    assert got == encoded
    assert [decode_message(g) for g in got] == msgs


def test_frame_reader_rejects_zero_length_frames_and_stays_failed() -> None:
    reader = FrameReader()
    assert reader.feed(frame(b"abc") + b"\x00") == [b"abc"]
    with pytest.raises(DecodeError) as info:
        reader.feed(b"\x00")
    assert (info.value.what, info.value.offset) == ("TcpFrame.length", 5)
    with pytest.raises(DecodeError):
        reader.feed(frame(b"abc"))


def test_frame_reader_eof_inside_a_frame() -> None:
    reader = FrameReader()
    reader.feed(b"\x00\x05ab")
    with pytest.raises(DecodeError) as info:
        reader.eof()
    assert (info.value.what, info.value.offset) == ("TcpFrame", 0)
    assert "4 bytes buffered" in info.value.reason


# --- payload budget ---------------------------------------------------------------------


@given(s.routes, s.routes, st.integers(4, 70000))
def test_max_payload_size_is_the_largest_that_fits(
    onward: tuple[Address, ...], back: tuple[Address, ...], limit: int
) -> None:
    try:
        size = max_payload_size(onward, back, limit)
    except FrameTooLargeError:
        assert len(encode_message(TransportMessage(1, onward, back, b""))) > limit
        return
    fits = encode_message(TransportMessage(1, onward, back, b"\x00" * size))
    assert len(fits) <= limit
    over = encode_message(TransportMessage(1, onward, back, b"\x00" * (size + 1)))
    assert len(over) > limit


def test_max_payload_size_default_is_the_frame_limit() -> None:
    size = max_payload_size((SERVICE,), (PEER,))
    msg = TransportMessage(1, (SERVICE,), (PEER,), b"\x00" * size)
    assert len(frame(encode_message(msg))) == MAX_FRAME + 2
