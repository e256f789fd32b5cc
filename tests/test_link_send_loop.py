"""A link's send loop outlives an unexpected error in one connection: it says so in the
log and dials again, as after a lost connection (``PeerLinks._send_loop``)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.links import peers as peer_links
from ambrosia_py.coordinator.links.peers import PeerLinks
from ambrosia_py.coordinator.links.protocol import Outbox


async def _no_room() -> None:
    raise AssertionError("not used here")


def test_an_unexpected_error_is_logged_and_the_link_dialed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(peer_links, "BACKOFF_MIN_S", 0.001)
    dialed: list[tuple[str, int]] = []

    async def main() -> None:
        async def lookup(name: str) -> tuple[str, int] | None:
            return ("127.0.0.1", 9)

        links = PeerLinks(
            "me", Intake("me"), lookup, lambda: None, _no_room, lambda: True, 1, data_dir=tmp_path
        )
        done = asyncio.get_running_loop().create_future()

        async def serve(dest: str, box: Outbox, addr: tuple[str, int]) -> None:
            dialed.append(addr)
            if len(dialed) == 1:
                raise AttributeError("a fault of ours")
            done.set_result(None)
            await asyncio.Event().wait()  # connected for good

        monkeypatch.setattr(links, "_serve_outbound", serve)
        links.intake.outboxes["peer"] = Outbox()
        task = asyncio.create_task(links._send_loop("peer"))
        await asyncio.wait_for(done, 30)
        assert not task.done()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    with caplog.at_level(logging.ERROR, logger="ambrosia_py.coordinator"):
        asyncio.run(main())
    assert dialed == [("127.0.0.1", 9)] * 2
    failures = [r for r in caplog.records if "failed unexpectedly" in r.getMessage()]
    assert len(failures) == 1 and failures[0].exc_info is not None
    assert "a fault of ours" in str(failures[0].exc_info[1])
