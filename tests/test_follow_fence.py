"""A secondary's replay (``coordinator/replicas/follow.py``) and the binding's answers to
its TakeCheckpoints, in order: a checkpoint of its own asked for, then given up because
a shipped checkpoint was installed, leaves an answer on its way that belongs to nobody.
It must be passed over, and the reload's fence must wait for the answer after it: taken
for the fence's, the binding's stream would be cut at the wrong place, and the fence's
own answer would then arrive as a checkpoint nobody asked for.

The binding here is a stand-in that records what it is sent (the replay only sends it
records and control messages); the files are real: a checkpoint written as the
coordinator writes one, the replica's state file, its log.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ambrosia_py import wire
from ambrosia_py.coordinator.core.checkpoint import IcState
from ambrosia_py.coordinator.core.events import CheckpointArrived
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.replicas.disk import ReplicaDisk
from ambrosia_py.coordinator.replicas.follow import Follower
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replica_state import ReplicaState, save_replica_state
from ambrosia_py.wire.records import parse_header

DEADLINE = 10.0


class RecordingBinding:
    """What the replay sends a binding: records (their seq) and control messages."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, parts: list[wire.Payload]) -> None:
        self.sent.append(parse_header(b"".join(bytes(p) for p in parts)).seq)

    async def control(self, committer_id: int, msg: wire.Message) -> None:
        self.sent.append(type(msg).__name__)


async def until(what: str, condition: Any) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), DEADLINE)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def answer() -> CheckpointArrived:
    return CheckpointArrived(b"blob")


def test_the_answer_to_a_given_up_checkpoint_is_passed_over(tmp_path: Path) -> None:
    files = InstanceFiles(tmp_path, "svc", 0)
    files.create()
    files.write_checkpoint(1, IcState(7, 10, 0, 0, b"state").encode_parts())
    save_replica_state(files, ReplicaState(1, 1, ((1, 0),), 1))
    disk = ReplicaDisk(files, ReplicaState(1, 1, ((1, 0),), 1))
    binding = RecordingBinding()

    async def scenario() -> list[bool]:
        follower = Follower(binding, Intake("svc"), disk, lambda n, seq: None)  # type: ignore[arg-type]
        follower.start()
        await until("the binding to be loaded", lambda: binding.sent == [wire.CHECKPOINT_SEQ])
        # The log rolls at its end (seq 10): the replay asks for a checkpoint there.
        assert disk.log is not None
        disk.log.roll(2)
        follower.checkpoint_at(2, 10)
        await until("the TakeCheckpoint", lambda: binding.sent[-1:] == ["TakeCheckpoint"])
        # A shipped checkpoint is installed before the answer came: the binding reloads,
        # behind a fence of its own.
        follower.start()
        await until("the fence", lambda: binding.sent.count("TakeCheckpoint") == 2)
        taken = [follower.checkpoint_arrived(answer())]  # the given-up one's
        taken.append(follower.checkpoint_arrived(answer()))  # the fence's
        await until("the reload", lambda: binding.sent.count(wire.CHECKPOINT_SEQ) == 2)
        taken.append(follower.checkpoint_arrived(answer()))  # nobody's
        await follower.stop()
        return taken

    assert asyncio.run(scenario()) == [True, True, False]
    disk.close()
