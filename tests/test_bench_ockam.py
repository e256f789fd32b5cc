"""`ambrosia-py bench ockam` keeps working: its smallest run reports every figure.

Figures are checked for shape and sign only, never for speed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from click.testing import CliRunner

from ambrosia_py.cli import main
from immortals.ockam.bench import HubProcess, measure_checkpoints, measure_pulls, measure_pushes
from immortals.ockam.segments import SEAL_MESSAGES


def test_pushes_and_pulls_through_a_real_hub(tmp_path: Path) -> None:
    hub = HubProcess(tmp_path / "hub")
    with hub.running():

        async def run() -> tuple[float, float, tuple[float, float]]:
            single = await measure_pushes(hub.port, "one", 5, 1)
            pipelined = await measure_pushes(hub.port, "many", 300, 64)
            return single, pipelined, await measure_pulls(hub.port, "many", 300)

        single, pipelined, (pulled, per_pull) = asyncio.run(run())
    assert single > 0 and pipelined > 0 and pulled > 0
    assert 1 <= per_pull <= 300


def test_checkpoints_write_segments_once(tmp_path: Path) -> None:
    stored, more = 2 * SEAL_MESSAGES + 100, SEAL_MESSAGES + 100
    cp = measure_checkpoints(stored, more, tmp_path / "files")
    assert cp["messages"] == stored
    # Two full segments are sealed (100 messages left open); the next pushes seal one more.
    assert cp["first_files"] == 2 and cp["second_files"] == 1
    assert cp["first_files_bytes"] > 2 * SEAL_MESSAGES * 100
    # With state files the pickle holds references, not the sealed messages.
    assert cp["first_bytes"] < cp["inline_bytes"]
    for key in ("inline_s", "first_s", "second_s", "inline_bytes", "second_bytes"):
        assert cp[key] > 0


def test_bench_ockam_quick_prints_every_figure() -> None:
    result = CliRunner().invoke(main, ["bench", "ockam", "--quick"])
    assert result.exit_code == 0, result.output
    for label in ("1 in flight", "64 in flight", "pulled", "fdatasync", "state files, first"):
        assert label in result.output
