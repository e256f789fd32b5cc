"""``ambrosia-py demo``: the pipeline of immortals, SIGKILLed mid-stream, exactly once.

The end-to-end test runs ``ambrosia-py demo --quick`` as a user would (a child process,
its output read as text): a producer, the Ockam hub, the Wallaroo connector and worker,
each immortal's service process and coordinator SIGKILLed at a different point of the
run, then the check and (where Java is) the Spark report. It checks the exit status and
the printed exactly-once line with its numbers, never how long anything took.

Around it, the parts that need no processes: the verdict (a reading lost or taken twice
is caught), the aggregating application, what the demo says without Java, and that a
failure prints the end of the logs of the process that failed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from rich.console import Console

from ambrosia_py.cli import main
from ambrosia_py.demo.analytics import run_analytics, why_not
from ambrosia_py.demo.check import StreamContents, compare
from ambrosia_py.demo.command import QUICK, _failed
from ambrosia_py.demo.output import Output
from ambrosia_py.demo.pipeline import DemoError, Pipeline, Settings
from ambrosia_py.demo.view import PipelineView
from examples.pipeline.sensors import aggregate, format_reading, parse_reading, readings

ROOT = Path(__file__).resolve().parents[1]
# The demo's output is a pipe here, as in CI: nothing in the environment may say otherwise.
_TERMINAL_SETTINGS = ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")
ENV = {k: v for k, v in os.environ.items() if k not in _TERMINAL_SETTINGS}
ENV["PYTHONPATH"] = str(ROOT)
BOXES = re.compile("[\u2500-\u257f]")  # box drawing: none off a terminal


def _run(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", "demo", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=ENV,
    )


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.timeout(600)  # Spark starts a JVM; on a busy machine that alone takes a while
def test_the_quick_demo_survives_every_sigkill_exactly_once(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    done = _run("--quick", "--workdir", str(workdir), timeout=580)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    line = re.search(
        r"exactly once: ([\d,]+) readings produced, ([\d,]+) stored \(each once, in order\), "
        r"([\d,]+) aggregated; the counts and sums of all (\d+) sensors equal the producer's "
        r"\(sum of values (-?[\d,]+)\) through (\d+) SIGKILLs",
        output,
    )
    assert line is not None, output
    produced, stored, aggregated = (_number(line.group(i)) for i in (1, 2, 3))
    assert produced == stored == aggregated == QUICK.events
    assert int(line.group(4)) == QUICK.sensors
    assert int(line.group(6)) == len(QUICK.kills)
    # Each process of each immortal, one kill at a time, each followed by its recovery.
    kills = re.findall(r"SIGKILL (hub|connector|worker): (service|coordinator|both) ", output)
    assert sorted(kills) == sorted((k.service, k.which) for k in QUICK.kills), output
    assert len(re.findall(r"(hub|connector|worker) recovered in ", output)) == len(QUICK.kills)
    # Mid-stream: every kill landed before the last reading was aggregated.
    for at in re.findall(r"SIGKILL \w+: \w+ \(pids [^)]*\) at [\d,]+ stored, ([\d,]+)", output):
        assert _number(at) < QUICK.events
    # The producer's manifest is the truth the check used; the three logs are Spark's input.
    assert (workdir / "produced.json").is_file()
    for instance in ("hub", "connector", "worker"):
        assert list((workdir / "data" / f"{instance}_0").glob("serverlog*")), instance
    problem = why_not()
    if problem is None:
        report = re.search(r"Spark report over every log: (\S+)", output)
        assert report is not None, output
        assert Path(report.group(1)).is_file()
        # Its output is a pipe: the Spark step says when it starts and ends.
        assert re.search(r"s  Spark analytics: ambrosia-py analyze .* \(output in ", output)
        assert re.search(r"s  Spark analytics: done in \d+ s\n", output), output
    else:
        assert f"Spark analytics skipped: {problem}" in output


def test_the_core_examples_still_run() -> None:
    """``--basics``: the counter (ingress, SIGKILL with a call in flight) and hello."""
    done = _run("--basics", timeout=280)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert output.count(": exactly once") == 2, output
    assert not BOXES.search(output), output  # its headings are plain lines on a pipe
    assert "-- 5. two immortals: examples/hello, client awaiting the server --" in output


def test_a_workdir_that_is_not_fresh_is_refused(tmp_path: Path) -> None:
    (tmp_path / "left-over").write_text("x")
    result = CliRunner().invoke(main, ["demo", "--quick", "--workdir", str(tmp_path)])
    assert result.exit_code != 0
    assert f"--workdir {tmp_path} is not empty" in result.output


def test_a_failure_prints_the_end_of_the_failing_process_log(tmp_path: Path) -> None:
    """A worker that cannot start: the error names it, with the end of its log."""
    out = Output(Console(record=True, width=200))
    settings = Settings(events=100, rate=0, kills=(), deadline=60)
    pipeline = Pipeline(tmp_path, settings, ROOT, PipelineView(out, 100))
    worker = pipeline.services["worker"]
    worker.args[worker.args.index("examples.pipeline.sensors:aggregate")] = "no_such_module:app"
    try:
        with pytest.raises(DemoError) as failure:
            pipeline.start()
    finally:
        assert pipeline.stop() == []
    assert failure.value.what == "the worker exited by itself"
    assert "no_such_module" in failure.value.logs["worker"]
    _failed(out, failure.value, tmp_path)
    text = out.console.export_text()
    assert "the end of the worker's log" in text and "no_such_module" in text
    assert "demo failed: the worker exited by itself" in text
    assert f"every log and the data are in {tmp_path}" in text


# --- the verdict --------------------------------------------------------------------------


def _manifest(events: int = 500) -> dict[str, Any]:
    state: dict[str, Any] = {}
    made = readings(seed=3, sensors=7)
    payloads = [format_reading(*next(made)) for _ in range(events)]
    for p in payloads:
        aggregate(state, p)
    return {
        "events": events,
        "counts": dict(state["counts"]),
        "sums": dict(state["sums"]),
        "payloads": payloads,
    }


def _state(payloads: list[bytes]) -> dict[str, Any]:
    state: dict[str, Any] = {}
    for p in payloads:
        aggregate(state, p)
    return state


WHOLE = StreamContents(500, True, "")


def test_exactly_once_is_said_with_the_numbers() -> None:
    manifest = _manifest()
    verdict = compare(manifest, _state(manifest["payloads"]), WHOLE, kills=6)
    assert verdict.ok and not verdict.details
    assert verdict.summary.startswith(
        "exactly once: 500 readings produced, 500 stored (each once, in order), 500 aggregated;"
    )
    assert "all 7 sensors" in verdict.summary and "through 6 SIGKILLs" in verdict.summary


@pytest.mark.parametrize("fault", ["lost", "twice"])
def test_a_reading_lost_or_taken_twice_fails_the_check(fault: str) -> None:
    manifest = _manifest()
    payloads = list(manifest["payloads"])
    key = parse_reading(payloads[100])[0]
    if fault == "lost":
        del payloads[100]
    else:
        payloads.insert(101, payloads[100])
    verdict = compare(manifest, _state(payloads), WHOLE, kills=6)
    assert not verdict.ok
    assert verdict.summary.startswith("NOT exactly once: 500 readings produced")
    assert [d.split(":")[0] for d in verdict.details] == [key]


def test_a_stream_out_of_order_or_short_fails_the_check() -> None:
    manifest = _manifest()
    state = _state(manifest["payloads"])
    twice = StreamContents(501, False, "index 101 holds reading #100")
    verdict = compare(manifest, state, twice, kills=0)
    assert not verdict.ok
    assert verdict.details == ("the hub's stream: index 101 holds reading #100",)
    short = compare(manifest, state, StreamContents(499, True, ""), kills=0)
    assert short.details == ("the hub's stream: 499 readings for 500 produced",)


# --- the application and the analytics step -----------------------------------------------


def test_readings_round_trip_and_a_malformed_one_is_named() -> None:
    assert parse_reading(format_reading("sensor-4", -17, 9)) == ("sensor-4", -17, 9)
    with pytest.raises(ValueError, match=r"not a reading .*b'sensor-4;12'"):
        parse_reading(b"sensor-4;12")
    one, two = readings(5, 10), readings(5, 10)
    first = [next(one) for _ in range(4)]
    assert first == [next(two) for _ in range(4)]  # reproducible from the seed
    assert [seq for *_, seq in first] == [0, 1, 2, 3]


def test_without_java_the_analytics_say_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no java on it
    problem = why_not()
    if problem is not None and "Java" not in problem:
        pytest.skip(problem)  # the spark extra is missing: that is what it says first
    assert problem == "no Java runtime; to run them: apt-get install openjdk-17-jre-headless"
    out = Output(Console(record=True))
    outcome = run_analytics(out, tmp_path, tmp_path / "r", tmp_path / "a.log", timeout=5)
    assert not outcome.ran and outcome.report is None
    assert outcome.message == f"Spark analytics skipped: {problem}"
    assert "\n" not in outcome.message
