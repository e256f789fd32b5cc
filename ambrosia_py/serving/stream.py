"""One connection's bytes on the event loop, moved without copies: the one stream
interface the project's busiest connections are written against (the binding's two
sockets to its coordinator, the coordinator's side of them, a link between two
coordinators), as httpcore's connections are written against its one network stream.

asyncio's streams copy every payload: ``StreamReader`` copies each received chunk into
its buffer and out of it again, and wakes the reading task for every read. A
:class:`Stream` instead holds, once, what those connections need:

* reading: each received chunk is handed on by reference (a fresh ``bytes``, which the
  wire and flow readers keep without copying) to the callback :meth:`~Stream.read_each`
  registered, from the loop's own callback: no task woken, no future, per read;
* back-pressure both ways: :meth:`~Stream.pause_reading` leaves what the peer sends in
  the socket, where TCP holds the peer back; :meth:`~Stream.drain` waits while more than
  the high-water mark waits to be sent;
* the end, said once: ``b""`` to the reader at the end of the stream or on
  :meth:`~Stream.close`, the error that ended the connection to its error callback,
  and a connection lost makes :meth:`~Stream.drain` raise.

Two backends give it the bytes: :class:`~.socket_stream.SocketStream`, a raw
non-blocking socket on the loop (the binding's sockets: no transport buffer to copy
writes into), and :class:`~.transport_stream.TransportStream`, an
:class:`asyncio.Protocol` over a transport (the links, which may run over TLS).
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from ..wire import Payload

__all__ = ["Stream"]

_E = TypeVar("_E", bound=Exception)


class Stream(abc.ABC, Generic[_E]):
    """One connection's reading, writing, back-pressure and end (see the module).

    ``what`` names the connection in the error :meth:`drain` raises once it is lost.
    One reader at a time; writes may come from anywhere on the loop and keep their
    order. ``_E``: what a failed connection hands to the error callback.
    """

    def __init__(self, what: str) -> None:
        self.what = what
        self._loop = asyncio.get_running_loop()
        # read_each's callbacks: each read's bytes (b"" at the end), the error that ended
        # the connection
        self._on_data: Callable[[bytes], None] | None = None
        self._on_error: Callable[[_E], None] | None = None
        self._paused = False  # pause_reading() was called, resume_reading() not yet
        self._ended = False  # the end was said (b"" or an error): no more reads
        self._gone: BaseException | None = None  # why writes go nowhere: drain raises it
        self._drainers: list[asyncio.Future[None]] = []

    # -- reading -----------------------------------------------------------------------

    def read_each(self, on_data: Callable[[bytes], None], on_error: Callable[[_E], None]) -> None:
        """Hand each read to ``on_data`` as it arrives, in the loop's callback; ``b""``
        once, at the end of the stream or on :meth:`close` (at once if that came
        already). The error that ends the connection goes to ``on_error`` instead, once
        (over a transport, even after ``b""``: one can fail closing after its peer's
        end), and nothing after it. Reading starts here, unless paused."""
        assert self._on_data is None, "one reader at a time"
        self._on_data, self._on_error = on_data, on_error
        if self._ended:
            self._end_reads()
        elif not self._paused:
            self._watch()

    def stop_reading(self) -> None:
        """No more reads for :meth:`read_each`'s callbacks, and no end said to them: the
        reader is done with the stream (it closes the stream without being told)."""
        self._on_data = self._on_error = None
        self._unwatch()

    def pause_reading(self) -> None:
        """Read nothing until :meth:`resume_reading` (back-pressure: the peer's bytes
        wait in the socket, and TCP slows the peer down)."""
        self._paused = True
        self._unwatch()

    def resume_reading(self) -> None:
        self._paused = False
        if self._on_data is not None and not self._ended:
            self._watch()

    @abc.abstractmethod
    def _watch(self) -> None:
        """The backend reads, and hands what it reads to ``_on_data``."""

    @abc.abstractmethod
    def _unwatch(self) -> None:
        """The backend reads nothing for now."""

    def _end_reads(self) -> None:
        """The end of the stream: ``b""`` to the reader, once. The backend has stopped
        reading (or its transport is closing)."""
        self._ended = True
        on_data, self._on_data = self._on_data, None
        if on_data is not None:
            on_data(b"")

    def _fail_reads(self, exc: _E) -> None:
        """The connection failed: ``exc`` to the reader, once, and nothing after it."""
        self._ended = True
        on_error = self._on_error
        self._on_data = self._on_error = None
        if on_error is not None:
            on_error(exc)

    # -- writing -----------------------------------------------------------------------

    def write(self, data: Payload) -> None:
        """:meth:`writelines` of one buffer."""
        self.writelines((data,))

    @abc.abstractmethod
    def writelines(self, parts: Iterable[Payload]) -> None:
        """Send ``parts``, in order after what was written before, without waiting.
        Once the connection is lost (or closed) writes go nowhere; :meth:`drain` says
        so. Buffers handed here must not change afterwards."""

    @property
    @abc.abstractmethod
    def queued(self) -> int:
        """Bytes written but not yet taken by the socket (0 once closing)."""

    @property
    @abc.abstractmethod
    def closing(self) -> bool:
        """Whether the connection is closed or lost: writes would go nowhere."""

    @property
    @abc.abstractmethod
    def _full(self) -> bool:
        """Whether more than the high-water mark waits to be sent."""

    @property
    def behind(self) -> bool:
        """Whether :meth:`drain` would not return at once: more than the high-water mark
        waits to be sent, or the connection is lost (drain raises that)."""
        return self._full or self._gone is not None

    async def drain(self) -> None:
        """Wait while more than the high-water mark waits to be sent (the back-pressure),
        until the backend has sent enough (:meth:`_wake_drainers`).

        Raises ``ConnectionResetError`` once the connection is lost.
        """
        if self._full and self._gone is None:
            waiter = self._loop.create_future()
            self._drainers.append(waiter)
            await waiter
        if self._gone is not None:
            raise ConnectionResetError(f"{self.what} is lost ({self._gone})") from self._gone

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for waiter in drainers:
            if not waiter.done():
                waiter.set_result(None)

    # -- closing -----------------------------------------------------------------------

    @abc.abstractmethod
    def close(self) -> None:
        """Close the connection (again: nothing). The reader gets ``b""`` unless it was
        told the end already: at once over a socket, when the transport reports the
        connection lost over a transport. A drain waiting returns over a socket (our own
        close is no loss) and raises over a transport (a closed link is a lost one)."""
