"""``coordinator/links/conn.py``: one link connection over real sockets, plain and TLS.

Frames are built here with the flow framing and tags of ``tests/link_peer.py`` (from the
layouts, not with project code) and sent from a raw socket; the connection under test
delivers them to a handler as they are read.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Callable
from pathlib import Path

import pytest

from ambrosia_py import eventloop
from ambrosia_py.coordinator.links.auth import LinkAuthError, LinkChannel
from ambrosia_py.coordinator.links.config import LinkSettings, tls_contexts
from ambrosia_py.coordinator.links.conn import FrameHandler, LinkConn, LinkProtocol
from ambrosia_py.flow import ConnectPacket, FlowConnection, PeerConnected
from tests.certs import mutual_tls, needs_openssl
from tests.link_peer import LINK_TOKEN, PING_TOKEN, Keys, connect_packet, flow_frame

KEY = bytes(range(32))


async def _pair(
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None = None,
) -> tuple[LinkConn, asyncio.StreamReader, asyncio.StreamWriter]:
    """A LinkConn accepting one connection, and the raw peer that dialed it."""
    loop = asyncio.get_running_loop()
    made: asyncio.Future[LinkConn] = loop.create_future()

    def on_made(protocol: LinkProtocol) -> None:
        local = ConnectPacket.current(canonical_port=1, connection_id=1, canonical_ipv4=1)
        made.set_result(LinkConn(protocol, FlowConnection(local, dialer=False), 5.0))

    server = await loop.create_server(
        lambda: LinkProtocol(on_made),
        "127.0.0.1",
        0,
        ssl=tls[0] if tls else None,
    )
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection(
        "127.0.0.1",
        port,
        ssl=tls[1] if tls else None,
    )
    conn = await made
    server.close()
    return conn, reader, writer


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The TLS contexts of a link between two coordinators, with a fresh certificate."""
    options = mutual_tls(tmp_path, ("a",))["a"]
    contexts = tls_contexts(LinkSettings(tls_cert=Path(options[1]), tls_key=Path(options[3])))
    assert contexts is not None
    return contexts


async def _open(conn: LinkConn, writer: asyncio.StreamWriter) -> tuple[Keys, LinkChannel]:
    """The ConnectPackets, then both ends take the same keys (no secret handshake here:
    that is link_auth's, tested on its own); returns the peer's keys."""
    writer.write(connect_packet())
    event = await conn.next_event()
    assert isinstance(event, PeerConnected) and event.compatible
    keys = Keys.__new__(Keys)
    keys.send_key = keys.receive_key = KEY
    keys.sent = keys.received = 0
    conn.channel = LinkChannel(send_key=KEY, receive_key=KEY)
    conn.flow.max_frame_length = 1 << 20
    return keys, conn.channel


def _tagged(keys: Keys, payload: bytes, token: bytes = LINK_TOKEN) -> bytes:
    return flow_frame(keys.seal(token, payload), token)


async def _delivered_in_order(tls: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> None:
    conn, _, writer = await _pair(tls)
    keys, _ = await _open(conn, writer)
    got: list[bytes] = []
    frames = [bytes([n % 256]) * n for n in (1, 100, 70_000, 3, 300_000)]
    stream = b"".join(
        _tagged(keys, f) + (_tagged(keys, b"", PING_TOKEN) if i % 2 else b"")
        for i, f in enumerate(frames)
    )
    for at in range(0, len(stream), 7_777):  # in pieces that cut frames anywhere
        writer.write(stream[at : at + 7_777])
        await writer.drain()
    writer.close()

    def take(payload: memoryview) -> None:
        got.append(bytes(payload))

    with pytest.raises(ConnectionError, match="the peer closed the link"):
        async with conn.idle_limit(30):
            await conn.deliver(take)
    assert got == frames


def test_frames_are_delivered_in_order_pings_skipped_then_the_end_is_reported() -> None:
    asyncio.run(_delivered_in_order(None))


@needs_openssl
def test_the_same_over_tls(tmp_path: Path) -> None:
    asyncio.run(_delivered_in_order(_tls(tmp_path)))


async def _lost_tls(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    conn, _, writer = await _pair(tls)
    await _open(conn, writer)
    assert conn.writable_now and conn.queued == 0
    transport = writer.transport
    sock = transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    transport.abort()  # a reset: the TLS transport under the conn is lost
    with pytest.raises((ConnectionError, OSError)):
        async with conn.idle_limit(30):
            await conn.deliver(lambda payload: None)
    # A lost TLS transport raises when asked its buffer size, or written to (an
    # AttributeError, which once ended a link's send loop); the conn does neither.
    assert conn.closing and not conn.writable_now and conn.queued == 0
    with pytest.raises((ConnectionError, OSError)):
        conn.write(b"after the end")


async def _closed_twice(tls: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    conn, _, writer = await _pair(tls)
    await _open(conn, writer)
    conn.transport.write(conn.flow.connect_packet_bytes())
    conn.write(b"while open")
    # Closed twice before the loss is reported (the link closes a connection from more
    # than one place): asyncio's TLS transport then drops its protocol, and a write to it
    # raises AttributeError, which once ended a link's send loop for good.
    conn.transport.close()
    conn.transport.close()
    with pytest.raises(ConnectionResetError):
        conn.write(b"after the close")
    with pytest.raises(ConnectionResetError):
        await conn.ping()


@needs_openssl
def test_writing_to_a_tls_connection_closed_twice_is_a_connection_error(tmp_path: Path) -> None:
    tls = _tls(tmp_path)
    asyncio.run(_closed_twice(tls))


@needs_openssl
def test_a_lost_tls_connection_says_it_is_closing_and_asking_does_not_raise(
    tmp_path: Path,
) -> None:
    tls = _tls(tmp_path)
    asyncio.run(_lost_tls(tls))


async def _bad_tag() -> None:
    conn, _, writer = await _pair()
    keys, _ = await _open(conn, writer)
    got: list[bytes] = []
    good = _tagged(keys, b"first")
    bad = bytearray(keys.seal(LINK_TOKEN, b"second"))
    bad[-1] ^= 1  # the tag's last byte; the flow checksum is made over it as sent
    writer.write(good + flow_frame(bytes(bad)) + _tagged(keys, b"third"))
    await writer.drain()
    with pytest.raises(LinkAuthError, match="fails its tag"):
        async with conn.idle_limit(30):
            await conn.deliver(lambda payload: got.append(bytes(payload)))
    assert got == [b"first"]  # nothing after the bad frame
    assert conn.closing


def test_a_bad_tag_ends_delivery_and_nothing_after_it_is_delivered() -> None:
    asyncio.run(_bad_tag())


async def _idle_and_paused() -> None:
    conn, _, writer = await _pair()
    await _open(conn, writer)

    async def read() -> None:
        async with conn.idle_limit(0.2):
            await conn.deliver(lambda payload: None)

    conn.pause_reading()  # back-pressure: a pause is not idleness
    task = asyncio.ensure_future(read())
    await asyncio.sleep(0.6)
    assert not task.done()
    conn.resume_reading()  # reading again, and nothing comes: idle 0.2 s later
    done, _ = await asyncio.wait({task}, timeout=30)
    assert task in done and isinstance(task.exception(), TimeoutError)
    assert not conn.closing  # idleness is the caller's to act on


def test_a_paused_connection_is_not_idle_and_a_resumed_quiet_one_is() -> None:
    asyncio.run(_idle_and_paused())


async def _delivering(
    conn: LinkConn,
    take: FrameHandler,
    read_done: Callable[[], None] | None = None,
) -> asyncio.Task[None]:
    """``conn`` delivering to ``take`` (and ``read_done``) in a task, started."""

    async def deliver() -> None:
        async with conn.idle_limit(30):
            await conn.deliver(take, read_done)

    task = asyncio.ensure_future(deliver())
    await asyncio.sleep(0)  # delivering now
    return task


async def _read_done() -> None:
    conn, _, writer = await _pair()
    keys, _ = await _open(conn, writer)
    events: list[str] = []
    task = await _delivering(
        conn, lambda payload: events.append(bytes(payload).decode()), lambda: events.append("done")
    )
    protocol = conn.transport.get_protocol()
    assert isinstance(protocol, asyncio.Protocol)
    # Reads as the transport hands them over: three frames, one (the C path's shape),
    # two and the first half of a third, its second half.
    a, b, c, d, e, f = (_tagged(keys, x) for x in (b"a", b"b", b"c", b"d", b"e", b"f"))
    for read in (a + b + c, d, e + f[:10], f[10:]):
        protocol.data_received(read)
    assert events == ["a", "b", "c", "done", "d", "done", "e", "done", "f", "done"]
    writer.close()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(task, 30)


def test_the_end_of_each_reads_frames_is_said_after_them() -> None:
    asyncio.run(_read_done())


async def _skip_turn() -> None:
    conn, _, writer = await _pair()
    keys, _ = await _open(conn, writer)
    got: list[bytes] = []
    task = await _delivering(conn, lambda payload: got.append(bytes(payload)))
    conn.skip_turn()
    assert not conn.transport.is_reading()
    await asyncio.sleep(0)  # the next turn
    assert conn.transport.is_reading()
    conn.skip_turn()
    conn.pause_reading()  # back-pressure in the same turn: it outlasts the skipped turn
    for _ in range(3):
        await asyncio.sleep(0)
    assert not conn.transport.is_reading()
    writer.write(_tagged(keys, b"x"))
    await writer.drain()
    await asyncio.sleep(0.05)
    assert got == []
    conn.resume_reading()
    async with asyncio.timeout(30):
        while not got:
            await asyncio.sleep(0.001)
    assert got == [b"x"]
    writer.close()
    with pytest.raises(ConnectionError):
        await asyncio.wait_for(task, 30)


@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_a_skipped_turn_reads_nothing_until_the_next_and_a_pause_outlasts_it(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)
    eventloop.run(_skip_turn())
