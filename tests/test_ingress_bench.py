"""`ambrosia-py bench ingress` keeps working (figures are reported, never asserted)."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ambrosia_py.bench.ingress import percentile
from ambrosia_py.bench.ingress_floor import measure_ingress_floor
from ambrosia_py.cli import main


def test_percentile_is_the_nearest_rank() -> None:
    samples = [float(n) for n in range(1, 101)]
    assert (percentile(samples, 50), percentile(samples, 99), percentile(samples, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([3.0], 99) == 3.0


def test_bench_ingress_prints_both_rows() -> None:
    result = CliRunner().invoke(main, ["bench", "ingress", "--quick"])
    assert result.exit_code == 0, result.output
    for label in (
        "1 in flight",
        "64 in flight",
        "16 callers, a Client each",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "the floor (the same path, no work)",
        "fdatasync",
    ):
        assert label in result.output


def test_the_ingress_floor_answers_every_call_and_logs_it(tmp_path: Path) -> None:
    floor = measure_ingress_floor(tmp_path, callers=3, seconds=0.2, sequential=20)
    assert floor.callers == 3
    assert floor.calls > 0 and floor.calls_per_s > 0 and floor.sequential_p50_s > 0
    # Every call of the callers was in a synced batch; none holds more calls than callers.
    assert floor.calls / floor.callers <= floor.records <= floor.calls
