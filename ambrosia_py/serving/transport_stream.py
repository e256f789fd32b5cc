"""A :class:`~.stream.Stream` over an asyncio transport: an :class:`asyncio.Protocol`,
not asyncio's streams, so that each chunk the transport reads goes on by reference
inside ``data_received``, for connections that need the transport itself (TLS).

Writes go to the transport, which copies what the socket does not take at once into its
buffer. :meth:`TransportStream.write_unjoined` spares large frames most of that: on
plain TCP, while the transport holds nothing, their buffers go straight to the socket.
"""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Self, cast

from ..iov import IOV_MAX, advance
from ..wire import Payload
from .stream import Stream

__all__ = ["TransportStream"]


def _raw_fd(transport: asyncio.Transport) -> int | None:
    """The descriptor of a plain TCP transport's socket; None over TLS (what is written
    is encrypted first: only the transport may write to its socket) or without one."""
    if not hasattr(os, "writev") or transport.get_extra_info("sslcontext") is not None:
        return None
    sock = transport.get_extra_info("socket")
    return None if sock is None else int(sock.fileno())


class TransportStream(Stream[Exception], asyncio.Protocol):
    """The protocol of one transport, as a stream.

    ``on_made`` runs once connected, and registers the stream's reader there
    (:meth:`read_each`), or closes the transport: the transport reads from the moment
    it returns (uvloop starts reading then, whatever was paused before). Drain waits on
    the transport's own marks (``pause_writing`` / ``resume_writing``); once the
    connection is lost, closed by either end, it raises.
    """

    transport: asyncio.Transport  # once connected

    def __init__(self, on_made: Callable[[Self], None], what: str = "the connection") -> None:
        super().__init__(what)
        self._on_made = on_made
        self._lost = False  # connection_lost was called
        self._writable = True  # the transport is below its high-water mark
        self._fd: int | None = None  # write_unjoined's socket, on plain TCP

    # -- the transport's calls ----------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's are not asyncio.Transport subclasses: no isinstance).
        self.transport = cast(asyncio.Transport, transport)
        self._fd = _raw_fd(self.transport)
        self._on_made(cast(Self, self))  # mypy types self as this class, not Self
        assert self._on_data is not None or transport.is_closing(), "on_made reads or closes"

    def data_received(self, data: bytes) -> None:
        on_data = self._on_data
        if on_data is not None:
            on_data(data)

    def eof_received(self) -> bool:
        self._end_reads()
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self._gone = exc or ConnectionResetError("it was closed")
        if exc is None:
            self._end_reads()
        else:  # a reset, a TLS alert or a bad record
            self._fail_reads(exc)
        self._wake_drainers()

    def pause_writing(self) -> None:
        self._writable = False

    def resume_writing(self) -> None:
        self._writable = True
        self._wake_drainers()

    # -- reading -----------------------------------------------------------------------

    def _watch(self) -> None:
        if not self._lost:
            self.transport.resume_reading()

    def _unwatch(self) -> None:
        if not self._lost:
            self.transport.pause_reading()

    # -- writing -----------------------------------------------------------------------

    def write(self, data: Payload) -> None:
        if not self.closing:
            self.transport.write(data)

    def writelines(self, parts: Iterable[Payload]) -> None:
        """The transport's ``writelines`` (asyncio's selector transport joins the
        buffers: one copy of small parts costs less than a write of each)."""
        if not self.closing:
            self.transport.writelines(parts)

    def write_unjoined(self, parts: Sequence[Payload]) -> None:
        """Write ``parts`` without joining them.

        While the transport holds nothing, they go straight to the socket (``writev``),
        and only what it does not take is handed to the transport, buffer by buffer (a
        view of the one cut in two): one copy into its buffer, where ``writelines``
        would join them first (asyncio's selector transport does) and copy that again.
        With bytes already waiting there, everything goes behind them, to keep the
        order. Over TLS (:attr:`direct` false) every buffer goes to the transport.
        """
        if self.closing:
            return
        transport = self.transport
        queue: collections.deque[Payload] = collections.deque(parts)
        if self._fd is not None and not transport.get_write_buffer_size():
            try:
                sent = os.writev(self._fd, parts if len(parts) <= IOV_MAX else parts[:IOV_MAX])
            except OSError:  # full (EAGAIN), or broken: the transport finds out on its write
                sent = 0
            advance(queue, sent)
        for buf in queue:
            transport.write(buf)

    @property
    def direct(self) -> bool:
        """Whether :meth:`write_unjoined` may write to the socket itself (plain TCP)."""
        return self._fd is not None

    @property
    def queued(self) -> int:
        if self.closing:  # a lost TLS transport cannot even say (it raises)
            return 0
        return self.transport.get_write_buffer_size()

    @property
    def closing(self) -> bool:
        return self._lost or self.transport.is_closing()

    @property
    def _full(self) -> bool:
        return not self._writable

    # -- closing -----------------------------------------------------------------------

    def close(self) -> None:
        """Close the transport once (a TLS transport closed twice drops its state); the
        end reaches the reader when the transport reports the connection lost."""
        if not self.transport.is_closing():
            self.transport.close()
