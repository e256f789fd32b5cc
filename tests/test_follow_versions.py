"""A secondary's replay where the log turns to a new version of the instance
(``coordinator/replicas/follow.py``, ``disk.py``): the old code replays nothing from
there; a replica started to upgrade has its binding told to upgrade exactly there, takes
the new version's first checkpoint and replays on, and its log goes on in the new
version's files; any other replica stops once a record of the new version is committed.

The binding is a stand-in that records what it is sent; the files are real.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.core.checkpoint import IcState
from ambrosia_py.coordinator.core.config import CoordinatorError
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.replicas.disk import ReplicaDisk
from ambrosia_py.coordinator.replicas.follow import Follower
from ambrosia_py.coordinator.storage.files import InstanceFiles, InstanceLockedError
from ambrosia_py.coordinator.storage.replica_state import (
    ReplicaState,
    load_replica_state,
    save_replica_state,
)
from ambrosia_py.wire.records import encode_disk_record, parse_header
from tests.test_follow_fence import RecordingBinding, answer, until

CID = 7
STATE = ReplicaState(1, 4, ((1, 0), (4, 10)), 1)


def old_version_disk(tmp_path: Path) -> ReplicaDisk:
    """Replica 1 of version 0: checkpoint 1 before seq 10, records 10..15 after it."""
    files = InstanceFiles(tmp_path, "svc", 0)
    files.create()
    files.write_checkpoint(1, IcState(CID, 10, 0, 0, b"state").encode_parts())
    save_replica_state(files, STATE)
    disk = ReplicaDisk(files, STATE)
    assert disk.log is not None
    disk.log.append(10, [encode_disk_record(CID, seq, b"") for seq in range(10, 16)])
    disk.log.sync()
    return disk


class Binding(RecordingBinding):
    """As the fence test's, with every record of a send (the replay sends runs)."""

    async def send(self, parts: list[wire.Payload]) -> None:
        buf = b"".join(bytes(p) for p in parts)
        pos = 0
        while pos < len(buf):
            header = parse_header(buf, pos)
            self.sent.append(header.seq)
            if header.seq == wire.CHECKPOINT_SEQ:
                break  # the state follows its record, outside it
            pos += header.length


def records_sent(binding: RecordingBinding) -> list[int]:
    return [s for s in binding.sent if isinstance(s, int) and s >= 0]


def test_a_replica_of_the_old_code_replays_up_to_the_turn_and_stops_there(
    tmp_path: Path,
) -> None:
    disk = old_version_disk(tmp_path)
    binding = Binding()

    async def scenario() -> BaseException | None:
        follower = Follower(binding, Intake("svc"), disk, lambda n, seq: None)  # type: ignore[arg-type]
        follower.start()
        follower.version_at(1, 13, None, "version 1 from seq 13: it stops")
        follower.replayable(13)
        await until("the records before the turn", lambda: records_sent(binding) == [10, 11, 12])
        # Nothing of version 1 is committed yet: it waits there, alive.
        await asyncio.sleep(0.05)
        assert follower.task is not None and not follower.task.done()
        follower.replayable(16)
        await until(
            "the replay to stop", lambda: follower.task is not None and follower.task.done()
        )
        assert follower.task is not None
        return follower.task.exception()

    error = asyncio.run(scenario())
    assert isinstance(error, CoordinatorError)
    assert "version 1 from seq 13: it stops" in str(error)
    assert records_sent(binding) == [10, 11, 12]  # never a record of the new version
    disk.close()


def test_a_replica_started_to_upgrade_upgrades_exactly_at_the_turn(tmp_path: Path) -> None:
    disk = old_version_disk(tmp_path)
    new = InstanceFiles(tmp_path, "svc", 1)
    binding = Binding()
    started: list[int] = []
    done: list[tuple[int, int]] = []

    async def scenario() -> None:
        follower = Follower(binding, Intake("svc"), disk, lambda n, seq: None)  # type: ignore[arg-type]
        follower.start()
        follower.version_at(
            1, 13, (new, started.append, lambda f, seq: done.append((f.version, seq)))
        )
        follower.replayable(16)
        await until("the upgrade", lambda: "TakeCheckpoint" in binding.sent)
        # Exactly after the old version's records: the rest goes to the new code.
        assert binding.sent[:6] == [
            wire.CHECKPOINT_SEQ,
            10,
            11,
            12,
            "UpgradeService",
            "TakeCheckpoint",
        ]
        assert started == [1]
        assert follower.checkpoint_arrived(answer())
        await until("the upgrade's checkpoint", lambda: done == [(1, 13)])
        await until("the new version's records", lambda: records_sent(binding)[-1:] == [15])
        await follower.stop()

    asyncio.run(scenario())
    assert records_sent(binding) == [10, 11, 12, 13, 14, 15]
    first = IcState.decode(new.read_checkpoint(1), "checkpoint 1 of version 1")
    assert (first.next_seq, first.blob) == (13, b"blob")
    disk.close()


def test_the_log_goes_on_in_the_new_versions_files(tmp_path: Path) -> None:
    """A secondary upgraded in place: its records from the turn on move to the new
    version's log, and a restart finds them there, after its checkpoint 1."""
    disk = old_version_disk(tmp_path)
    new = InstanceFiles(tmp_path, "svc", 1)
    new.create()
    new.write_checkpoint(1, IcState(CID, 13, 0, 0, b"upgraded").encode_parts())
    rlog = disk.switch_to(new, 13)
    assert (rlog.base, rlog.end, rlog.durable_end) == (13, 16, 16)
    assert disk.files is new
    disk.close()

    state = load_replica_state(new)
    assert state == ReplicaState(1, 4, ((1, 0), (4, 10)), 1)
    again = ReplicaDisk(new, state)
    assert again.log is not None
    assert (again.log.base, again.log.end) == (13, 16)
    kept = again.log.read(13, 1 << 20)
    assert kept == [encode_disk_record(CID, seq, b"") for seq in range(13, 16)]
    again.close()


def test_a_switch_to_files_another_process_holds_is_refused(tmp_path: Path) -> None:
    disk = old_version_disk(tmp_path)
    held = InstanceFiles(tmp_path, "svc", 1)
    held.create()
    held.acquire_lock()
    other = InstanceFiles(tmp_path, "svc", 1)
    with pytest.raises(InstanceLockedError):
        disk.switch_to(other, 13)
    held.release_lock()
    disk.close()
