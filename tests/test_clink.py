"""The C accelerator ``ambrosia_py.coordinator.links._clink`` against independent references.

Its HMAC-SHA256 (OpenSSL's, called from C) against the standard library's; the frames it
seals against frames built from the layouts in ``tests/link_peer.py`` (no project code);
what it opens against the Python path (the flow reader, then ``LinkChannel.open``) on
good frames and on every kind of damage: it opens exactly what that path opens, alone in
one read, and nothing else.
Then the link connection that uses it, over a real socket, one frame per read.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import os
import struct
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.coordinator.links import auth as link_auth
from ambrosia_py.coordinator.links.auth import LinkAuthError, LinkChannel
from ambrosia_py.coordinator.links.protocol import LINK_TOKEN as LINK
from ambrosia_py.flow import FlowError, FrameReader, Token
from ambrosia_py.flow.errors import ChecksumError
from tests.accel_state import PURE, skip_unless_built
from tests.link_peer import LINK_TOKEN, PING_TOKEN, Keys, connect_packet, flow_frame
from tests.test_link_conn import _open, _pair, _tagged

_NAME = "ambrosia_py.coordinator.links._clink"
KEY = bytes(range(32))
LIMIT = 1 << 20


def test_the_accelerator_is_used_when_built() -> None:
    """Without this, the link tests could run the Python path alone and say nothing."""
    if PURE:
        assert link_auth._clink is None
        assert LinkChannel(send_key=KEY, receive_key=KEY).seal_frame(LINK, (b"x",), LIMIT) is None
        return
    skip_unless_built(_NAME)
    assert link_auth._clink is not None
    assert LinkChannel(send_key=KEY, receive_key=KEY).seal_frame(LINK, (b"x",), LIMIT)


needs_clink = pytest.mark.skipif(link_auth._clink is None, reason=f"{_NAME} is not in use")


def _keys(key: bytes, sent: int = 0, received: int = 0) -> Keys:
    keys = Keys.__new__(Keys)
    keys.send_key = keys.receive_key = key
    keys.sent, keys.received = sent, received
    return keys


@needs_clink
@given(key=st.binary(max_size=200), data=st.binary(max_size=600))
def test_hmac_is_the_standard_librarys(key: bytes, data: bytes) -> None:
    clink = link_auth._clink
    assert clink is not None
    state = clink.mac_state(key)
    assert clink.hmac(state, data) == hmac.new(key, data, hashlib.sha256).digest()
    # The keyed context serves message after message.
    assert clink.hmac(state, data[::-1]) == hmac.new(key, data[::-1], hashlib.sha256).digest()


@needs_clink
def test_a_mac_state_is_only_what_mac_state_made() -> None:
    clink = link_auth._clink
    assert clink is not None
    with pytest.raises(TypeError, match="MAC state"):
        clink.hmac(bytes(64), b"data")
    frame = LinkChannel(send_key=KEY, receive_key=KEY).seal_frame(LINK, (b"x",), LIMIT)
    assert frame is not None
    with pytest.raises(TypeError, match="MAC state"):
        clink.open_frame(frame, LIMIT, None, 0, LINK.first, LINK.second)
    with pytest.raises(TypeError, match="MAC state"):
        clink.seal_frame((b"x",), LIMIT, "key", 0, LINK.first, LINK.second)


@needs_clink
@given(
    key=st.binary(min_size=16, max_size=100),
    parts=st.lists(st.binary(max_size=300), max_size=4),
    counter=st.integers(0, 2**64 - 1),
)
def test_a_sealed_frame_is_the_layouts_bytes(key: bytes, parts: list[bytes], counter: int) -> None:
    channel = LinkChannel(send_key=key, receive_key=key)
    channel.sent = counter
    frame = channel.seal_frame(LINK, tuple(parts), LIMIT)
    assert frame == flow_frame(_keys(key, sent=counter).seal(LINK_TOKEN, b"".join(parts)))
    assert channel.sent == counter + 1


@needs_clink
def test_a_frame_over_the_limit_or_of_views_is_left_to_the_python_path() -> None:
    channel = LinkChannel(send_key=KEY, receive_key=KEY)
    assert channel.seal_frame(LINK, (bytes(100),), 131) is None  # 16 + 100 + 16 > 131
    assert channel.seal_frame(LINK, (bytes(100),), 132) is not None
    assert channel.seal_frame(LINK, (memoryview(b"abc"),), LIMIT) is None  # type: ignore[arg-type]
    assert channel.seal_frame(LINK, (b"abc",), 0) is None  # 0: frames without a checksum
    assert channel.sent == 1  # only the frame made counts


def _python_open(data: bytes, counter: int, max_length: int = LIMIT) -> bytes | None:
    """The reference: what the flow reader and ``LinkChannel.open`` make of ``data`` read
    alone at a frame boundary, when that is one link frame and nothing more."""
    channel = LinkChannel(send_key=KEY, receive_key=KEY)
    channel.received = counter
    try:
        frames = FrameReader(max_length=max_length).frames(data)
    except FlowError:
        return None
    if len(frames) != 1 or sum(len(f.message) for f in frames) + 28 != len(data):
        return None
    if frames[0].token != LINK:
        return None
    try:
        return bytes(channel.open(frames[0].token, frames[0].message))
    except LinkAuthError:
        return None


def _damaged(frame: bytes) -> Iterator[bytes]:
    """Every byte flipped, every truncation, one byte more, a second frame behind."""
    for i in range(len(frame)):
        for bit in (0x01, 0x80):
            yield frame[:i] + bytes([frame[i] ^ bit]) + frame[i + 1 :]
    for n in range(len(frame)):
        yield frame[:n]
    yield frame + b"\0"
    yield frame + frame


@needs_clink
@pytest.mark.parametrize("size", [0, 1, 20, 35, 36, 100])
def test_open_frame_opens_exactly_what_the_python_path_opens(size: int) -> None:
    channel = LinkChannel(send_key=KEY, receive_key=KEY)
    payload = os.urandom(size)
    frame = flow_frame(_keys(KEY, sent=5).seal(LINK_TOKEN, payload))
    cases = [
        (frame, 5, LIMIT),
        (frame, 4, LIMIT),  # a replayed or reordered frame: the wrong counter
        (frame, 5, len(frame) - 13),  # one byte over the length limit
        (frame, 5, len(frame) - 12),
        (flow_frame(_keys(KEY, sent=5).seal(PING_TOKEN, payload), PING_TOKEN), 5, LIMIT),
        (flow_frame(_keys(os.urandom(32), sent=5).seal(LINK_TOKEN, payload)), 5, LIMIT),
        *((bad, 5, LIMIT) for bad in _damaged(frame)),
    ]
    opened = 0
    for data, counter, limit in cases:
        channel.received = counter
        got = channel.open_frame(data, LINK, limit)
        assert got == _python_open(data, counter, limit), (data.hex(), counter, limit)
        assert channel.received == counter + (got is not None)
        opened += got is not None
    assert opened == 2  # the frame itself, and again within its exact limit


@needs_clink
@given(data=st.binary(max_size=120), counter=st.integers(0, 3))
def test_open_frame_on_garbage_agrees_with_the_python_path(data: bytes, counter: int) -> None:
    channel = LinkChannel(send_key=KEY, receive_key=KEY)
    channel.received = counter
    assert channel.open_frame(data, LINK, LIMIT) == _python_open(data, counter)


def test_a_skipped_frame_moves_the_readers_offsets() -> None:
    reader = FrameReader(max_length=LIMIT)
    frame = flow_frame(b"x" * 20)
    reader.skip(len(frame))
    bad = bytearray(flow_frame(b"y" * 20))
    bad[5] ^= 1  # the checksum
    with pytest.raises(ChecksumError) as caught:
        reader.frames(bytes(bad))
    assert caught.value.offset == len(frame)
    held = FrameReader(max_length=LIMIT)
    held.feed(frame[:10])
    with pytest.raises(ValueError, match="10 held"):
        held.skip(5)


# -- the link connection, one small frame per read ----------------------------------------


async def _one_per_read(monkeypatch: pytest.MonkeyPatch) -> None:
    conn, _, writer = await _pair()
    keys, channel = await _open(conn, writer)
    opened: list[bytes] = []
    python_opened: list[bytes] = []
    fast, slow = channel.open_frame, channel.open

    def spy_fast(data: bytes, token: Token, max_length: int) -> bytes | None:
        payload = fast(data, token, max_length)
        if payload is not None:
            opened.append(payload)
        return payload

    def spy_slow(token: Token, message: bytes) -> memoryview:
        payload = slow(token, message)
        python_opened.append(bytes(payload))
        return payload

    monkeypatch.setattr(channel, "open_frame", spy_fast)
    monkeypatch.setattr(channel, "open", spy_slow)
    got: list[bytes] = []
    arrived = asyncio.Event()

    def take(payload: bytes | memoryview) -> None:
        got.append(bytes(payload))
        arrived.set()

    async def deliver() -> None:
        async with conn.idle_limit(30):
            await conn.deliver(take)

    task = asyncio.ensure_future(deliver())
    sent = [struct.pack("<I", n) * n for n in range(1, 6)]
    for payload in sent:  # one at a time: each is read alone
        arrived.clear()
        writer.write(_tagged(keys, payload))
        await writer.drain()
        await asyncio.wait_for(arrived.wait(), 30)
    # A frame with a damaged checksum, alone: the C path declines it and the flow reader
    # names it, at the stream offset after the frames the C path took.
    bad = bytearray(_tagged(keys, b"damaged"))
    bad[4] ^= 1
    writer.write(bytes(bad))
    await writer.drain()
    with pytest.raises(ChecksumError) as caught:
        await asyncio.wait_for(task, 30)
    assert got == sent
    if link_auth._clink is not None:
        assert opened == sent and not python_opened
    else:
        assert python_opened == sent
    expected_offset = len(connect_packet()) + sum(len(_tagged(_keys(KEY), p)) for p in sent)
    assert caught.value.offset == expected_offset
    assert conn.closing


def test_small_frames_read_alone_are_delivered_by_the_fast_path_and_errors_still_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asyncio.run(_one_per_read(monkeypatch))
