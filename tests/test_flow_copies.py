"""What the flow codecs copy: one copy per received message, none per sent part.

:class:`FrameReader` hands out every message as a view of a ``bytes`` holding exactly
that message (so :class:`FlowConnection` delivers it without copying again), however the
stream was cut into chunks and however many chunks were fed before frames were asked
for. :func:`encode_frame_parts` (and :meth:`FlowConnection.send_parts`) give the same
bytes as encoding the joined message, with the parts themselves as buffers.
"""

from __future__ import annotations

import struct
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.flow import (
    ChecksumError,
    ConnectPacket,
    FlowConnection,
    FlowFrame,
    FlowStateError,
    FrameLengthError,
    FrameReader,
    FrameReceived,
    Token,
    WellKnown,
    encode_frame,
    encode_frame_bytes,
)
from ambrosia_py.flow.frames import encode_frame_parts
from tests.test_flow_strategies import frames, splits, tokens

FAST = settings(max_examples=200, deadline=None)
TOKEN = Token(0x0123_4567_89AB_CDEF, 7)
forms = st.booleans()  # checksum: the plain TCP form, or the TLS form without it


def _stream(items: list[tuple[Token, bytes]], checksum: bool = True) -> bytes:
    return b"".join(encode_frame_bytes(t, m, checksum=checksum) for t, m in items)


def _check_one_copy(frame: FlowFrame) -> None:
    """The message is a read-only view of a ``bytes`` of exactly its size."""
    assert isinstance(frame.message.obj, bytes)
    assert len(frame.message.obj) == frame.message.nbytes
    assert frame.message.readonly


def _read_all(chunks: list[bytes], *, checksum: bool, read_every: int) -> list[FlowFrame]:
    """Feed ``chunks``, asking for frames after every ``read_every``-th feed (so several
    chunks may wait in the reader before it is asked)."""
    reader = FrameReader(checksum=checksum, start_offset=26)
    out: list[FlowFrame] = []
    for i, chunk in enumerate(chunks, 1):
        reader.feed(chunk)
        if i % read_every == 0:
            out.extend(reader)
    out.extend(reader)
    reader.close()
    return out


def _offsets(items: list[tuple[Token, bytes]], checksum: bool) -> list[int]:
    offsets, at = [], 26
    for token, message in items:
        offsets.append(at)
        at += len(encode_frame_bytes(token, message, checksum=checksum))
    return offsets


@FAST
@given(frames, forms, st.integers(1, 4), st.data())
def test_any_chunking_and_any_read_pattern_give_the_same_frames_each_one_copy(
    items: list[tuple[Token, bytes]], checksum: bool, read_every: int, data: st.DataObject
) -> None:
    stream = _stream(items, checksum)
    got = _read_all(data.draw(splits(stream)), checksum=checksum, read_every=read_every)
    assert [(f.token, bytes(f.message)) for f in got] == items
    assert [f.offset for f in got] == _offsets(items, checksum)
    for frame in got:
        _check_one_copy(frame)


@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("read_every", [1, 3])
def test_a_cut_at_every_position_gives_the_same_frames(checksum: bool, read_every: int) -> None:
    items = [(TOKEN, b"first" * 7), (Token(1, 2), b""), (Token(3, 4), bytes(range(200)))]
    stream = _stream(items, checksum)
    for a in range(len(stream) + 1):
        for b in range(a, len(stream) + 1, 7):
            chunks = [c for c in (stream[:a], stream[a:b], stream[b:]) if c]
            got = _read_all(chunks, checksum=checksum, read_every=read_every)
            assert [(f.token, bytes(f.message)) for f in got] == items, (a, b)
            assert [f.offset for f in got] == _offsets(items, checksum)
            for frame in got:
                _check_one_copy(frame)


@pytest.mark.parametrize("size", [64 * 1024, 4 * 1024 * 1024 + 5])
def test_a_large_frame_in_many_chunks_is_joined_once_and_later_feeds_do_not_touch_it(
    size: int,
) -> None:
    message = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    stream = encode_frame_bytes(TOKEN, message) * 2 + encode_frame_bytes(TOKEN, b"tail")
    reader = FrameReader()
    got: list[FlowFrame] = []
    for i in range(0, len(stream), 256 * 1024):
        reader.feed(stream[i : i + 256 * 1024])
        got.extend(reader)
        if got:
            assert reader.buffered < 2 * len(stream)  # held by reference, not doubled
    assert [bytes(f.message) for f in got] == [message, message, b"tail"]
    for frame in got:
        _check_one_copy(frame)
    assert reader.buffered == 0 and reader.offset == len(stream)


def test_buffered_and_offset_while_a_frame_is_cut() -> None:
    first = encode_frame_bytes(TOKEN, b"x" * 100)
    second = encode_frame_bytes(TOKEN, b"yz")
    stream = first + second
    reader = FrameReader(start_offset=10)
    reader.feed(stream[:3])  # not even the length yet
    reader.feed(stream[3:50])
    assert reader.next_frame() is None
    assert reader.buffered == 50 and reader.offset == 10
    reader.feed(stream[50:])
    (a, b) = reader
    assert (a.offset, b.offset) == (10, 10 + len(first))
    assert bytes(b.message) == b"yz" and reader.buffered == 0
    assert reader.offset == 10 + len(stream)


def test_a_frame_trickled_in_byte_by_byte_is_held_in_about_its_own_size() -> None:
    """Small chunks of a cut frame are gathered, not held one object each (which would
    take some hundred bytes of memory for every byte sent)."""
    message = bytes(range(256)) * 800  # 200 KiB
    stream = encode_frame_bytes(TOKEN, message)
    reader = FrameReader()
    tracemalloc.start()
    try:
        for i in range(len(stream) - 1):
            reader.feed(stream[i : i + 1])
            if i % 4096 == 0:
                assert reader.next_frame() is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2 * len(stream)
    reader.feed(stream[-1:])
    (frame,) = reader
    assert frame.message == message
    _check_one_copy(frame)


# --- errors in a frame cut by chunk boundaries ------------------------------------------


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_a_cut_length_is_still_checked_from_its_four_bytes(cut: int) -> None:
    reader = FrameReader(max_length=1000, start_offset=26)
    reader.feed(encode_frame_bytes(TOKEN, b"ok"))
    header = struct.pack("<I", 1001)
    reader.feed(header[:cut])
    assert reader.next_frame() is not None
    assert reader.next_frame() is None
    reader.feed(header[cut:])
    with pytest.raises(FrameLengthError) as info:
        reader.next_frame()
    assert info.value.offset == 26 + 28 + 2


def test_a_short_cut_length_is_refused() -> None:
    reader = FrameReader()
    reader.feed(b"\x05\x00")
    reader.feed(b"\x00\x00")
    with pytest.raises(FrameLengthError):
        reader.next_frame()


@pytest.mark.parametrize("where", [4, 12, 27, 28, 5000, 9999 + 28])
def test_a_flipped_byte_in_a_cut_frame_fails_the_checksum(where: int) -> None:
    stream = bytearray(encode_frame_bytes(TOKEN, b"m" * 10_000))
    stream[where] ^= 0x40
    reader = FrameReader(start_offset=26)
    for i in range(0, len(stream), 999):
        reader.feed(bytes(stream[i : i + 999]))
    with pytest.raises(ChecksumError) as info:
        reader.next_frame()
    assert info.value.offset == 26
    with pytest.raises(ChecksumError):
        reader.feed(b"more")


# --- the connection delivers the reader's bytes -----------------------------------------


DIALER = ConnectPacket.current(canonical_port=4500, connection_id=1, canonical_ipv4=0x7F000001)
ACCEPTOR = ConnectPacket.current(canonical_port=4501, connection_id=2, canonical_ipv4=0x7F000001)
OTHER = ConnectPacket(0x1FDB_00B0_7400_0000, 1, 4, 2)  # a different version


def _pair() -> tuple[FlowConnection, FlowConnection]:
    dialer = FlowConnection(DIALER, dialer=True)
    acceptor = FlowConnection(ACCEPTOR, dialer=False)
    acceptor.receive_data(dialer.connect_packet_bytes())
    dialer.receive_data(acceptor.connect_packet_bytes())
    return dialer, acceptor


def test_frame_received_is_the_readers_bytes_not_a_copy_of_them() -> None:
    dialer, acceptor = _pair()
    message = b"q" * 300_000
    stream = b"".join(dialer.send(TOKEN, message))
    events = []
    for i in range(0, len(stream), 65_536):
        events.extend(acceptor.receive_data(stream[i : i + 65_536]))
    assert events == [FrameReceived(TOKEN, message)]
    assert isinstance(events[0], FrameReceived) and type(events[0].message) is bytes


# --- sending parts ------------------------------------------------------------------------

part_buffers = st.one_of(
    st.binary(max_size=200),
    st.binary(max_size=200).map(bytearray),
    st.binary(max_size=200).map(memoryview),
    st.binary(max_size=50).map(lambda b: memoryview(b * 4).cast("I")),  # items of 4 bytes
)


@FAST
@given(tokens, st.lists(part_buffers, max_size=6), forms)
def test_parts_encode_to_the_same_bytes_as_the_joined_message(
    token: Token, parts: list[bytes | bytearray | memoryview], checksum: bool
) -> None:
    joined = b"".join(bytes(memoryview(p)) for p in parts)
    out = encode_frame_parts(token, parts, checksum=checksum)
    assert b"".join(out) == b"".join(encode_frame(token, joined, checksum=checksum))
    assert len(out) == 1 + len(parts)
    for buf, part in zip(out[1:], parts, strict=True):  # the parts themselves, uncopied
        assert buf is part or (isinstance(buf, memoryview) and buf.obj is memoryview(part).obj)


def test_parts_over_the_limit_are_refused() -> None:
    with pytest.raises(FrameLengthError):
        encode_frame_parts(TOKEN, [b"a" * 10, b"b" * 10], max_length=35)
    assert b"".join(encode_frame_parts(TOKEN, [b"a" * 10, b"b" * 10], max_length=36))


def test_send_parts_is_send_of_the_joined_message_and_obeys_the_same_rules() -> None:
    fresh = FlowConnection(DIALER, dialer=True)
    with pytest.raises(FlowStateError):
        fresh.send_parts(TOKEN, [b"x"])
    dialer, acceptor = _pair()
    parts = [b"a" * 5000, memoryview(b"b" * 70_000), b"tag"]
    out = dialer.send_parts(TOKEN, parts)
    assert b"".join(out) == b"".join(dialer.send(TOKEN, b"".join(bytes(p) for p in parts)))
    assert acceptor.receive_data(b"".join(out)) == [
        FrameReceived(TOKEN, b"".join(bytes(p) for p in parts))
    ]
    incompatible = FlowConnection(DIALER, dialer=True)
    incompatible.connect_packet_bytes()
    incompatible.receive_data(OTHER.encode())
    assert incompatible.compatible is False
    with pytest.raises(FlowStateError):
        incompatible.send_parts(TOKEN, [b"x"])
    assert incompatible.send_parts(Token.well_known(WellKnown.PING), [b"x"])
