"""The coordinator's side of the two binding sockets (reference ambrosia.md, *The two
local sockets*): listening in the released order, admitting only the binding that shows
this start's token (:mod:`.binding_auth`), refusing a second binding, and moving bytes
without copying them.

Raw sockets rather than asyncio streams: the coordinator moves every byte it logs through
these connections, and the stream classes copy each read and write. Reads go through the
shared socket stream (:mod:`ambrosia_py.serving.socket_stream`: ``recv`` during start-up,
then its reader callback), whose fresh ``bytes`` the intake keeps by reference; records go
out from one sender thread with a blocking ``sendmsg`` of their buffers, which keeps
their order and lets sending overlap the next append (what is the coordinator's own: the
binding's stream writes on the loop).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import select
import socket
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from ... import crashpoints, wire
from ...iov import IOV_MAX, nbytes, send_all, unsent
from ...serving import RefusalLog, source_of
from ...serving.socket_stream import SocketStream
from ...wire import CONTROL_SEQ, Message
from ..registry.port_users import PortTakenError
from .binding_auth import PREAMBLE_SIZE, Socket, TokenGate

__all__ = ["BindingGoneError", "BindingLink", "Listener", "connect_binding"]

log = logging.getLogger("ambrosia_py.coordinator")

PREAMBLE_TIMEOUT = 5.0  # seconds a connection has to prove the token
MAX_UNPROVEN = 16  # connections proving the token at once; a new one evicts the oldest


class BindingGoneError(ConnectionError):
    """The binding went away while attaching: the coordinator stops (and releases the
    instance) rather than wait for good for a connection that will never come."""


class Listener:
    """One listening port that hands out one connection and refuses the rest.

    Without a gate that is the first connection (the released protocol). With one, every
    connection must first send the preamble with this start's token: connections prove
    it side by side, so one that connects first and sends nothing holds nobody up, and
    the first that proves it is the binding. The others are closed without a byte sent.
    """

    def __init__(self, name: str, kind: Socket, gate: TokenGate | None) -> None:
        self.name = name
        self._kind = kind
        self._gate = gate
        self._sockets: list[socket.socket] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._unproven: dict[asyncio.Task[None], socket.socket] = {}
        self._first: asyncio.Future[socket.socket] = asyncio.get_running_loop().create_future()
        # A local process that connects again and again must not fill the log.
        self._refusals = RefusalLog(log, f"binding connections refused on the {name} port")

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
            except OSError as exc:
                sock.close()
                if h == host:  # the caller says which port, and whose it is
                    raise PortTakenError(f"{self.name} port", host, port, exc) from None
                continue  # no IPv6 loopback here, or its port is taken: IPv4 only
            sock.listen(8)
            sock.setblocking(False)
            self._sockets.append(sock)
            self._tasks.append(asyncio.create_task(self._accept_loop(sock)))

    async def _accept_loop(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            conn, peer = await loop.sock_accept(sock)
            if conn.family != socket.AF_UNIX:
                # The binding never writes where it reads records, so nothing carries
                # its acknowledgements back soon: with Nagle's algorithm, a small record
                # sent while the one before is unacknowledged waited about 40 ms.
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._first.done():
                self._refusals(
                    source_of(peer),
                    "refusing a second binding connection from %s on the %s port",
                    peer,
                    self.name,
                )
                conn.close()
            elif self._gate is None:
                self._first.set_result(conn)
            else:
                if len(self._unproven) >= MAX_UNPROVEN:
                    # The oldest goes, not the newest: silent connections opened ahead of
                    # the binding cannot keep it out.
                    next(iter(self._unproven)).cancel(
                        f"{MAX_UNPROVEN} newer connections came to prove a token"
                    )
                task = asyncio.create_task(self._admit(conn, peer))
                self._unproven[task] = conn
                task.add_done_callback(self._unproven.pop)

    async def _admit(self, conn: socket.socket, peer: object) -> None:
        """Read the preamble (exactly its bytes: what follows belongs to the protocol)."""
        assert self._gate is not None
        loop = asyncio.get_running_loop()
        got = b""
        try:
            async with asyncio.timeout(PREAMBLE_TIMEOUT):
                while len(got) < PREAMBLE_SIZE:
                    chunk = await loop.sock_recv(conn, PREAMBLE_SIZE - len(got))
                    if not chunk:
                        break
                    got += chunk
        except TimeoutError:
            why: str | None = f"no preamble within {PREAMBLE_TIMEOUT:g} s ({len(got)} bytes)"
        except OSError as exc:
            why = f"connection lost before the preamble ({exc})"
        except asyncio.CancelledError as exc:
            why = str(exc.args[0]) if exc.args else "the coordinator stopped listening"
        else:
            why = self._gate.refusal(got, self._kind)
        if why is None and not self._first.done():
            log.info("binding proved the token on the %s port (from %s)", self.name, peer)
            self._first.set_result(conn)
            for task in list(self._unproven):
                if task is not asyncio.current_task():
                    task.cancel("another connection proved the token first")
            return
        self._refuse(conn, peer, why or "a binding is attached already")

    def _refuse(self, conn: socket.socket, peer: object, why: str) -> None:
        self._refusals(
            source_of(peer),
            "refusing a binding connection from %s on the %s port: %s; nothing was sent to it",
            peer,
            self.name,
            why,
        )
        with contextlib.suppress(OSError):
            conn.shutdown(socket.SHUT_RDWR)
        conn.close()

    async def accept(self) -> socket.socket:
        return await self._first

    def close(self) -> None:
        for task in [*self._tasks, *self._unproven]:
            task.cancel()
        for sock in self._sockets:
            sock.close()
        self._refusals.flush()


class BindingLink:
    """The binding's two connections.

    What the binding sends is read through the shared stream
    (:class:`~ambrosia_py.serving.socket_stream.SocketStream`) as fresh bytes, which the
    intake keeps without copying: with :meth:`recv` during start-up, then by the reader
    callback that hands each read on (:meth:`read_each`), as a protocol's
    ``data_received`` would: no future, no task step and no reader added and removed per
    read. Records go out from one sender thread with a blocking ``sendmsg`` of their
    buffers: no copy into a transport buffer, order kept by the single thread, and
    sending overlaps the next append.
    """

    def __init__(self, receive: socket.socket, send: socket.socket) -> None:
        # what the binding sends us (non-blocking, event loop); we write nothing there
        self._receive = SocketStream(receive, what="the binding's connection")
        self._receive_socket = receive
        self._unread = select.poll()  # has_unread: a poll that raises nothing when empty
        self._unread.register(receive.fileno(), select.POLLIN)
        self._send = send  # where we send records (blocking, sender thread)
        self._send.setblocking(True)
        self._sender = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="send")
        self._last: asyncio.Future[None] | None = None
        self.gone = False
        self._ahead: asyncio.Queue[bytes] = asyncio.Queue()  # read while replay is sent
        self._reading_ahead: asyncio.Task[None] | None = None
        self._stop_ahead = False

    def read_each(
        self, on_data: Callable[[bytes], None], on_lost: Callable[[OSError], None]
    ) -> None:
        """From now on, call ``on_data`` with each read from the event loop (``b""``
        once the binding has gone), or ``on_lost`` once, when reading fails.

        Only once :meth:`recv` has returned all that was read ahead (:meth:`read_ahead`
        is done and nothing it read is left: see :attr:`read_ahead_left`).
        """
        assert not self.read_ahead_left
        self._receive.read_each(on_data, on_lost)

    @property
    def read_ahead_left(self) -> bool:
        """Whether :meth:`recv` still has bytes that were read ahead, or a read ahead in
        progress, to return."""
        reading = self._reading_ahead
        return not self._ahead.empty() or (reading is not None and not reading.done())

    def pause_reading(self) -> None:
        """Stop calling ``on_data`` until :meth:`resume_reading` (back-pressure: the
        binding's bytes wait in the socket, and TCP slows it down)."""
        self._receive.pause_reading()

    def resume_reading(self) -> None:
        self._receive.resume_reading()

    def read_ahead(self) -> None:
        """Read what the binding sends into memory until :meth:`stop_reading_ahead`.

        For recovery: the coordinator sends the replay and reads nothing yet, while the
        binding, replaying, regenerates its outputs; once they fill the socket it blocks
        sending them, stops reading the replay, and the coordinator blocks sending it: a
        deadlock (seen with a handler that forked 100,000 calls). Read ahead, the
        regenerated outputs wait here for :meth:`recv`, and are deduplicated then.
        """
        self._stop_ahead = False
        self._reading_ahead = asyncio.ensure_future(self._read_ahead())

    def stop_reading_ahead(self) -> None:
        """Back to reading only when asked (back-pressure): after its current read."""
        self._stop_ahead = True

    async def _read_ahead(self) -> None:
        while not self._stop_ahead:
            try:
                data = await self._receive.read()
            except OSError:
                data = b""  # recv reports it, reading the socket itself
            self._ahead.put_nowait(data)
            if not data:
                return

    async def recv(self) -> bytes:
        """The next bytes from the binding; ``b""`` when it has gone."""
        if not self._ahead.empty():
            return self._ahead.get_nowait()
        reading = self._reading_ahead
        if reading is not None and not reading.done():
            return await self._ahead.get()  # its read in progress: it stops after it
        return await self._receive.read()

    def has_unread(self) -> bool:
        """Whether the binding has sent bytes not read yet (a poll, never blocks; an end
        of stream or an error counts: the reader has something to see)."""
        return not self._ahead.empty() or bool(self._unread.poll(0))

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
        if self._last is not None and not self._last.done():
            views = unsent(parts, 0)  # behind the rest
        else:
            if self._last is not None and self._last.exception() is not None:
                self.gone = True
                return
            crashpoints.reach_midway("ic.forward.mid_send", self._send, parts)
            left = self._send_now(parts)
            if left is None:
                self.gone = True
                return
            if not left:
                self._last = None
                return
            views = left
        loop = asyncio.get_running_loop()
        self._last = loop.run_in_executor(self._sender, send_all, self._send, views)

    def _send_now(self, parts: list[wire.Payload]) -> deque[wire.Payload] | None:
        """Send what the socket takes of ``parts`` at once (non-blocking); return what is
        left (empty: all of it went), or None once the socket has failed."""
        sent = 0
        try:
            if len(parts) <= IOV_MAX:  # the usual case: one sendmsg takes it all
                size = nbytes(parts)
                sent = self._send.sendmsg(parts, [], socket.MSG_DONTWAIT)
                if sent == size:
                    return deque()
        except BlockingIOError:
            pass
        except OSError:
            return None
        return unsent(parts, sent)

    @property
    def flushed(self) -> bool:
        """Whether everything written has been handed to the kernel (nothing left for
        the sender thread)."""
        return self._last is None or self._last.done()

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
        """Close both connections; the reader is not told (it is the coordinator's own
        stopping, not the binding's end)."""
        if self._reading_ahead is not None:
            self._reading_ahead.cancel()
        self._receive.stop_reading()
        for sock in (self._receive_socket, self._send):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._receive.close()
        self._send.close()
        self._sender.shutdown(wait=False)


async def _unless_closed(
    accepting: Awaitable[socket.socket], first: socket.socket
) -> socket.socket:
    """The send port's connection, unless the binding closes its first one meanwhile.

    A binding killed between its two connections would otherwise leave the coordinator
    waiting for good, holding the instance's lock, so the same command could not start
    it again. The binding sends nothing before both are attached (the coordinator speaks
    first), so the first connection turning readable means it closed; a peek confirms it
    without taking a byte that belongs to the protocol.
    """
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()

    def readable() -> None:
        try:
            data = first.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        loop.remove_reader(first)
        if not data and not closed.done():
            closed.set_result(None)

    loop.add_reader(first, readable)
    accept = asyncio.ensure_future(accepting)
    waits: set[asyncio.Future[Any]] = {accept, closed}
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        loop.remove_reader(first)
    if accept.done():
        return accept.result()
    accept.cancel()
    raise BindingGoneError(
        "the binding closed its connection to the receive port before it attached to the "
        "send port (it died while starting); stopping, so it can be started again"
    )


async def connect_binding(
    host: str,
    receive_port: int,
    send_port: int,
    ready: Callable[[str], None],
    gate: TokenGate | None = None,
) -> tuple[BindingLink, list[Listener]]:
    """Listen in the released order and return the binding's two connections.

    With a ``gate`` each connection must prove the token before anything is sent on
    either: the send port, where the checkpoint goes first, opens only once the receive
    connection has proved it, and its own connection must prove it again. Once both are
    attached (or the attempt fails) the token file is removed: nobody else is admitted.
    """
    receive = Listener("receive", Socket.RECEIVE, gate)
    send = Listener("send", Socket.SEND, gate)
    try:
        await receive.listen(host, receive_port)
        auth = "none" if gate is None else "token"
        ready(f"receive_port={receive_port} send_port={send_port} binding_auth={auth}")
        first = await receive.accept()
        first.setblocking(False)
        await send.listen(host, send_port)
        second = await _unless_closed(send.accept(), first)
    except BaseException:
        receive.close()
        send.close()
        raise
    finally:
        if gate is not None:
            gate.remove()
    log.info("binding attached")
    return BindingLink(first, second), [receive, send]
