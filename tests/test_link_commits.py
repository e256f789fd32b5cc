"""Commits to link senders (``PeerLinks.durable``): the ones due within
``COMMIT_DELAY_S`` go as one per sender, up to where its messages are durable when they
go, after the commit pipeline has forwarded the records (never from inside it)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.links import peers as peer_links
from ambrosia_py.coordinator.links.peers import PeerLinks

DEADLINE = 30


async def _commits_sent(links: PeerLinks) -> None:
    """Until the Commits due have gone: the timer ``durable`` set has fired (``_commit``
    clears it, and writes to every connection due in that one callback)."""
    async with asyncio.timeout(DEADLINE):
        while links._commit_timer is not None:
            await asyncio.sleep(0.005)  # polling the timer, bounded by the deadline


class FakeConn:
    """What ``_commit`` uses of a LinkConn: whether it is closing, what it queues, write."""

    def __init__(self, *, closing: bool = False, queued: int = 0) -> None:
        self.closing = closing
        self.queued = queued
        self.written: list[Any] = []

    def close(self) -> None:
        self.closing = True

    def write(self, payload: bytes) -> None:
        msg, _ = wire.decode_message(payload, 0, wire.Direction.TO_BINDING)
        self.written.append(msg)


async def _never() -> None:
    raise AssertionError("not used here")


def _links(tmp_path: Path) -> PeerLinks:
    intake = Intake("me")

    async def lookup(name: str) -> tuple[str, int] | None:
        return None

    return PeerLinks("me", intake, lookup, lambda: None, _never, lambda: True, 1, data_dir=tmp_path)


def test_commits_due_together_go_as_one_per_sender_with_the_latest_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_links, "COMMIT_DELAY_S", 0.05)

    async def main() -> None:
        links = _links(tmp_path)
        a, b, full, gone = FakeConn(), FakeConn(), FakeConn(queued=1 << 20), FakeConn(closing=True)
        links._inbound.update({"a": a, "b": b, "full": full, "gone": gone})  # type: ignore[dict-item]
        inbox = links.intake.inbox
        for marks in ({"a": 3}, {"a": 5, "b": 1}, {"full": 2, "gone": 4}, {"a": 9}):
            inbox.made_durable(marks)
            links.durable(marks)
        assert a.written == b.written == []  # nothing from inside the commit pipeline
        await _commits_sent(links)
        assert a.written == [wire.Commit(9, 9)]
        assert b.written == [wire.Commit(1, 1)]
        assert full.written == gone.written == []  # reads none of them, or closing
        # The next due Commits start a new delay; a sender with no connection is skipped.
        inbox.made_durable({"b": 2, "nobody": 7})
        links.durable({"b": 2, "nobody": 7})
        await _commits_sent(links)
        assert b.written == [wire.Commit(1, 1), wire.Commit(2, 2)]
        assert a.written == [wire.Commit(9, 9)]
        # Closing cancels Commits still waiting.
        inbox.made_durable({"a": 10})
        links.durable({"a": 10})
        await links.close()
        a.closing = False  # as if still open: only the cancelled timer keeps it quiet
        # Its chance to go: a timer set now for the same delay fires no earlier than the
        # cancelled one was due, and the loop runs both (were it live) before this resumes.
        went = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(peer_links.COMMIT_DELAY_S, went.set_result, None)
        await asyncio.wait_for(went, DEADLINE)
        assert a.written == [wire.Commit(9, 9)]

    asyncio.run(main())
