"""One replication connection on the event loop: the sans-IO end of
:mod:`.transport_auth` over the shared transport stream
(:mod:`ambrosia_py.serving.transport_stream`), which hands each read on by reference
inside ``data_received``: a dialed connection writes tagged frames and reads only the
RESPONSE and its end; an accepted one hands each message on as it is read, with no
coroutine woken per frame.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Final

from ...serving.transport_stream import TransportStream
from ..replication.errors import ReplicationProtocolError
from ..replication.messages import Message
from .transport_auth import Accepting, Dialing

__all__ = ["Accepted", "Dialed"]

# Batches whose buffers average less than this are joined into one, as the links do: one
# copy of small buffers costs less than handing each to the socket on its own.
_JOIN_BELOW: Final = 4096


class _Connection:
    """What a dialed and an accepted connection share: the stream, the sans-IO end, what
    ended the connection (``error``), and two moments to wait for: ``proved`` (the
    handshake done, or the end first) and ``ended``."""

    peer = "peer"  # what the other side is called, in the line that says it closed

    def __init__(self, stream: TransportStream, end: Dialing | Accepting) -> None:
        self.stream = stream
        self.end = end
        self.error: BaseException | None = None
        loop = asyncio.get_running_loop()
        self.proved: asyncio.Future[None] = loop.create_future()
        self.ended: asyncio.Future[None] = loop.create_future()
        self.last_read = loop.time()
        self._loop = loop
        stream.read_each(self._received, self._finish)

    def _received(self, data: bytes) -> None:
        if not data:
            said = "" if self.end.authenticated else " during the handshake"
            self._finish(ConnectionError(f"the {self.peer} closed the connection{said}"))
            return
        self.last_read = self._loop.time()
        was = self.end.authenticated
        try:
            messages = self.end.receive_data(data)
        except ReplicationProtocolError as exc:
            self._finish(exc)
            return
        if not was:
            self.stream.write(self.end.data_to_send())
            if self.end.authenticated:
                self._authenticated()
                _resolve(self.proved)
        if messages and self.error is None:
            self._deliver(messages)

    def _authenticated(self) -> None:
        """The peer proved itself (called before any of its messages is handed on)."""

    def _deliver(self, messages: list[Message]) -> None:
        """Messages the peer sent, in order."""

    def _finish(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        _resolve(self.proved)
        _resolve(self.ended)
        self.stream.close()

    @property
    def open(self) -> bool:
        return self.error is None and self.end.authenticated and not self.stream.closing

    def close(self, why: str) -> None:
        self._finish(ConnectionError(why))


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class Dialed(_Connection):
    """One connection this replica dialed: the handshake, then frames written. Nothing
    is read on it but the RESPONSE and the end. ``on_end`` runs once it ends."""

    peer = "acceptor"

    def __init__(self, stream: TransportStream, end: Dialing, on_end: Callable[[], None]) -> None:
        super().__init__(stream, end)
        self._dialing = end
        self._on_end = on_end

    def _finish(self, exc: BaseException) -> None:
        super()._finish(exc)
        self._on_end()

    def start(self) -> None:
        """Send the CHALLENGE."""
        self.stream.write(self._dialing.start())

    def write(self, frames: list[bytes]) -> None:
        """Each frame, then its tag: one write."""
        parts: list[bytes] = []
        for frame in frames:
            parts += (frame, self._dialing.seal(frame))
        if self.stream.direct and sum(map(len, parts)) >= len(parts) * _JOIN_BELOW:
            self.stream.write_unjoined(parts)  # large frames: straight to the socket
        else:
            self.stream.writelines(parts)


class Accepted(_Connection):
    """One connection another replica dialed: the handshake, then its frames, each
    handed on as it is read (inside the transport's ``data_received``): to
    ``authenticated`` once the peer proved itself, then to ``deliver``."""

    def __init__(
        self,
        stream: TransportStream,
        end: Accepting,
        authenticated: Callable[[Accepted], None],
        deliver: Callable[[Accepted, list[Message]], None],
    ) -> None:
        self._on_authenticated = authenticated
        self._on_deliver = deliver
        super().__init__(stream, end)

    def _authenticated(self) -> None:
        self._on_authenticated(self)

    def _deliver(self, messages: list[Message]) -> None:
        self._on_deliver(self, messages)
