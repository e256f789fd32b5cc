"""Checkpoints recorded in the registry in the background, through its outages
(``coordinator/core/recording.py``), against a registry that is up or down at will."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from ambrosia_py.coordinator.core.recording import CheckpointRecorder
from ambrosia_py.coordinator.registry.interface import RegistryError, RegistryUnavailable

DEADLINE = 10.0


class _Registry:
    """Records (version, checkpoint) while up; unreachable while down; refuses a
    checkpoint older than the one it holds."""

    where = "etcd http://127.0.0.1:1 under /t/"

    def __init__(self) -> None:
        self.up = threading.Event()
        self.up.set()
        self.tries = 0
        self.committed: list[tuple[int, int]] = []
        self.failures = 0  # refusals the recorders said

    def recorder(self) -> CheckpointRecorder:
        return CheckpointRecorder(self, "me", self._failed)  # type: ignore[arg-type]

    def _failed(self) -> None:
        self.failures += 1

    def commit_checkpoint(self, name: str, version: int, checkpoint: int, log: int) -> None:
        self.tries += 1
        if not self.up.is_set():
            raise RegistryUnavailable("no etcd endpoint answers")
        if self.committed and self.committed[-1][1] > checkpoint:
            raise RegistryError(f"already committed {self.committed[-1][1]}")
        self.committed.append((version, checkpoint))


async def _until(what: str, condition: object) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE
    while not condition():  # type: ignore[operator]
        assert loop.time() < deadline, f"never: {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
def registry(caplog: pytest.LogCaptureFixture) -> _Registry:
    caplog.set_level(logging.INFO, "ambrosia_py.coordinator")
    return _Registry()


def test_a_down_registry_records_the_newest_checkpoint_once_back(
    registry: _Registry, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        recorder = registry.recorder()
        await recorder.record(0, 1)  # recorded before it returns
        assert registry.committed == [(0, 1)]
        registry.up.clear()
        await recorder.record(0, 2)  # returns at once: recorded in the background
        await _until("a try of 2", lambda: registry.tries >= 3)
        await recorder.record(0, 3)
        await recorder.record(0, 4)  # replaces 3 while the registry is down
        await _until("more tries", lambda: registry.tries >= 5)
        assert registry.committed == [(0, 1)]
        registry.up.set()
        await _until("4 recorded", lambda: recorder.recorded == (0, 4))
        await recorder.close()

    asyncio.run(main())
    # In order, the newest of those waiting: 2 and 3 are moot once 4 is recorded.
    assert registry.committed == [(0, 1), (0, 4)]
    assert registry.failures == 0
    assert "checkpoint 4 committed" in caplog.text and "checkpoint 3 committed" not in caplog.text


def test_a_refusal_is_raised_and_an_unrecorded_checkpoint_is_said_at_close(
    registry: _Registry, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        recorder = registry.recorder()
        registry.committed.append((0, 9))  # another coordinator of the instance went on
        await recorder.record(0, 5)
        await _until("the refusal", lambda: registry.failures > 0)
        with pytest.raises(RegistryError, match="already committed 9"):
            recorder.check()
        await recorder.close()

        down = registry.recorder()
        registry.up.clear()
        await down.record(0, 10)
        await down.close()  # one more try, then it says what stays unrecorded

    asyncio.run(main())
    assert registry.failures == 1
    assert "checkpoint 10 is not recorded in the registry" in caplog.text
    assert registry.committed == [(0, 9)]
