"""Frames and :class:`FrameReader`: round trips, any chunking, and malformed input.

Malformed input raises only :class:`FlowError` subclasses, the right one for each case,
naming the stream offset of the frame at fault; a reader that failed keeps failing.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.flow import (
    MIN_FRAME_LENGTH,
    PACKET_LIMIT,
    ChecksumError,
    FlowError,
    FlowFrame,
    FrameLengthError,
    FrameReader,
    Token,
    TruncatedFrameError,
    encode_frame,
    encode_frame_bytes,
)
from tests.test_flow_strategies import frames, messages, splits, tokens

FAST = settings(max_examples=200, deadline=None)
TOKEN = Token(0x0123_4567_89AB_CDEF, 7)


def _stream(items: list[tuple[Token, bytes]]) -> bytes:
    return b"".join(encode_frame_bytes(t, m) for t, m in items)


def _read(chunks: list[bytes], **kwargs: int) -> list[tuple[Token, bytes]]:
    reader = FrameReader(**kwargs)
    out: list[FlowFrame] = []
    for chunk in chunks:
        out.extend(reader.frames(chunk))
    reader.close()
    return [(f.token, bytes(f.message)) for f in out]


@FAST
@given(tokens, messages)
def test_frame_round_trip(token: Token, message: bytes) -> None:
    parts = encode_frame(token, message)
    data = b"".join(parts)
    assert len(data) == 28 + len(message)
    assert struct.unpack_from("<I", data)[0] == MIN_FRAME_LENGTH + len(message)
    (frame,) = FrameReader().frames(data)
    assert frame.token == token
    assert frame.message == message
    assert frame.message.readonly
    assert frame.offset == 0


@FAST
@given(frames, st.data())
def test_any_chunking_gives_the_same_frames(
    items: list[tuple[Token, bytes]], data: st.DataObject
) -> None:
    stream = _stream(items)
    assert _read(data.draw(splits(stream))) == items


@given(frames)
@settings(max_examples=30, deadline=None)
def test_one_byte_at_a_time(items: list[tuple[Token, bytes]]) -> None:
    stream = _stream(items)
    assert _read([stream[i : i + 1] for i in range(len(stream))]) == items


def test_offsets_and_buffered() -> None:
    first, second = encode_frame_bytes(TOKEN, b"a"), encode_frame_bytes(TOKEN, b"bc")
    reader = FrameReader(start_offset=44)
    reader.feed(first + second[:5])
    frame = reader.next_frame()
    assert frame is not None and frame.offset == 44
    assert reader.next_frame() is None
    assert reader.offset == 44 + len(first) and reader.buffered == 5
    reader.feed(memoryview(second)[5:])
    frame = reader.next_frame()
    assert frame is not None and frame.offset == 44 + len(first) and bytes(frame.message) == b"bc"
    assert reader.buffered == 0


@pytest.mark.parametrize("size", [0, 100, 64 * 1024, 200_000])
@pytest.mark.parametrize("chunk", [1000, 70_000, 10**6])
def test_large_and_small_messages_survive_later_feeds(size: int, chunk: int) -> None:
    message = bytes(range(256)) * (size // 256) + b"z" * (size % 256)
    stream = encode_frame_bytes(TOKEN, message) * 3
    reader = FrameReader()
    got: list[FlowFrame] = []
    for i in range(0, len(stream), chunk):
        reader.feed(bytearray(stream[i : i + chunk]))
        got.extend(reader)
    assert len(got) == 3
    assert all(f.message == message for f in got)


def test_memoryview_input_is_copied() -> None:
    buf = bytearray(encode_frame_bytes(TOKEN, b"hello"))
    reader = FrameReader()
    reader.feed(memoryview(buf)[:10])
    buf[:] = bytes(len(buf))  # the caller reuses its buffer
    reader.feed(encode_frame_bytes(TOKEN, b"hello")[10:])
    (frame,) = reader
    assert bytes(frame.message) == b"hello"


# --- errors ---------------------------------------------------------------------------------


def _header(length: int) -> bytes:
    return struct.pack("<I", length)


@pytest.mark.parametrize("length", [0, 1, 15])
def test_length_below_16(length: int) -> None:
    reader = FrameReader(start_offset=44)
    with pytest.raises(FrameLengthError, match=f"frame length {length} is below 16") as info:
        reader.frames(encode_frame_bytes(TOKEN, b"ok") + _header(length))
    assert info.value.offset == 44 + 30
    assert "stream offset 74" in str(info.value)


def test_length_over_the_limit_is_refused_from_the_length_alone() -> None:
    reader = FrameReader()
    with pytest.raises(FrameLengthError, match="exceeds the limit") as info:
        reader.frames(_header(PACKET_LIMIT + 1))
    assert info.value.offset == 0
    assert FrameReader().frames(_header(PACKET_LIMIT)) == []  # the limit itself is fine
    with pytest.raises(FrameLengthError, match="frame length 17 exceeds the limit 16"):
        FrameReader(max_length=16).frames(encode_frame_bytes(TOKEN, b"x"))


def test_encode_refuses_a_frame_over_the_limit() -> None:
    with pytest.raises(FrameLengthError, match="exceeds the limit") as info:
        encode_frame(TOKEN, bytes(PACKET_LIMIT - MIN_FRAME_LENGTH + 1))
    assert info.value.offset is None
    assert len(encode_frame(TOKEN, b"x" * 4, max_length=20)[1]) == 4
    with pytest.raises(FrameLengthError):
        encode_frame(TOKEN, b"x" * 5, max_length=20)


@pytest.mark.parametrize("bad", [0, 15, 2**32])
def test_bad_limits_are_refused(bad: int) -> None:
    with pytest.raises(ValueError):
        FrameReader(max_length=bad)


@pytest.mark.parametrize("where", [4, 11, 12, 27, 28, 32])  # checksum, token, message bytes
def test_flipped_byte_fails_the_checksum(where: int) -> None:
    data = bytearray(encode_frame_bytes(TOKEN, b"hello"))
    data[where] ^= 0x40
    reader = FrameReader(start_offset=100)
    with pytest.raises(ChecksumError, match="does not match") as info:
        reader.frames(bytes(data))
    assert info.value.offset == 100


def test_a_failed_reader_keeps_failing() -> None:
    reader = FrameReader()
    with pytest.raises(FrameLengthError) as info:
        reader.frames(_header(3))
    with pytest.raises(FrameLengthError) as again:
        reader.next_frame()
    assert again.value is info.value
    with pytest.raises(FrameLengthError):
        reader.feed(encode_frame_bytes(TOKEN, b""))
    with pytest.raises(FrameLengthError):
        reader.close()


@pytest.mark.parametrize("cut", [1, 4, 12, 27, 28, 30])
def test_truncated_stream(cut: int) -> None:
    reader = FrameReader()
    assert reader.frames(encode_frame_bytes(TOKEN, b"hello")[:cut]) == []
    with pytest.raises(TruncatedFrameError, match=f"inside a frame \\({cut} bytes") as info:
        reader.close()
    assert info.value.offset == 0


def test_truncated_token_decode() -> None:
    with pytest.raises(TruncatedFrameError, match="a token needs 16 bytes, 15 present"):
        Token.decode(bytes(15))
    with pytest.raises(TruncatedFrameError, match="0 present"):
        Token.decode(bytes(16), 20)


def test_errors_pickle_with_their_offset() -> None:
    import pickle

    err = pickle.loads(pickle.dumps(ChecksumError("bad", offset=7)))
    assert type(err) is ChecksumError and err.offset == 7 and err.reason == "bad"
    assert str(err) == "bad (stream offset 7)"


# --- fuzz -----------------------------------------------------------------------------------


def _drain(chunks: list[bytes]) -> None:
    reader = FrameReader(max_length=4096)
    try:
        for chunk in chunks:
            reader.frames(chunk)
        reader.close()
    except FlowError as exc:
        with pytest.raises(type(exc)):
            reader.next_frame()


@FAST
@given(st.binary(max_size=200), st.data())
def test_random_bytes_raise_only_flow_errors(blob: bytes, data: st.DataObject) -> None:
    _drain(data.draw(splits(blob)))


@FAST
@given(frames, st.data())
def test_mutated_streams_raise_the_right_error(
    items: list[tuple[Token, bytes]], data: st.DataObject
) -> None:
    stream = _stream([*items, (TOKEN, b"last")])
    pos = data.draw(st.integers(0, len(stream) - 1))
    flip = data.draw(st.integers(1, 255))
    mutated = bytearray(stream)
    mutated[pos] ^= flip
    # Which frame did we hit, and which field of it?
    start = 0
    for _token, message in [*items, (TOKEN, b"last")]:
        end = start + 28 + len(message)
        if pos < end:
            break
        start = end
    reader = FrameReader()
    with pytest.raises(FlowError) as info:
        for chunk in data.draw(splits(bytes(mutated))):
            reader.frames(chunk)
        reader.close()
    err = info.value
    if pos - start >= 4:
        assert isinstance(err, ChecksumError) and err.offset == start
    else:  # the length field: too short, too long, or it now frames the wrong bytes
        assert isinstance(err, FrameLengthError | ChecksumError | TruncatedFrameError)
        if isinstance(err, FrameLengthError):
            assert err.offset == start


def test_frames_carry_their_own_tokens_however_many_a_peer_sends() -> None:
    """Tokens read from frames are made once and reused, up to a bound: a peer that sends
    a new token in every frame still gets each frame's own, and the reused ones stay few."""
    from ambrosia_py.flow import frames as frames_module

    sent = [Token(n, n * 7 + 1) for n in range(3 * frames_module._TOKENS_MAX)]
    stream = b"".join(encode_frame_bytes(t, b"m") for t in sent * 2)
    reader = FrameReader()
    reader.feed(stream)
    assert [f.token for f in reader] == sent * 2
    assert len(frames_module._TOKENS) <= frames_module._TOKENS_MAX
