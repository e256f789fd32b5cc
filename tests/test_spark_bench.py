"""`ambrosia-py bench spark` keeps working: its generated logs read back whole, indexed and
split, through the reader it times (figures are reported, never asserted)."""

from __future__ import annotations

from pathlib import Path

from ambrosia_py.bench.spark import _scan, generate_logs
from ambrosia_py.spark import find_logs
from ambrosia_py.spark.plan import plan


def test_generated_logs_read_back_whole_and_split(tmp_path: Path) -> None:
    size, messages = generate_logs(tmp_path, 3, 100)
    assert size >= 3_000_000
    assert _scan(tmp_path) == messages
    assert len(plan(find_logs(tmp_path), 1 << 20)) >= 3  # the sidecar index allows splits
    assert (tmp_path / "bench_0" / "serverindex1").exists()
