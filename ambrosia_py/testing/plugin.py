"""The pytest plugin (registered as ``ambrosia``): fixtures for testing immortals.

``ambrosia`` gives an :class:`ImmortalRunner` on a fresh data directory; everything it
started is killed when the test ends, pass or fail. ``ambrosia_replay`` replays an
instance's recorded history (see :func:`ambrosia_py.binding.replay.replay_instance`).

An impulse a test sends is durable only once its coordinator has logged it: a test that
kills an instance right after sending impulses calls ``running.wait_logged()`` first, or
loses those not logged yet (:mod:`.impulses`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..binding.immortal import Immortal
from ..binding.replay import ReplayResult, replay_instance
from .runner import ImmortalRunner

__all__ = ["ambrosia", "ambrosia_replay"]


@pytest.fixture
def ambrosia(tmp_path: Path) -> Iterator[ImmortalRunner]:
    """Start immortals with real coordinators in a temporary data directory."""
    runner = ImmortalRunner(tmp_path / "ambrosia-data")
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def ambrosia_replay(ambrosia: ImmortalRunner) -> Callable[..., ReplayResult]:
    """``ambrosia_replay(Service, instance, verify=True)`` on the runner's data directory."""

    def replay(service: type[Immortal], instance: str, **kwargs: Any) -> ReplayResult:
        return replay_instance(service, ambrosia.data_dir, instance, **kwargs)

    return replay
