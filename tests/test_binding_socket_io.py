"""The binding's socket I/O (binding/socket_io.py): writes without copies, in order,
with back-pressure above the high-water mark; reads of fresh bytes; a peer gone ends it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.binding.socket_io import SocketStream, open_socket
from ambrosia_py.iov import IOV_MAX, byte_sized
from tests.test_binding_link_reader import _until

DEADLINE = 30.0  # seconds a wait may take before the test fails (never a time assertion)


@contextlib.asynccontextmanager
async def tcp_pair(buffer: int | None = None) -> AsyncIterator[tuple[SocketStream, socket.socket]]:
    """A :class:`SocketStream` connected over loopback TCP to a raw non-blocking socket.

    ``buffer``: small kernel buffers on both ends, so the socket fills and writes queue.
    """
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        accepting = asyncio.ensure_future(loop.sock_accept(listener))
        sock = await open_socket("127.0.0.1", listener.getsockname()[1])
        peer, _ = await asyncio.wait_for(accepting, DEADLINE)
    finally:
        listener.close()
    peer.setblocking(False)
    if buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    stream = SocketStream(sock, high_water=4096)
    try:
        yield stream, peer
    finally:
        stream.close()
        peer.close()


async def read_all(peer: socket.socket, n: int, piece: int = 1000) -> bytes:
    """Read ``n`` bytes in small pieces, letting the loop run between them (a slow reader)."""
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < n:
        data = await asyncio.wait_for(loop.sock_recv(peer, piece), DEADLINE)
        assert data, f"the stream ended after {len(got)} of {n} bytes"
        got += data
        await asyncio.sleep(0)
    return bytes(got)


def test_open_socket_turns_nagle_off_and_reports_a_refused_port() -> None:
    async def main() -> None:
        async with tcp_pair() as (stream, _):
            sock = stream._sock
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            assert not sock.getblocking()
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()  # nothing listens there now
        with pytest.raises(OSError):
            await open_socket("127.0.0.1", port)

    asyncio.run(main())


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(min_value=0, max_value=30_000), min_size=1, max_size=6),
        min_size=1,
        max_size=8,
    ),
    st.sampled_from([bytes, bytearray, memoryview]),
)
def test_every_byte_arrives_in_order_through_a_full_socket(
    records: list[list[int]], kind: type
) -> None:
    """Records of parts of any size, written faster than a slow reader takes them: the
    socket fills, the rest queues, and the reader gets exactly the bytes, in order."""
    stamp = iter(range(1 << 30))
    batches = [[kind(bytes([next(stamp) % 251]) * size) for size in sizes] for sizes in records]
    expected = b"".join(bytes(part) for batch in batches for part in batch)

    async def main() -> None:
        async with tcp_pair(buffer=32768) as (stream, peer):
            reading = asyncio.ensure_future(read_all(peer, len(expected), piece=4096))
            for batch in batches:
                stream.writelines(batch)
                await asyncio.wait_for(stream.drain(), DEADLINE)
            assert await reading == expected
            assert stream.queued == 0

    asyncio.run(main())


def test_more_parts_than_one_sendmsg_takes() -> None:
    parts = [i.to_bytes(4, "big") for i in range(3 * IOV_MAX + 7)]

    async def main() -> None:
        async with tcp_pair(buffer=4096) as (stream, peer):
            stream.writelines(parts)
            assert await read_all(peer, 4 * len(parts)) == b"".join(parts)

    asyncio.run(main())


def test_queued_parts_are_the_callers_buffers_not_copies() -> None:
    async def main() -> None:
        async with tcp_pair(buffer=65536) as (stream, peer):
            parts = [bytes([i]) * 1_000_000 for i in range(4)]
            stream.writelines(parts)
            queue = list(stream._queue)
            # The part cut by the socket is a view of the same bytes; the rest are the
            # very objects written.
            assert queue[0].obj is parts[len(parts) - len(queue)]  # type: ignore[union-attr]
            untouched = parts[len(parts) - len(queue) + 1 :]
            assert all(q is p for q, p in zip(queue[1:], untouched, strict=True))
            assert await read_all(peer, 4_000_000, piece=1 << 20) == b"".join(parts)

    asyncio.run(main())


def test_drain_waits_above_the_high_water_mark_and_resumes_below_it() -> None:
    async def main() -> None:
        async with tcp_pair(buffer=65536) as (stream, peer):
            stream.write(b"a" * 2000)  # below the mark (4096): no wait
            await asyncio.wait_for(stream.drain(), DEADLINE)
            stream.writelines([b"b" * 1_000_000, b"c" * 1_000_000])
            assert stream.queued > 4096
            draining = asyncio.ensure_future(stream.drain())
            for _ in range(20):  # the peer reads nothing: it keeps waiting
                await asyncio.sleep(0)
            assert not draining.done()
            got = await read_all(peer, 2_002_000, piece=1 << 20)
            await asyncio.wait_for(draining, DEADLINE)
            assert stream.queued <= 4096
            assert got == b"a" * 2000 + b"b" * 1_000_000 + b"c" * 1_000_000

    asyncio.run(main())


def test_a_peer_gone_ends_the_writes_with_a_connection_error() -> None:
    async def main() -> None:
        async with tcp_pair(buffer=4096) as (stream, peer):
            stream.writelines([b"x" * 200_000])  # queued: the peer reads none of it
            draining = asyncio.ensure_future(stream.drain())
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")
            peer.close()  # with unread bytes and linger 0: a reset
            with pytest.raises(ConnectionError):
                await asyncio.wait_for(draining, DEADLINE)
            stream.write(b"after")  # dropped, and drain still says why
            assert stream.queued == 0
            with pytest.raises(ConnectionError):
                await stream.drain()

    asyncio.run(main())


def test_reads_are_fresh_bytes_until_the_end_of_the_stream() -> None:
    async def main() -> None:
        async with tcp_pair() as (stream, peer):
            reading = asyncio.ensure_future(stream.read())
            await asyncio.sleep(0)
            peer.send(b"hello")
            assert await asyncio.wait_for(reading, DEADLINE) == b"hello"
            peer.shutdown(socket.SHUT_WR)
            assert await asyncio.wait_for(stream.read(), DEADLINE) == b""

    asyncio.run(main())


def test_close_ends_a_waiting_read_and_drain() -> None:
    async def main() -> None:
        async with tcp_pair(buffer=4096) as (stream, _peer):
            reading = asyncio.ensure_future(stream.read())
            stream.writelines([b"y" * 200_000])
            draining = asyncio.ensure_future(stream.drain())
            await asyncio.sleep(0)
            assert not reading.done() and not draining.done()
            stream.close()
            assert await asyncio.wait_for(reading, DEADLINE) == b""
            await asyncio.wait_for(draining, DEADLINE)  # our own close is no error
            assert await stream.read() == b""

    asyncio.run(main())


def test_reach_midway_does_nothing_unless_its_point_is_armed() -> None:
    async def main() -> None:
        async with tcp_pair() as (stream, peer):
            stream.reach_midway("binding.mid_send", [b"never sent"])
            stream.write(b"sent")
            assert await read_all(peer, 4) == b"sent"

    asyncio.run(main())


def test_the_socket_stays_watched_between_reads_and_is_dropped_with_no_reader() -> None:
    """Request and answer: one registration for many reads; bytes arriving with no
    reader waiting unregister the socket (no loop spinning) and a later read gets them."""

    async def main() -> None:
        async with tcp_pair() as (stream, peer):
            loop = asyncio.get_running_loop()
            registered: list[int] = []
            add_reader = loop.add_reader

            def counting(fd: int, *args: object) -> None:
                registered.append(fd)
                add_reader(fd, *args)  # type: ignore[arg-type]

            loop.add_reader = counting  # type: ignore[method-assign,assignment]
            for i in range(20):
                reading = asyncio.ensure_future(stream.read())
                await asyncio.sleep(0)  # it waits: nothing sent yet
                peer.send(b"%d;" % i)
                assert await asyncio.wait_for(reading, DEADLINE) == b"%d;" % i
            assert len(registered) == 1
            # Readable with no reader: the callback drops the registration once.
            peer.send(b"later")
            for _ in range(100):
                await asyncio.sleep(0.001)
                if not stream._watching:
                    break
            assert not stream._watching
            assert await asyncio.wait_for(stream.read(), DEADLINE) == b"later"
            # Closing ends a waiting read with b"" and unregisters the socket.
            reading = asyncio.ensure_future(stream.read())
            await asyncio.sleep(0)
            assert stream._watching
            stream.close()
            assert await asyncio.wait_for(reading, DEADLINE) == b""
            assert not stream._watching

    asyncio.run(main())


def test_byte_sized_counts_bytes_and_copies_nothing() -> None:
    raw = bytes(range(24))
    for part in (raw, bytearray(raw), memoryview(raw)):
        assert byte_sized(part) is part  # already counted in bytes
    for view in (memoryview(raw).cast("I"), memoryview(raw).cast("B", (4, 6))):
        sized = byte_sized(view)
        assert isinstance(sized, memoryview) and sized.obj is raw
        assert len(sized) == 24 and bytes(sized) == raw


def test_read_each_hands_over_every_read_in_order_pauses_and_ends_once() -> None:
    async def main() -> None:
        async with tcp_pair() as (stream, peer):
            got: list[bytes] = []
            errors: list[OSError] = []
            stream.read_each(got.append, errors.append)
            peer.sendall(b"one")
            await _until(lambda: got == [b"one"], "the first read")
            stream.pause_reading()
            peer.sendall(b"two")
            await asyncio.sleep(0.05)  # paused: nothing is handed over meanwhile
            assert got == [b"one"]
            stream.resume_reading()
            await _until(lambda: b"".join(got) == b"onetwo", "the read after resuming")
            peer.shutdown(socket.SHUT_WR)
            await _until(lambda: got[-1:] == [b""], "the end of the stream")
            stream.close()  # the end was said already: not again
            assert got.count(b"") == 1 and not errors

    asyncio.run(main())


def test_read_each_ends_with_b_empty_on_close_and_a_reset_goes_to_on_error() -> None:
    async def main() -> None:
        async with tcp_pair() as (stream, peer):
            got: list[bytes] = []
            stream.read_each(got.append, lambda exc: pytest.fail(f"unexpected {exc}"))
            stream.close()
            assert got == [b""]
        async with tcp_pair() as (stream, peer):
            got = []
            errors: list[OSError] = []
            stream.read_each(got.append, errors.append)
            peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            peer.close()  # linger 0: a reset
            await _until(lambda: errors, "the reset")
            assert isinstance(errors[0], ConnectionResetError) and got == []

    asyncio.run(main())
