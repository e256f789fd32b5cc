"""The coordinator's side of the two binding sockets (reference ambrosia.md, *The two
local sockets*): listening in the released order, refusing a second binding, and moving
bytes without copying them.

Raw sockets rather than asyncio streams: the coordinator moves every byte it logs through
these connections, and the stream classes copy each read and write. Reads use
``loop.sock_recv``, whose fresh ``bytes`` the intake keeps by reference; records go out
from one sender thread with a blocking ``sendmsg`` of their buffers, which keeps their
order and lets sending overlap the next append.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import socket
from collections.abc import Callable

from .. import wire
from ..wire import CONTROL_SEQ, Message

__all__ = ["BindingLink", "Listener", "connect_binding"]

log = logging.getLogger("ambrosia_py.coordinator")

READ_SIZE = 256 * 1024
_IOV_MAX = 1024  # buffers per sendmsg call


class Listener:
    """One listening port that hands out its first connection and refuses the rest."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._first: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()

    async def listen(self, host: str, port: int) -> None:
        # Bindings connect to "localhost", which may resolve to ::1 first: listen on both
        # loopback addresses where the machine has IPv6 (reference ambrosia.md).
        hosts = [host]
        if host == "127.0.0.1" and socket.has_ipv6:
            hosts.append("::1")
        for h in hosts:
            family = socket.AF_INET6 if ":" in h else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((h, port))
            except OSError:
                sock.close()
                if h == host:
                    raise
                continue  # no IPv6 loopback here, or its port is taken: IPv4 only
            sock.listen(8)
            sock.setblocking(False)
            self._sockets.append(sock)
            self._tasks.append(asyncio.create_task(self._accept_loop(sock)))

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, peer = await loop.sock_accept(sock)
            if not self._first.done():
                self._first.set_result(conn)
                continue
            log.warning(
                "refusing a second binding connection from %s on the %s port", peer, self.name
            )
            conn.close()

    async def accept(self) -> socket.socket:
        return await self._first

    def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sock in self._sockets:
            sock.close()


def _advance(views: list[memoryview], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``views``."""
    while sent:
        if sent >= len(views[0]):
            sent -= len(views[0])
            views.pop(0)
        else:
            views[0] = views[0][sent:]
            sent = 0


def _sendmsg_all(sock: socket.socket, views: list[memoryview]) -> None:
    """Send every buffer, blocking, without joining them (the sender thread's job)."""
    while views:
        _advance(views, sock.sendmsg(views[:_IOV_MAX]))


class BindingLink:
    """The binding's two connections.

    What the binding sends is read on the event loop (``sock_recv`` returns fresh bytes,
    which the intake keeps without copying). Records go out from one sender thread with
    a blocking ``sendmsg`` of their buffers: no copy into a transport buffer, order kept
    by the single thread, and sending overlaps the next append.
    """

    def __init__(self, receive: socket.socket, send: socket.socket) -> None:
        self._receive = receive  # what the binding sends us (non-blocking, event loop)
        self._send = send  # where we send records (blocking, sender thread)
        self._send.setblocking(True)
        self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="send")
        self._last: asyncio.Future[None] | None = None
        self.gone = False

    async def recv(self) -> bytes:
        """The next bytes from the binding; ``b""`` when it has gone."""
        return await asyncio.get_running_loop().sock_recv(self._receive, READ_SIZE)

    def has_unread(self) -> bool:
        """Whether the binding has sent bytes not read yet (a peek, never blocks)."""
        try:
            return bool(self._receive.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
        except OSError:  # BlockingIOError: nothing there; others: the reader will see
            return False

    async def send(self, parts: list[wire.Payload]) -> None:
        self.write(parts)
        await self.drain()

    def write(self, parts: list[wire.Payload]) -> None:
        """Queue bytes for the binding without waiting for them to leave.

        When nothing is queued, as much as the socket takes at once is sent right here
        (a non-blocking ``sendmsg``), and only the rest goes to the sender thread: a small
        record then reaches the binding without a thread hop.
        """
        if self.gone:
            return
        views = [memoryview(p).cast("B") for p in parts if len(p)]
        if self._last is None or self._last.done():
            if self._last is not None and self._last.exception() is not None:
                self.gone = True
                return
            try:
                _advance(views, self._send.sendmsg(views[:_IOV_MAX], [], socket.MSG_DONTWAIT))
            except BlockingIOError:
                pass
            except OSError:
                self.gone = True
                return
            if not views:
                self._last = None
                return
        loop = asyncio.get_running_loop()
        self._last = loop.run_in_executor(self._sender, _sendmsg_all, self._send, views)

    async def drain(self) -> None:
        """Wait until everything queued has been handed to the kernel (flow control)."""
        if self.gone or self._last is None:
            return
        try:
            await self._last
        except OSError:
            self.gone = True

    async def control(self, committer_id: int, msg: Message) -> None:
        await self.send(wire.encode_record_parts(committer_id, CONTROL_SEQ, [msg]))

    def close(self) -> None:
        for sock in (self._receive, self._send):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._sender.shutdown(wait=False)


async def connect_binding(
    host: str, receive_port: int, send_port: int, ready: Callable[[str], None]
) -> tuple[BindingLink, list[Listener]]:
    receive = Listener("receive")
    await receive.listen(host, receive_port)
    ready(f"receive_port={receive_port} send_port={send_port}")
    first = await receive.accept()
    first.setblocking(False)
    send = Listener("send")
    await send.listen(host, send_port)
    second = await send.accept()
    log.info("binding attached")
    return BindingLink(first, second), [receive, send]
