"""The committer: every record reaches the log through one entry point, and nothing is
forwarded, or confirmed to a link sender, before it is durable.

Driven without sockets: a real log in a temporary directory, the intake fed bytes laid
out from seed 002 (``tests.fake_binding``), and stand-ins for the binding's socket, the
forwarder, the links and the registry that note what reached them. What the log holds
is read back with the recovery scanner, independently of the code that wrote it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.core.committer import Committer
from ambrosia_py.coordinator.core.config import CoordinatorConfig
from ambrosia_py.coordinator.core.events import CheckpointArrived
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.storage.files import InstanceFiles, StorageError
from tests.fake_binding import checkpoint, incoming_fork, self_fork

_COMMITTER_ID = 77


class _Binding:
    """The binding's socket as the committer sees it: nothing unread."""

    def has_unread(self) -> bool:
        return False


class _Forwarder:
    def __init__(self, log_path: Path) -> None:
        self.records: list[tuple[int, bytes]] = []  # (seq, body) in the order put
        self.log_path = log_path
        self.durable_then: list[bool] = []  # per record: was it in the log when put

    def put(self, parts: list[Any], place: Any = None) -> None:
        record = b"".join(bytes(p) for p in parts)
        header = wire.parse_header(record)
        self.records.append((header.seq, record[24:]))
        # Written where the place says (the file is preallocated: its length says nothing).
        disk = self.log_path.read_bytes()[place.offset : place.offset + place.size]
        self.durable_then.append(disk[16:24] == record[16:24] and disk[24:].startswith(record[24:]))

    def control(self, committer_id: int, msg: object) -> None:
        self.records.append((-1, b""))

    async def flush(self) -> None:
        pass


class _Links:
    def __init__(self) -> None:
        self.durable_marks: list[dict[str, int]] = []

    def durable(self, marks: dict[str, int]) -> None:
        self.durable_marks.append(dict(marks))


class _Registry:
    def __init__(self) -> None:
        self.committed: list[int] = []

    def commit_checkpoint(self, instance: str, version: int, n: int, log: int) -> None:
        self.committed.append(n)


def _committer(tmp_path: Path, **config: Any) -> tuple[Committer, _Forwarder, _Registry]:
    files = InstanceFiles(tmp_path, "me", 0)
    files.create()
    intake = Intake("me")
    intake.committer_id = _COMMITTER_ID
    registry = _Registry()
    committer = Committer(
        CoordinatorConfig(tmp_path, "me", **config),
        registry,  # type: ignore[arg-type]
        files,
        intake,
    )
    forwarder = _Forwarder(files.log_path(1))
    committer.start(_Binding(), forwarder)  # type: ignore[arg-type]
    committer.open_log(1)
    return committer, forwarder, registry


def _logged(committer: Committer) -> list[tuple[int, bytes]]:
    """(seq, body) of each record in log 1, as recovery reads it."""
    scan = committer.files.scan_log(
        1, committer_id=_COMMITTER_ID, next_seq=0, last=True, repair=False
    )
    return [(raw.header.seq, bytes(raw.body)) for raw in scan]


async def _parked(committer: Committer) -> asyncio.Task[None]:
    task = asyncio.create_task(committer.run())
    deadline = asyncio.get_running_loop().time() + 10
    while not committer._parked:
        assert asyncio.get_running_loop().time() < deadline, "the commit loop never waited"
        await asyncio.sleep(0)
    return task


def test_a_request_alone_from_a_link_is_durable_and_forwarded_before_the_read_returns(
    tmp_path: Path,
) -> None:
    call = incoming_fork(5, b"hello")

    async def main() -> Committer:
        committer, forwarder, _ = _committer(tmp_path)
        links = _Links()
        committer.links = links  # type: ignore[assignment]
        task = await _parked(committer)
        committer.intake.link_input("peer", call)
        committer.input_read()  # as the link does after each read
        # Done on return: no loop turn was needed.
        assert forwarder.records == [(0, call)] and forwarder.durable_then == [True]
        assert links.durable_marks == [{"peer": 1}]
        assert committer.intake.inbox.durable == {"peer": 1}
        committer.end_input()
        await asyncio.wait_for(task, 10)
        await committer.close()
        return committer

    assert _logged(asyncio.run(main())) == [(0, call)]


def test_the_commit_loop_logs_every_input_in_order_and_forwards_only_what_is_durable(
    tmp_path: Path,
) -> None:
    """Input larger than a record: several records, numbered from 0, each forwarded once
    it was in the log, all before the loop ends on the end of input."""
    args = [bytes([i % 251]) * 300 for i in range(40)]

    async def main() -> tuple[Committer, _Forwarder]:
        committer, forwarder, _ = _committer(tmp_path, max_record_bytes=4096)
        task = await _parked(committer)
        committer.intake.receive_data(b"".join(self_fork(9, a) for a in args))
        committer.wake()
        committer.end_input()
        await asyncio.wait_for(task, 10)
        await committer.close()
        return committer, forwarder

    committer, forwarder = asyncio.run(main())
    logged = _logged(committer)
    assert len(logged) > 1 and [seq for seq, _ in logged] == list(range(len(logged)))
    assert b"".join(body for _, body in logged) == b"".join(incoming_fork(9, a) for a in args)
    assert forwarder.records == logged and all(forwarder.durable_then)
    assert committer.intake.logged_outputs == len(args)  # each a replayable self-call


def test_a_first_start_logs_the_initial_message_alone_and_what_came_before_the_checkpoint(
    tmp_path: Path,
) -> None:
    """Record 0 is the InitialMessage alone, then the input the binding sent before its
    checkpoint; the checkpoint is committed after both are durable, and only then are
    they forwarded. Input sent after the checkpoint waits for the commit loop."""
    initial = wire.encode_message(wire.InitialMessage(b"start"))
    before, after = self_fork(1, b"before"), self_fork(1, b"after")

    async def main() -> tuple[Committer, _Forwarder, _Registry, list[Any]]:
        committer, forwarder, registry = _committer(tmp_path)
        intake = committer.intake
        intake.receive_data(initial + before + checkpoint(b"blob") + after)
        events = [intake.next_event(), intake.next_event(), intake.next_event()]
        arrived = events[1]
        assert isinstance(arrived, CheckpointArrived)
        committer.hold_forwarding()
        await committer.commit_checkpoint(1, arrived)
        seen_before_release = list(forwarder.records)
        committer.release_forwarding()
        await committer.close()
        return committer, forwarder, registry, [seen_before_release, events]

    committer, forwarder, registry, (seen, events) = asyncio.run(main())
    assert events[2] is None
    assert registry.committed == [1]
    assert seen == []
    assert _logged(committer) == [(0, initial), (1, incoming_fork(1, b"before"))]
    assert forwarder.records == _logged(committer)
    assert len(committer.intake.pending) == 1  # "after": the commit loop's, not the checkpoint's
    assert committer.files.checkpoint_numbers() == [1]


def test_the_log_rolls_past_its_trigger_and_asks_for_the_checkpoint_after_its_records(
    tmp_path: Path,
) -> None:
    async def main() -> tuple[Committer, _Forwarder]:
        # A trigger of about 1 KiB: the first record passes it.
        committer, forwarder, _ = _committer(tmp_path, log_trigger_mb=1 / 1024)
        task = await _parked(committer)
        committer.intake.receive_data(self_fork(3, b"x" * 2000))
        committer.wake()
        deadline = asyncio.get_running_loop().time() + 10
        while committer.log_number != 2:
            assert asyncio.get_running_loop().time() < deadline, "the log never rolled"
            await asyncio.sleep(0)
        committer.end_input()
        await asyncio.wait_for(task, 10)
        await committer.close()
        return committer, forwarder

    committer, forwarder = asyncio.run(main())
    assert [seq for seq, _ in forwarder.records] == [0, -1]  # TakeCheckpoint after record 0
    assert committer.files.log_numbers() == [1, 2]


def test_a_failed_write_on_the_latency_path_stops_the_commit_loop_with_it(
    tmp_path: Path,
) -> None:
    """A lone record written from a link read fails there: the read goes on, the commit
    loop raises the failure, and nothing was forwarded."""

    async def main() -> None:
        committer, forwarder, _ = _committer(tmp_path)
        task = await _parked(committer)
        assert committer.writer is not None
        committer.writer.close()  # every write now fails
        committer.intake.link_input("peer", incoming_fork(5, b"x"))
        committer.input_read()
        with pytest.raises(StorageError, match="is closed"):
            await asyncio.wait_for(task, 10)
        assert forwarder.records == []
        await committer.close()

    asyncio.run(main())


class _Replicating:
    """A replicated primary's log, every record committed at once; ``rolled`` says a
    secondary was asked (or not) and notes where."""

    def __init__(self, asks: bool) -> None:
        self.asks = asks
        self.rolls: list[int] = []

    def appended(self, seq: int, disk_parts: list[Any], log_number: int, offset: int) -> None:
        pass

    def durable(self, seq: int, action: Any) -> None:
        if action is not None:
            action()

    def forward(self, action: Any) -> None:
        action()

    def control(self, action: Any) -> None:
        action()

    def rolled(self, seq: int) -> bool:
        self.rolls.append(seq)
        return self.asks


def test_a_replicated_primary_rolls_without_its_binding_and_keeps_a_good_taken_checkpoint(
    tmp_path: Path,
) -> None:
    """Past the trigger the log rolls and a secondary is asked, not the binding (no
    TakeCheckpoint is forwarded). Of what comes back, bytes that are no checkpoint, and
    one of another seq, are not kept; the right one becomes checkpoint 2, with the link
    senders this primary knows added, and is recorded."""
    from ambrosia_py.coordinator.core.checkpoint import IcState

    async def main() -> tuple[Committer, _Forwarder, _Registry, list[int]]:
        committer, forwarder, registry = _committer(tmp_path, log_trigger_mb=1 / 1024)
        replicating = _Replicating(asks=True)
        committer.replication = replicating  # type: ignore[assignment]
        committer.intake.inbox.incarnations["peer"] = 42
        task = await _parked(committer)
        committer.intake.receive_data(self_fork(3, b"x" * 2000))
        committer.wake()
        deadline = asyncio.get_running_loop().time() + 10
        while not replicating.rolls:
            assert asyncio.get_running_loop().time() < deadline, "the log never rolled"
            await asyncio.sleep(0)
        (seq,) = replicating.rolls
        good = IcState(_COMMITTER_ID, seq, 0, 0, b"state", {}, {}, {"other": 7})
        wrong_seq = IcState(_COMMITTER_ID, seq + 1, 0, 0, b"state")
        for data in (b"no checkpoint", b"".join(wrong_seq.encode_parts())):
            committer.checkpoint_taken(seq, data)
            committer.wake()
            while committer._taken is not None:
                await asyncio.sleep(0)
        committer.checkpoint_taken(seq, b"".join(good.encode_parts()))
        while committer.files.checkpoint_numbers() != [2]:
            assert asyncio.get_running_loop().time() < deadline, "checkpoint 2 never written"
            await asyncio.sleep(0.01)
        committer.end_input()
        await asyncio.wait_for(task, 10)
        await committer.close()
        return committer, forwarder, registry, replicating.rolls

    committer, forwarder, registry, rolls = asyncio.run(main())
    assert [seq for seq, _ in forwarder.records] == [0]  # no TakeCheckpoint for the binding
    assert rolls == [1]
    kept = IcState.decode(committer.files.read_checkpoint(2), "checkpoint 2")
    assert (kept.next_seq, bytes(kept.blob)) == (1, b"state")
    assert kept.senders == {"other": 7, "peer": 42}
    assert registry.committed == [2]


def test_a_replicated_primary_with_no_secondary_to_ask_asks_its_binding(tmp_path: Path) -> None:
    async def main() -> tuple[_Forwarder, list[int]]:
        committer, forwarder, _ = _committer(tmp_path, log_trigger_mb=1 / 1024)
        replicating = _Replicating(asks=False)
        committer.replication = replicating  # type: ignore[assignment]
        task = await _parked(committer)
        committer.intake.receive_data(self_fork(3, b"x" * 2000))
        committer.wake()
        deadline = asyncio.get_running_loop().time() + 10
        while len(forwarder.records) < 2:
            assert asyncio.get_running_loop().time() < deadline, "nothing was asked"
            await asyncio.sleep(0)
        committer.end_input()
        await asyncio.wait_for(task, 10)
        await committer.close()
        return forwarder, replicating.rolls

    forwarder, rolls = asyncio.run(main())
    assert rolls == [1]
    assert [seq for seq, _ in forwarder.records] == [0, -1]  # TakeCheckpoint after record 0
