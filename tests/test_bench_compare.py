"""``ambrosia-py bench compare``: it runs, and its JSON has the documented shape.

Benchmarks are not tests: nothing here looks at a speed, a time or a ratio, only that
every figure is there and is a positive number. The quick path runs as a real command
in a child process with the optional peers (grpcio, dbos) blocked, as on a machine
without the ``bench`` extra; the peers themselves run tiny when they are installed.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.bench import compare_dbos, compare_grpc
from ambrosia_py.bench.compare import QUICK, run_dbos, run_grpc
from ambrosia_py.bench.compare_floor import MODES, Mode, measure_await_floor

SIZES = {"16", "1024", "65536"}
# The command, with grpc and dbos made unimportable (a None entry in sys.modules).
WITHOUT_PEERS = (
    "import sys; sys.modules['grpc'] = None; sys.modules['dbos'] = None; "
    "from ambrosia_py.cli import main; main()"
)


def _positive(figure: Any) -> bool:
    return isinstance(figure, int | float) and math.isfinite(figure) and figure > 0


def _all_positive(figures: dict[str, Any]) -> None:
    assert figures
    for measure, figure in figures.items():
        values = figure.values() if isinstance(figure, dict) else [figure]
        assert values and all(_positive(v) for v in values), (measure, figure)


def test_quick_run_without_peers(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", WITHOUT_PEERS, "bench", "compare", "--quick", "--json"]
    argv += ["--only", "limits", "--only", "ours", "--only", "grpc", "--only", "dbos"]
    argv += ["--dir", str(tmp_path), "--markdown", str(tmp_path / "out.md")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "grpc: not installed" in done.stderr
    assert "dbos: not installed" in done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(result) == {"ours", "grpc", "dbos", "limits"}
    assert result["grpc"] == {} and result["dbos"] == {}
    _all_positive(result["limits"])
    _all_positive(result["ours"])
    assert set(result["limits"]["loopback_msgs_per_s"]) == SIZES
    for measure in ("remote_fork_msgs_per_s", "remote_await_calls_per_s", "remote_await_p50_ms"):
        assert set(result["ours"][measure]) == SIZES
    for measure in ("replay_calls_per_s", "failover_s", "rss_idle_service_mib"):
        assert _positive(result["ours"][measure])
    for mode in MODES:
        assert _positive(result["limits"][f"await_floor_{mode}_p50_ms"])
    assert "Performance goals" in (tmp_path / "out.md").read_text()
    assert list(tmp_path.iterdir()) == [tmp_path / "out.md"]  # the temporary dir is gone


@pytest.mark.skipif(not compare_grpc.available(), reason="grpcio not installed (bench extra)")
def test_grpc_tiny(tmp_path: Path) -> None:
    figures = run_grpc(QUICK, tmp_path)
    assert set(figures["msgs_per_s"]) == SIZES  # type: ignore[arg-type]
    _all_positive(figures)


@pytest.mark.skipif(not compare_dbos.available(), reason="dbos not installed (bench extra)")
def test_dbos_tiny(tmp_path: Path) -> None:
    figures = run_dbos(QUICK, tmp_path)
    assert set(figures) == {"steps_per_s", "workflows_per_s"}
    assert set(figures["steps_per_s"]) == SIZES  # type: ignore[arg-type]
    _all_positive(figures)


@pytest.mark.parametrize("mode", MODES)
def test_await_floor_makes_every_call_durable_twice(tmp_path: Path, mode: Mode) -> None:
    """The floor's skeleton is the awaited path: each of its coordinators appended every
    frame it relayed from the link (20 measured + 3 unmeasured round trips of 16 B, each
    4 + 16 bytes) to its file, and the caller got each call back as it sent it."""
    p50 = measure_await_floor(tmp_path, mode, 16, 20)
    assert _positive(p50)
    for name in ("coordinator-a.log", "coordinator-b.log"):
        data = (tmp_path / name).read_bytes()
        frames = [data[i : i + 20] for i in range(0, len(data), 20)]
        assert [int.from_bytes(f[4:12], "big") for f in frames] == list(range(23))


def test_await_floor_needs_room_for_its_counter(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="8-byte counter"):
        measure_await_floor(tmp_path, "blocking", 4, 1)
