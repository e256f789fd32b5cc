"""The one stream interface (``serving/stream.py``) holds the same rules over both of its
backends, a raw socket and an asyncio transport, on both event loops: reads handed on in
order and whole, nothing read while paused, the end said once (``b""``, or the error
that ended the connection), ``drain`` waiting above the high-water mark and raising once
the connection is lost, and ``stop_reading`` leaving the reader untold.

The peer is a raw blocking-free socket read and written here directly, so what the
stream did is seen from outside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

import pytest

from ambrosia_py import eventloop
from ambrosia_py.serving.socket_stream import SocketStream
from ambrosia_py.serving.stream import Stream
from ambrosia_py.serving.transport_stream import TransportStream

DEADLINE = 30.0  # seconds a wait may take before the test fails (never a time assertion)
HIGH_WATER = 4096
BACKENDS = ("socket", "transport")


class Reader:
    """What a stream hands its reader."""

    def __init__(self) -> None:
        self.reads: list[bytes] = []
        self.errors: list[Exception] = []

    def on_data(self, data: bytes) -> None:
        assert type(data) is bytes  # the chunk itself, never a copy into another type
        self.reads.append(data)

    def on_error(self, exc: Exception) -> None:
        self.errors.append(exc)

    @property
    def ends(self) -> int:
        return self.reads.count(b"")


async def until(predicate: Callable[[], object], what: str) -> None:
    try:
        async with asyncio.timeout(DEADLINE):
            while not predicate():
                await asyncio.sleep(0.001)  # loop turns for the stream's callbacks
    except TimeoutError:
        pytest.fail(f"no {what} within {DEADLINE:g} s")


async def turns(n: int = 20) -> None:
    """A few turns of the loop: enough for a callback that was going to run to run."""
    for _ in range(n):
        await asyncio.sleep(0)


@contextlib.asynccontextmanager
async def connected(
    backend: str, reader: Reader, buffer: int | None = None
) -> AsyncIterator[tuple[Stream[Any], socket.socket]]:
    """A stream of ``backend`` reading into ``reader``, and its raw peer (non-blocking).

    ``buffer``: small kernel buffers, so that what the stream writes waits in it.
    """
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    peer = socket.socket()
    peer.setblocking(False)
    if buffer is not None:
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    try:
        connecting = asyncio.ensure_future(loop.sock_connect(peer, listener.getsockname()))
        ours, _ = await asyncio.wait_for(loop.sock_accept(listener), DEADLINE)
        await asyncio.wait_for(connecting, DEADLINE)
    finally:
        listener.close()
    if buffer is not None:
        ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
    stream: Stream[Any]
    if backend == "socket":
        stream = SocketStream(ours, high_water=HIGH_WATER)
        stream.read_each(reader.on_data, reader.on_error)
    else:

        def made(connected: TransportStream) -> None:
            connected.read_each(reader.on_data, reader.on_error)

        transport, stream = await loop.connect_accepted_socket(lambda: TransportStream(made), ours)
        transport.set_write_buffer_limits(high=HIGH_WATER)
    try:
        yield stream, peer
    finally:
        stream.close()
        peer.close()


def reset(peer: socket.socket) -> None:
    """Close ``peer`` with linger 0: the stream's side gets a reset."""
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()


def unread(peer: socket.socket) -> int:
    """Bytes waiting in ``peer``'s receive queue, left there (peeked)."""
    try:
        return len(peer.recv(1 << 20, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


async def _reads_pause_and_end(backend: str) -> None:
    """Reads come in order; paused, nothing is read; the peer's end comes once."""
    reader = Reader()
    async with connected(backend, reader) as (stream, peer):
        peer.send(b"one")
        await until(lambda: reader.reads == [b"one"], "the first read")
        stream.pause_reading()
        await turns()
        peer.send(b"two")
        await turns()
        await asyncio.sleep(0.05)  # what a reading stream would have read meanwhile
        assert reader.reads == [b"one"]  # paused: it waits in the socket
        stream.resume_reading()
        await until(lambda: b"".join(reader.reads) == b"onetwo", "the read after resuming")
        peer.shutdown(socket.SHUT_WR)
        await until(lambda: reader.ends, "the end of the stream")
        stream.close()
        await turns()
        assert reader.ends == 1 and reader.reads[-1] == b"" and not reader.errors


async def _reset_goes_to_on_error(backend: str) -> None:
    """A reset goes to the error callback alone, and drain raises after it."""
    reader = Reader()
    async with connected(backend, reader) as (stream, peer):
        stream.write(b"never read")
        await until(lambda: unread(peer) == len(b"never read"), "the bytes at the peer")
        reset(peer)
        await until(lambda: reader.errors, "the reset")
        await turns()
        assert reader.reads == [] and len(reader.errors) == 1
        assert isinstance(reader.errors[0], ConnectionResetError)
        with pytest.raises(ConnectionResetError, match="the connection is lost"):
            await stream.drain()


async def _drain_waits_above_the_mark(backend: str) -> None:
    """Drain waits above the high-water mark until the peer reads, every byte in order."""
    reader = Reader()
    async with connected(backend, reader, buffer=16384) as (stream, peer):
        stream.write(b"a" * 1000)  # below the mark: no wait
        await asyncio.wait_for(stream.drain(), DEADLINE)
        big = bytes(range(256)) * 4096  # 1 MiB: more than both socket buffers hold
        stream.writelines([big, b"end"])
        assert stream.behind and stream.queued > HIGH_WATER
        draining = asyncio.ensure_future(stream.drain())
        await turns()
        assert not draining.done()  # the peer reads nothing: it waits
        loop = asyncio.get_running_loop()
        got = bytearray()
        async with asyncio.timeout(DEADLINE):
            while len(got) < 1000 + len(big) + 3:
                got += await loop.sock_recv(peer, 1 << 16)
            await draining
        assert bytes(got) == b"a" * 1000 + big + b"end"
        assert not stream.behind and stream.queued <= HIGH_WATER


async def _close_and_stop_reading(backend: str) -> None:
    """Close says the end once; after stop_reading the reader is told nothing."""
    reader = Reader()
    async with connected(backend, reader) as (stream, peer):
        stream.close()
        await until(lambda: reader.ends, "the end said on close")
        stream.close()
        await turns()
        assert reader.reads == [b""] and not reader.errors and stream.closing
        loop = asyncio.get_running_loop()
        assert await asyncio.wait_for(loop.sock_recv(peer, 1), DEADLINE) == b""  # closed
    quiet = Reader()
    async with connected(backend, quiet) as (stream, peer):
        stream.stop_reading()
        peer.send(b"unread")
        await turns()
        stream.close()
        assert stream.closing
        with contextlib.suppress(ConnectionResetError):  # unread bytes: closed with a reset
            await asyncio.wait_for(loop.sock_recv(peer, 1), DEADLINE)
        await turns()  # the transport reports the loss (after its socket is closed)
        assert quiet.reads == [] and quiet.errors == []  # the reader is not told


SCENARIOS = (
    _reads_pause_and_end,
    _reset_goes_to_on_error,
    _drain_waits_above_the_mark,
    _close_and_stop_reading,
)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.strip("_"))
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_both_backends_hold_the_same_rules_on_both_loops(
    scenario: Callable[[str], Coroutine[Any, Any, None]],
    backend: str,
    loop: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)
    eventloop.run(scenario(backend))


def test_a_reader_registered_after_the_end_is_told_at_once() -> None:
    async def main() -> None:
        ours, peer = socket.socketpair()
        stream = SocketStream(ours)
        peer.close()
        assert await asyncio.wait_for(stream.read(), DEADLINE) == b""  # seen by read()
        first = Reader()
        stream.read_each(first.on_data, first.on_error)
        await until(lambda: first.ends, "the end")
        stream.stop_reading()
        second = Reader()
        stream.read_each(second.on_data, second.on_error)
        assert second.reads == [b""]  # said already: at once, without a read
        stream.close()
        assert first.reads == [b""] and second.reads == [b""]

    asyncio.run(main())


def test_read_each_after_read_takes_the_socket_over() -> None:
    """A ``read`` leaves the socket registered for the next; ``read_each`` after it
    replaces that registration rather than leave its reader unwatched."""

    async def main() -> None:
        ours, peer = socket.socketpair()
        stream = SocketStream(ours)
        reading = asyncio.ensure_future(stream.read())
        await turns(2)
        peer.send(b"first")
        assert await asyncio.wait_for(reading, DEADLINE) == b"first"
        reader = Reader()
        stream.read_each(reader.on_data, reader.on_error)
        peer.send(b"second")
        await until(lambda: reader.reads == [b"second"], "the callback's read")
        stream.close()
        peer.close()

    asyncio.run(main())


def test_a_reset_seen_by_read_raises_there_and_drain_raises_after_it() -> None:
    async def main() -> None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            peer = socket.create_connection(listener.getsockname())
            ours, _ = listener.accept()
        stream = SocketStream(ours)
        stream.write(b"never read")
        await until(lambda: unread(peer) == len(b"never read"), "the bytes at the peer")
        reading = asyncio.ensure_future(stream.read())
        await turns(2)
        reset(peer)
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reading, DEADLINE)
        assert stream.behind and stream.closing
        with pytest.raises(ConnectionResetError, match="the connection is lost"):
            await stream.drain()
        stream.close()
        peer.close()

    asyncio.run(main())
