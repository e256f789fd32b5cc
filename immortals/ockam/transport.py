"""The hub's TCP transport: the asyncio edge, outside the determinism boundary.

Each connection is read with the sans-IO :class:`~immortals.ockam.routing.FrameReader`
(u16 big-endian length prefixes). All frames that one read yields go to the immortal as
one impulse, with the peer's ``host:port`` and the wall-clock time of arrival: the
coordinator logs them before any handler sees them, so the time is logged input too.
Replies come back as effects of this incarnation: the hub frames all replies to one
read (every reply's first hop is the connection the frames came in on, which the TCP
hop put there) and :meth:`HubTransport.write` writes them with one call, since a system
call per reply would cost more than handling its frame. :meth:`HubTransport.send`
routes single TransportMessages by their first hop. A reply for a connection that has
gone is dropped (the client retries). Connections belong to one incarnation; after a
crash clients reconnect.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from .errors import OckamError
from .routing import Address, AddressType, FrameReader, TransportMessage, encode_message, frame, hop

__all__ = ["HubTransport", "parse_host_port"]

log = logging.getLogger("immortals.ockam.transport")
_READ_SIZE = 256 * 1024

Deliver = Callable[[str, int, list[bytes]], None]


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as a pair; a clear ValueError otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class HubTransport:
    """Accepts Ockam TCP connections and hands their frames to ``deliver``."""

    def __init__(self, deliver: Deliver) -> None:
        self._deliver = deliver
        self._connections: dict[bytes, asyncio.StreamWriter] = {}
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        host, port = writer.get_extra_info("peername")[:2]
        peer = f"{host}:{port}"
        me = Address(AddressType.TCP, peer.encode())
        self._connections[me.value] = writer
        frames = FrameReader()
        try:
            while data := await reader.read(_READ_SIZE):
                try:
                    received = frames.feed(data)
                except OckamError as exc:
                    log.warning("closing %s: %s", peer, exc)
                    return
                if received:
                    self._deliver(peer, int(time.time() * 1000), received)
        except ConnectionError as exc:
            log.info("connection %s lost: %s", peer, exc)
        finally:
            self._connections.pop(me.value, None)
            writer.close()

    def write(self, connection: bytes, wire: bytes) -> None:
        """Write framed replies to the connection named ``connection`` (an effect).

        One write for all the replies to one read: a system call per reply would cost
        more than handling the frame did.
        """
        writer = self._connections.get(connection)
        if writer is None:
            log.info("replies dropped: connection %s has gone", connection.decode(errors="replace"))
            return
        writer.write(wire)

    def send(self, replies: list[TransportMessage]) -> None:
        """Write replies to the connections their first hop names (an effect)."""
        for reply in replies:
            first = reply.onward_route[0] if reply.onward_route else None
            writer = self._connections.get(first.value) if first is not None else None
            if first is None or first.type != AddressType.TCP or writer is None:
                log.info("reply dropped: no connection for %r", first)
                continue
            try:
                writer.write(frame(encode_message(hop(reply, first))))
            except OckamError as exc:
                log.warning("reply to %s not sent: %s", first.value.decode(errors="replace"), exc)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in list(self._connections.values()):
            writer.close()
