"""The connector's connections to a worker: what arrived before a failure is read first.

A worker may write its last frames and close at once: the released worker sends RESTART
and closes (reference), ours ERROR and closes (seed 000, *Protocol State Machine*). If
the connector is writing MESSAGEs at that moment, the worker's kernel answers them with
a reset, and the connector's next write fails with a reset or a broken pipe. asyncio's
transports (uvloop's too) end the connection on that write error: they stop reading the
socket, so the frames the kernel already holds are never read, and the
:class:`asyncio.StreamReader` is handed the error, which it raises before the data it
had buffered. A RESTART lost that way sends the connector back to the worker that had
sent it away.

:func:`open_connection` is :func:`asyncio.open_connection` with that fixed: when the
connection fails, every byte that arrived before the failure goes to the reader, then
the end of the stream; the failure itself is kept in :attr:`LinkReader.failure` for the
log. To read what the transport left unread it holds a second descriptor of the socket
(a dup) from the connect on, because the transport closes its own before it tells its
protocol; the dup is closed as soon as the connection is lost, so a close still reaches
the worker when the transport's close says it should.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from typing import Final

__all__ = ["LinkReader", "open_connection"]

_CHUNK: Final = 256 * 1024


class LinkReader(asyncio.StreamReader):
    """A stream reader that ends with an end of stream even when the connection failed;
    ``failure`` says why it ended, if it failed (None: an orderly close)."""

    failure: BaseException | None = None


def _unread(sock: socket.socket) -> Iterator[bytes]:
    """What the kernel still holds for ``sock``, up to the failure or the end."""
    sock.setblocking(False)
    while True:
        try:
            data = sock.recv(_CHUNK)
        except OSError:  # nothing more (would block), or the reset itself: the end
            return
        if not data:
            return
        yield data


class _Protocol(asyncio.StreamReaderProtocol):
    def __init__(self, reader: LinkReader) -> None:
        super().__init__(reader)
        self._link_reader = reader
        self._spare: socket.socket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        try:
            self._spare = sock.dup() if sock is not None else None
        except OSError:  # out of descriptors: the connection works, without the spare
            self._spare = None
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        spare, self._spare = self._spare, None
        if exc is not None:
            self._link_reader.failure = exc
            if spare is not None:
                for data in _unread(spare):
                    self._link_reader.feed_data(data)
        if spare is not None:
            spare.close()
        super().connection_lost(None)  # the reader returns all it has, then b""


async def open_connection(host: str, port: int) -> tuple[LinkReader, asyncio.StreamWriter]:
    """Connect to ``host:port``, as :func:`asyncio.open_connection` does (see the module)."""
    loop = asyncio.get_running_loop()
    reader = LinkReader(loop=loop)
    transport, protocol = await loop.create_connection(lambda: _Protocol(reader), host, port)
    return reader, asyncio.StreamWriter(transport, protocol, reader, loop)
