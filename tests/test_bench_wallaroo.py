"""`ambrosia-py bench wallaroo` keeps working: its smallest run reports every figure.

A real worker and a real connector (each with its own durable coordinator) stream 2,000
messages through one credit window, once per dialect. The output's shape is checked,
and that the worker applied every message exactly once; never how fast.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.bench.wallaroo import (
    PAYLOAD_SIZE,
    count_messages,
    count_words,
    measure_tcp_frames,
)
from ambrosia_py.cli import main

MESSAGES = 2_000


@pytest.mark.parametrize("dialect", ["draft", "v3"])
def test_the_smallest_run_reports_every_figure(dialect: str) -> None:
    args = ["--messages", str(MESSAGES), "--credits", "100", "--runs", "1"]
    args += ["--dialect", dialect, "--no-warm-up", "--json"]
    result = CliRunner().invoke(main, ["bench", "wallaroo", *args])
    assert result.exit_code == 0, result.output
    for label in ("msgs/s (median)", "vs TCP", "msgs/fsync", "no cpu", "fdatasync", "loopback"):
        assert label in result.output
    report: dict[str, Any] = json.loads(result.output.strip().splitlines()[-1])
    assert report["bench"] == "wallaroo" and report["dialect"] == dialect
    assert report["messages"] == MESSAGES and report["payload_bytes"] == PAYLOAD_SIZE
    assert report["target_met"] is None  # no 1,000-credit window in this run
    for key in ("fsync_per_s", "tcp_frames_per_s"):
        baseline = report["baseline"][key]
        assert len(baseline["runs"]) == 1 and baseline["median"] > 0
    (window,) = report["windows"]
    assert window["credits"] == 100 and window["refill_at"] == 50
    assert len(window["runs_msgs_per_s"]) == 1 and window["median_msgs_per_s"] > 0
    assert window["vs_tcp"] > 0 and window["msgs_per_fsync"] > 0
    assert set(window["cpu"]) == {
        *("worker", "worker_ic", "worker_waiting"),
        *("connector", "connector_ic", "connector_waiting"),
    }
    (run,) = window["runs"]
    # Every message applied once (duplicates are dropped, not applied), the stream
    # ended by EOS at its last point.
    assert run["applied"] == MESSAGES and run["app_messages"] == MESSAGES
    assert run["end_point"] == MESSAGES
    assert 0 < run["timed"] <= MESSAGES and run["seconds"] > 0


def test_the_applications_count() -> None:
    state: dict[str, Any] = {}
    count_words(state, b"a b a")
    count_words(state, b"b")
    assert state == {"counts": {"a": 2, "b": 2}, "messages": 2}
    counted: dict[str, Any] = {}
    count_messages(counted, b"anything")
    assert counted == {"messages": 1}


def test_the_tcp_baseline_counts_every_frame() -> None:
    assert measure_tcp_frames(5_000, batch=700) > 0  # the receiver checks the count
