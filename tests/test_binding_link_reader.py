"""The coordinator's reader of the binding's socket (``BindingLink.read_each``).

Each read is handed on from the event loop's reader callback, in order and whole; paused,
nothing is read (the bytes wait in the socket, where TCP holds the binding back) until it
resumes; the binding's end comes once as ``b""``, and a failed read as the error. What a
recovery read ahead comes first, through ``recv``, and the callback only after it.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest

from ambrosia_py.coordinator.core.binding_link import BindingLink


def _link() -> tuple[BindingLink, socket.socket]:
    receive, binding = socket.socketpair()
    receive.setblocking(False)
    send, _ = socket.socketpair()
    return BindingLink(receive, send), binding


async def _until(predicate: Callable[[], object], what: str) -> None:
    try:
        async with asyncio.timeout(10):
            while not predicate():
                await asyncio.sleep(0.001)  # a few loop turns for the reader callback
    except TimeoutError:
        pytest.fail(f"no {what} within 10 s")


def test_reads_in_order_pausing_holds_them_and_the_end_comes_once() -> None:
    async def main() -> None:
        link, binding = _link()
        got: list[bytes] = []
        lost: list[OSError] = []
        link.read_each(got.append, lost.append)
        binding.sendall(b"first")
        await _until(lambda: got == [b"first"], "the first read")
        assert not link.has_unread()  # all read
        link.pause_reading()
        binding.sendall(b"second")
        for _ in range(20):
            await asyncio.sleep(0)
        assert got == [b"first"]  # paused: nothing read
        assert link.has_unread()  # the bytes wait in the socket
        link.resume_reading()
        await _until(lambda: len(got) == 2, "the read after resuming")
        assert got[1] == b"second"
        binding.close()
        await _until(lambda: got[-1] == b"", "the end")
        for _ in range(20):
            await asyncio.sleep(0)
        assert got == [b"first", b"second", b""] and lost == []
        link.close()

    asyncio.run(main())


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        one = socket.create_connection(server.getsockname())
        other, _ = server.accept()
    return one, other


def _queued(sock: socket.socket) -> int:
    """Bytes in ``sock``'s receive queue, left there (peeked, not read)."""
    try:
        return len(sock.recv(1 << 16, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return 0


def test_a_failed_read_is_handed_on_as_the_error() -> None:
    async def main() -> None:
        receive, binding = _tcp_pair()
        receive.setblocking(False)
        send, _ = socket.socketpair()
        link = BindingLink(receive, send)
        got: list[bytes] = []
        lost: list[OSError] = []
        link.read_each(got.append, lost.append)
        receive.sendall(b"never read")
        await _until(lambda: _queued(binding) == len(b"never read"), "the bytes at the binding")
        binding.close()  # with bytes unread: TCP resets the connection
        await _until(lambda: got or lost, "the error")
        for _ in range(20):
            await asyncio.sleep(0)
        assert got == [] and len(lost) == 1 and isinstance(lost[0], ConnectionResetError)
        link.close()

    asyncio.run(main())


def test_what_was_read_ahead_comes_first_and_the_callback_waits_for_it() -> None:
    async def main() -> None:
        link, binding = _link()
        link.read_ahead()
        binding.sendall(b"ahead")
        await _until(lambda: link.read_ahead_left and not link._ahead.empty(), "the read ahead")
        link.stop_reading_ahead()
        with pytest.raises(AssertionError):
            link.read_each(lambda _: None, lambda _: None)  # its read is still in progress
        assert await link.recv() == b"ahead"
        binding.sendall(b"after")  # the read ahead in progress returns this, and stops
        assert await link.recv() == b"after"
        assert not link.read_ahead_left
        got: list[bytes] = []
        link.read_each(got.append, lambda _: None)
        binding.sendall(b"by callback")
        await _until(lambda: got == [b"by callback"], "the callback's read")
        link.close()

    asyncio.run(main())


def test_both_binding_connections_send_without_delay() -> None:
    """Nagle's algorithm off on the connections the coordinator accepts: the binding never
    writes where it reads records, so a small record would otherwise wait for the
    acknowledgement of the one before (some 40 ms)."""
    from ambrosia_py.coordinator.core.binding_link import connect_binding
    from ambrosia_py.testing import free_port

    async def main() -> None:
        receive_port, send_port = free_port(), free_port()
        dialed: list[socket.socket] = []

        async def binding() -> None:
            loop = asyncio.get_running_loop()
            for port in (receive_port, send_port):
                sock = socket.socket()
                sock.setblocking(False)
                for _ in range(200):  # until the coordinator listens on it
                    try:
                        await loop.sock_connect(sock, ("127.0.0.1", port))
                        break
                    except ConnectionRefusedError:
                        await asyncio.sleep(0.01)
                dialed.append(sock)

        dialing = asyncio.ensure_future(binding())
        link, listeners = await connect_binding("127.0.0.1", receive_port, send_port, print)
        await dialing
        try:
            for sock in (link._receive_socket, link._send):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        finally:
            link.close()
            for listener in listeners:
                listener.close()
            for sock in dialed:
                sock.close()

    asyncio.run(main())
