"""The connector's edge dials the address the core names and, when it does not answer,
the others the core gives (the two workers of a migration that did not finish, seed
001, *Notes*), reporting which one answered. Real sockets on loopback."""

from __future__ import annotations

import asyncio
import socket

from ambrosia_py.testing import free_port
from immortals.wallaroo import Dialect
from immortals.wallaroo.connector_actions import Actions, ConnectorConfig, Dial
from immortals.wallaroo.connector_transport import ConnectorEdge
from immortals.wallaroo.sources import open_source


class Reports:
    """A sink (the connector's impulses) that keeps the edge's ``connected`` reports."""

    def __init__(self) -> None:
        self.dials: asyncio.Queue[tuple[int, str, str]] = asyncio.Queue()

    def connected(self, dial: int, conn: str, address: str) -> None:
        self.dials.put_nowait((dial, conn, address))

    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None:
        pass

    def too_large(self, conn: str, offset: int, size: int) -> None:
        pass

    def closed(self, conn: str) -> None:
        pass

    def halted(self, conn: str, stream_id: int, generation: int, point: int, end: bool) -> None:
        pass

    def failed(self, conn: str, stream_id: int, generation: int, reason: str) -> None:
        pass

    def retry(self, conn: str, stream_id: int) -> None:
        pass


def closed_port() -> int:
    """A port nothing listens on (bound, then closed: refused at once)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = int(s.getsockname()[1])
    s.close()
    return port


async def dial_both(first: str, second: str) -> tuple[int, str, str]:
    accepted = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.set()
        await reader.read()  # until the edge goes
        writer.close()

    port = int(second.rsplit(":", 1)[1])
    server = await asyncio.start_server(serve, "127.0.0.1", port)
    reports = Reports()
    config = ConnectorConfig(first, ("gen://1",), cookie=b"c", dialect=Dialect.DRAFT)
    edge = ConnectorEdge(reports, "i1", config, open_source("gen://1", "c"), backoff_max=0.05)
    edge.apply(Actions((Dial(7, first, 0, (second,)),)))
    try:
        async with asyncio.timeout(30):
            got = await reports.dials.get()
            await accepted.wait()
        return got
    finally:
        await edge.close()
        server.close()
        await server.wait_closed()


def test_a_dial_whose_address_refuses_reaches_the_other() -> None:
    first, second = f"127.0.0.1:{closed_port()}", f"127.0.0.1:{free_port()}"
    dial, conn, address = asyncio.run(dial_both(first, second))
    assert (dial, address) == (7, second) and conn.startswith("i1.")
