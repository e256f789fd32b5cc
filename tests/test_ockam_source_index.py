"""An Ockam source saves the points its worker acknowledged to the hub's index service
even when the hub is lost at the moment of a save: against a real hub immortal, SIGKILLed
(service and coordinator) right after the source connected, the point committed while
it is down must reach the index once the hub is back. The last point of a stream is
committed once; a save lost with the hub and never tried again would leave the index
behind for good, and a connector restarted from it would read again what was done."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from immortals.ockam.bench import HubProcess
from immortals.ockam.hub_client import OckamClient
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
