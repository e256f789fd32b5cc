"""`ambrosia-py bench ingress` keeps working (figures are reported, never asserted)."""

from __future__ import annotations

from click.testing import CliRunner

from ambrosia_py.bench.ingress import percentile
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
    for label in ("1 in flight", "64 in flight", "calls/s", "p50 ms", "p99 ms", "fdatasync"):
        assert label in result.output
