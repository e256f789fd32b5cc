"""Accepting connections so that every one counts from the moment it is accepted, TLS
handshake included.

``loop.create_server(ssl=...)`` runs a connection's TLS handshake before the server's
code sees it, so a connection held in that phase is in no :class:`Admission` table: a
thousand of them cost a coordinator about 50 MB and as many descriptors, up to its
open-file limit, until the handshake timeout drops each. Nor can the upgrade wait for
the server's code: ``start_tls`` on a stream accepted in clear loses the client's first
TLS bytes on uvloop, which starts reading a transport as soon as ``connection_made``
returns, before any task can hand the transport to TLS.

So a :class:`Listener` accepts the sockets itself and gives each, as an
:class:`Incoming`, to its server at once, before a byte of it is read; the server admits
it (or refuses it) there and then, in the order connections come. Only then does
:meth:`Incoming.connect` hand the socket to the loop
(``loop.connect_accepted_socket``, with TLS if the server has it, once the peer has
sent its first bytes), whose protocol sees the connection as ``create_server`` would
have shown it. :meth:`Incoming.drop` closes a connection at once in whatever phase it
is: not yet handed over, in its TLS handshake (the task awaiting it is cancelled, and
the loop closes the socket), or connected.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from .admission import source_of
from .output import _LINGER_NONE

__all__ = ["Incoming", "Listener"]

_P = TypeVar("_P", bound=asyncio.BaseProtocol)

# Connections the kernel may queue for accept. A flood keeps its sockets there while
# they wait their turn (no descriptor of ours); a short queue made the kernel drop new
# connections, an honest one's too, which its kernel then tried again only a second
# later (asyncio's servers queue 100).
BACKLOG = 1024
# Connections accepted per turn of the loop. One: a pending connection is evicted once
# enough newer ones are admitted (serving.Admission), so newcomers must come no faster
# than the turns in which an honest peer's handshake moves on. Measured with a flood from
# the honest peer's own address (32 pending there at most): accepting 8 a turn, the peer
# needed hundreds of tries and seconds; 1 or 4, one try (tests/test_flood_admission.py).
# A connection evicted in its TLS handshake is closed two turns later (its task's
# cancellation closes the loop's TLS transport, whose socket goes on the next turn), so
# a server's open sockets can briefly be two batches past its cap.
ACCEPT_BATCH = 1
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RETRY_S = 1.0  # after running out of descriptors, as asyncio's servers wait


class Incoming:
    """One accepted connection, from accept on: its socket and peer, and how to close it
    at once whatever phase it is in."""

    def __init__(self, sock: socket.socket, peer: object, accepted_at: float) -> None:
        self.sock = sock
        self.peer = peer
        self.source = source_of(peer)  # the address the admission table counts under
        self.address = (
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        )
        self.accepted_at = accepted_at  # the loop's clock
        self.transport: asyncio.Transport | None = None  # once connected
        self._task: asyncio.Task[None] | None = None
        self._handed = False  # the loop owns the socket: only it may close it
        self._watched = False  # a reader waits for its first bytes (see connect)

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run the connection's ``work`` (which calls :meth:`connect`) as its task, the
        task :meth:`drop` cancels."""
        self._task = asyncio.get_running_loop().create_task(work)
        self._task.add_done_callback(self._ended)
        return self._task

    async def connect(
        self, factory: Callable[[], _P], tls: ssl.SSLContext | None, timeout_s: float
    ) -> tuple[asyncio.Transport, _P]:
        """Hand the socket to the loop, with ``factory``'s protocol on it: once connected
        in clear, or, with ``tls``, once its TLS handshake is done. TimeoutError if that
        takes past ``timeout_s`` from accept; ``ssl.SSLError`` if TLS refuses the peer.

        In TLS the socket goes to the loop only once the peer has sent something (its
        ClientHello, at once for an honest one): a connection that sends nothing then
        costs a socket and a reader, not the loop's TLS state (on asyncio's loop a
        256 KiB buffer), made and dropped for every connection of a flood. Measured
        under a flood of 300 such connections: the service grew by 15 MB on uvloop
        without this, by under 1 MB with it."""
        loop = asyncio.get_running_loop()
        made: list[_P] = []

        def make() -> _P:  # uvloop returns its TLS protocol in TLS, not the one made
            made.append(factory())
            return made[0]

        async with asyncio.timeout_at(self.accepted_at + timeout_s):
            if tls is not None:
                await self._first_bytes()
            self._handed = True
            transport, _ = await loop.connect_accepted_socket(
                make,
                self.sock,
                ssl=tls,
                ssl_handshake_timeout=timeout_s if tls is not None else None,
            )
        self.transport = transport
        return transport, made[0]

    async def _first_bytes(self) -> None:
        """Return once the socket is readable (the bytes stay there, for TLS)."""
        loop = asyncio.get_running_loop()
        readable = loop.create_future()

        def ready() -> None:
            if not readable.done():
                readable.set_result(None)

        loop.add_reader(self.sock, ready)
        self._watched = True
        try:
            await readable
        finally:
            self._unwatch()

    def _unwatch(self) -> None:
        """No reader on the socket any more: before it is closed (the loop must not
        watch a descriptor number that a new connection may be given) or handed over."""
        if self._watched:
            self._watched = False
            asyncio.get_running_loop().remove_reader(self.sock)

    def drop(self, *, reset: bool = True) -> None:
        """Close the connection now and cancel its task: with a reset rather than a FIN
        (see :func:`~.output.reset`), unless ``reset`` is false."""
        if reset:
            with contextlib.suppress(OSError):  # closed already (by the loop: fd -1)
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
        if self.transport is not None:
            if reset:
                self.transport.abort()
            else:
                self.transport.close()
        elif not self._handed:
            self._unwatch()
            self.sock.close()
        # In the TLS handshake, the loop's own transport holds the socket: cancelling
        # the task that awaits connect() makes the loop close it.
        if self._task is not None:
            self._task.cancel()

    def _ended(self, _: asyncio.Task[None]) -> None:
        if not self._handed:  # it never reached the loop: the socket is still ours
            self._unwatch()
            self.sock.close()
        # The task's exception holds its frames, which hold this: without the task, the
        # TLS state of a connection evicted in its handshake (256 KiB of buffer on
        # asyncio's loop) goes at once, not at the next cyclic collection.
        self._task = None


class Listener:
    """Listening sockets whose connections are accepted here and handed, each as an
    :class:`Incoming`, to ``accepted`` at once (see the module)."""

    def __init__(
        self,
        sockets: list[socket.socket],
        accepted: Callable[[Incoming], None],
        log: logging.Logger,
    ) -> None:
        self.sockets = sockets
        self._accepted = accepted
        self._log = log
        self._loop = asyncio.get_running_loop()
        self._serving = False
        self._retry: asyncio.TimerHandle | None = None

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        accepted: Callable[[Incoming], None],
        log: logging.Logger,
        *,
        start: bool = True,
    ) -> Listener:
        """Listen on every address ``host`` names (``""``: all interfaces), as
        ``loop.create_server`` does; accept from now on, or once :meth:`start` is called.
        OSError if an address cannot be bound."""
        infos = await asyncio.get_running_loop().getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        sockets: list[socket.socket] = []
        try:
            for family, _, _, _, address in dict.fromkeys(infos):
                sock = socket.create_server(address, family=family, backlog=BACKLOG)
                sockets.append(sock)
                sock.setblocking(False)
        except BaseException:
            for sock in sockets:
                sock.close()
            raise
        listener = cls(sockets, accepted, log)
        if start:
            listener.start()
        return listener

    @property
    def address(self) -> tuple[str, int]:
        """The first socket's (host, port)."""
        host, port = self.sockets[0].getsockname()[:2]
        return str(host), int(port)

    def start(self) -> None:
        """Accept connections (again)."""
        if self._serving or not self.sockets:
            return
        self._serving = True
        for sock in self.sockets:
            self._loop.add_reader(sock, self._accept, sock)

    def close(self) -> None:
        """Stop listening; connections accepted already are their servers' to close."""
        self._pause()
        for sock in self.sockets:
            sock.close()
        self.sockets = []

    def _pause(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self._serving:
            self._serving = False
            for sock in self.sockets:
                self._loop.remove_reader(sock)

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, peer = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    continue  # that connection is gone already (ECONNABORTED, ...)
                # Out of descriptors: what is open must close first. Said once per pause.
                self._log.warning(
                    "cannot accept connections on %s:%d: %s; trying again in %g s",
                    *self.address,
                    exc.strerror,
                    _RETRY_S,
                )
                self._pause()
                self._retry = self._loop.call_later(_RETRY_S, self.start)
                return
            sock.setblocking(False)
            # As the loops' own servers do. asyncio's transport sets it only on a socket
            # whose proto field says TCP, which one accepted here does not: TLS records
            # then waited for delayed ACKs, 40 ms a call.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._accepted(Incoming(sock, peer, self._loop.time()))
