"""`ambrosia-py bench wire` keeps working (figures are reported, never asserted)."""

from __future__ import annotations

from click.testing import CliRunner

from ambrosia_py.bench.wire import MESSAGES_PER_RECORD, measure
from ambrosia_py.cli import main


def test_measure_reports_every_figure_for_each_size() -> None:
    for size in (16, 1024, 64 * 1024):
        figures = measure(size, min_seconds=0.0)
        assert figures["arg_size"] == size
        # A record holds 1,000 framed messages plus the 24-byte header.
        assert figures["record_bytes"] > MESSAGES_PER_RECORD * size + 24
        for key in ("encode", "decode", "chunked"):
            assert figures[f"{key}_msgs_per_s"] > 0
            assert figures[f"{key}_mb_per_s"] > 0


def test_bench_wire_command_prints_the_table() -> None:
    result = CliRunner().invoke(main, ["bench", "wire", "--seconds", "0"])
    assert result.exit_code == 0, result.output
    for label in ("16 B", "1024 B", "65536 B", "decode msg/s"):
        assert label in result.output
