"""The Ockam client reports a connection the hub dropped as a ConnectionError even before
its reader has seen the drop: callers retry on connection errors (the Wallaroo
``ockam://`` source does), and uvloop raises RuntimeError for a write to a transport it
has closed."""

from __future__ import annotations

import asyncio

import pytest

from ambrosia_py import eventloop
from immortals.ockam.hub_connection import HubError, OckamClient

DEADLINE = 30.0


def test_requests_after_the_hub_dropped_the_connection_are_connection_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, "uvloop")

    async def main() -> int:
        accepted: list[asyncio.StreamWriter] = []

        async def hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(writer)

        server = await asyncio.start_server(hub, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        # The client reads a stream that is never fed: its reader does not see the drop,
        # as when the drop lands between a request and the reader's next turn.
        client = OckamClient(asyncio.StreamReader(), writer)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        try:
            while not accepted:
                assert loop.time() < deadline, "never accepted"
                await asyncio.sleep(0.001)  # polling a condition, bounded by the deadline
            accepted[0].transport.abort()  # the hub goes: its reset closes our transport
            tries = 0
            while True:  # unanswered requests until the transport notices the reset
                assert loop.time() < deadline, "no ConnectionError"
                tries += 1
                try:
                    await client.create("events", timeout=0.01)
                except ConnectionError:
                    return tries
                except (TimeoutError, HubError):
                    continue
        finally:
            await client.close()
            server.close()

    assert eventloop.run(main()) >= 1
