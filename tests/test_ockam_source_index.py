"""An Ockam source saves the points its worker acknowledged to the hub's index service
even when the hub is lost at the moment of a save: against a real hub immortal, SIGKILLed
(service and coordinator) right after the source connected, the point committed while
it is down must reach the index once the hub is back. The last point of a stream is
committed once; a save lost with the hub and never tried again would leave the index
behind for good, and a connector restarted from it would read again what was done.

The protocol answers no save, so a hub can also lose one silently: read off the socket
by its service, which is killed before the save is logged. A proxy in front of the real
hub plays that part: it swallows the first save and cuts the connection."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from immortals.ockam.bench import HubProcess
from immortals.ockam.codec import decode_request
from immortals.ockam.hub_client import OckamClient
from immortals.ockam.messages import SaveIndex
from immortals.ockam.routing import FrameReader, decode_message
from immortals.wallaroo.sources import OckamSource

DEADLINE = 60.0


async def saved_index(port: int) -> int | None:
    client = await OckamClient.connect("127.0.0.1", port)
    try:
        return await client.get_index("conn", "words")
    finally:
        await client.close()


async def test_a_point_whose_save_failed_is_saved_once_the_hub_is_back(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "data")
    hub.start()
    source = OckamSource("127.0.0.1", hub.port, "words", client_id="conn")
    try:
        assert await source.origin(source.name) == 0  # connected; nothing saved yet
        await asyncio.to_thread(hub.kill, "both")
        source.commit(source.name, 10)  # its save meets the dead connection
        await asyncio.to_thread(hub.start)
        deadline = time.monotonic() + DEADLINE
        while (index := await saved_index(hub.port)) != 10:
            assert time.monotonic() < deadline, f"the index holds {index}, not 10"
            await asyncio.sleep(0.05)
        assert source.reconnects > 0  # the save failed and went through a reconnect
    finally:
        await source.close()
        hub.stop()


class SwallowFirstSave:
    """A TCP proxy to the hub that forwards frames both ways, except that the first
    SaveIndex it sees is dropped and its connection cut (as by a hub service killed
    after reading it): the client's write succeeded, and nothing was saved."""

    def __init__(self, hub_port: int) -> None:
        self.hub_port = hub_port
        self.swallowed = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.hub_port)
        back = asyncio.ensure_future(self._copy(up_reader, writer))
        frames = FrameReader()
        try:
            while data := await reader.read(65536):
                for raw in frames.feed(data):
                    request = decode_request(decode_message(raw).payload)
                    if isinstance(request, SaveIndex) and self.swallowed == 0:
                        self.swallowed += 1
                        return
                    up_writer.write(len(raw).to_bytes(2, "big") + raw)
        finally:
            back.cancel()
            writer.close()
            up_writer.close()

    @staticmethod
    async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_save_the_hub_read_and_lost_is_saved_again(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "data")
    hub.start()
    proxy = SwallowFirstSave(hub.port)
    source = OckamSource("127.0.0.1", await proxy.start(), "words", client_id="conn")
    try:
        assert await source.origin(source.name) == 0
        source.commit(source.name, 10)
        deadline = time.monotonic() + DEADLINE
        while (index := await saved_index(hub.port)) != 10:
            assert time.monotonic() < deadline, f"the index holds {index}, not 10"
            await asyncio.sleep(0.05)
        assert proxy.swallowed == 1  # the first save was lost on its way
    finally:
        await source.close()
        proxy.close()
        hub.stop()
