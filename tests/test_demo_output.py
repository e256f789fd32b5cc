"""The demo's output off a terminal: plain lines, for ``make demo | tee`` and CI logs.

``ambrosia-py demo --quick --no-spark`` runs once for the module, its stdout a pipe, as a
CI runner gives it, at rich's default width of 80 columns: no box drawing, no line
wrapped, one line per step. Spark is left out there (it is what takes the time; the
end-to-end test in test_demo.py runs it); its heartbeat is tested on its own with a
stand-in for ``ambrosia-py analyze`` that runs until the test has seen a few heartbeats,
in a child process whose stdout the test reads line by line as the lines come, so the
gaps between them are measured. A pipeline wait's heartbeat likewise. In a terminal the
output stays rich's.
"""

from __future__ import annotations

import io
import itertools
import os
import queue
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from ambrosia_py.demo.analytics import run_analytics
from ambrosia_py.demo.command import QUICK
from ambrosia_py.demo.output import Output
from ambrosia_py.demo.view import PipelineView

ROOT = Path(__file__).resolve().parents[1]
# A pipe at 80 columns, whatever the environment running the tests says.
_TERMINAL_SETTINGS = ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS", "LINES")
ENV = {k: v for k, v in os.environ.items() if k not in _TERMINAL_SETTINGS}
ENV |= {"PYTHONPATH": str(ROOT), "COLUMNS": "80"}
BOXES = re.compile("[\u2500-\u257f]")
STAMP = r" *\d+\.\d+s  "  # the seconds since the start that begin each step's line
INTERVAL = 0.2  # the heartbeat the liveness tests configure, in seconds
MARGIN = 1.5  # what a busy machine may add to a gap between two lines
HEARTBEAT_THREAD = "demo heartbeat"


def _heartbeat_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(HEARTBEAT_THREAD)]


# --- the quick demo, piped ----------------------------------------------------------------


@pytest.fixture(scope="module")
def piped(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    workdir = tmp_path_factory.mktemp("demo") / "work"
    demo = [sys.executable, "-m", "ambrosia_py.cli", "demo", "--quick", "--no-spark"]
    return subprocess.run(
        [*demo, "--workdir", str(workdir)],
        capture_output=True,  # stdout a pipe
        text=True,
        timeout=360,
        cwd=ROOT,
        env=ENV,
    )


def _lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


# Every line the piped demo prints, whole: a line rich had wrapped would leave a part
# that matches none of these (each anchored at both ends where its message is long).
_WHOLE_LINES = [
    re.compile(STAMP + r"\S.*"),  # each step, the live view's summary, heartbeats
    re.compile(r"the SIGKILLs, and the recoveries"),
    re.compile(r"the busiest 5 of 100 sensors"),
    re.compile(r"  \S.*"),  # a table's header and rows
    re.compile(
        r"the producer reconnected to the hub \d+ times in the middle of a push; [\d,]+ "
        r"readings it had pushed without seeing the confirmation were found stored, and "
        r"not pushed again"
    ),
    re.compile(r"exactly once: [\d,]+ readings produced, .* through \d+ SIGKILLs"),
    re.compile(r"Spark analytics skipped \(--no-spark\)"),
    re.compile(r"wall time \d+ s \(pipeline \d+ s\); everything is in \S+"),
]


@pytest.mark.timeout(420)
def test_piped_demo_draws_no_boxes_and_no_colours(
    piped: subprocess.CompletedProcess[str],
) -> None:
    _lines(piped)  # it passed
    assert not BOXES.search(piped.stdout), piped.stdout
    assert "\x1b" not in piped.stdout, piped.stdout
    assert "ambrosia-py demo" not in piped.stdout  # the live view's panel title: no panel


@pytest.mark.timeout(420)
def test_piped_demo_wraps_no_line(piped: subprocess.CompletedProcess[str]) -> None:
    lines = _lines(piped)
    for line in lines:
        assert any(shape.fullmatch(line) for shape in _WHOLE_LINES), (line, piped.stdout)
    # The long messages run past 80 columns on one line.
    verdict = next(line for line in lines if line.startswith("exactly once: "))
    assert len(verdict) > 80 and verdict.endswith(f"through {len(QUICK.kills)} SIGKILLs")
    kills = [line for line in lines if re.match(STAMP + "SIGKILL ", line)]
    assert kills and all(
        re.fullmatch(
            STAMP + r"SIGKILL \w+: \w+ \(pids \d+/\d+\) at [\d,]+ stored, [\d,]+ aggregated",
            line,
        )
        for line in kills
    ), kills
    assert max(len(line) for line in lines) > 80


@pytest.mark.timeout(420)
def test_piped_demo_prints_one_line_per_step(piped: subprocess.CompletedProcess[str]) -> None:
    lines = _lines(piped)
    stamped = [
        (float(m.group(1)), m.group(2))
        for line in lines
        if (m := re.fullmatch(r" *(\d+\.\d+)s  (.*)", line))
    ]
    assert [t for t, _ in stamped] == sorted(t for t, _ in stamped)
    steps = [text for _, text in stamped if ": still running, " not in text]
    events = QUICK.events
    assert steps[0].startswith("data dir ")
    assert re.fullmatch(r"hub on .*: all up in \d+\.\d s", steps[1]), steps
    assert steps[2] == f"producer started: {events:,} readings at 150/s"
    crashes = steps[3 : 3 + 2 * len(QUICK.kills)]
    pairs = zip(crashes[::2], crashes[1::2], strict=True)
    for kill, (killed, recovered) in zip(QUICK.kills, pairs, strict=True):
        assert killed.startswith(f"SIGKILL {kill.service}: {kill.which} "), steps
        assert recovered.startswith(f"{kill.service} recovered in "), steps
    assert steps[3 + 2 * len(QUICK.kills) :] == [
        f"producer done: {events:,} readings stored",
        "checking: reading the hub's stream back, comparing the aggregates",
        f"pipeline: {events:,} produced, {events:,} stored, {events:,} delivered, "
        f"{events:,} aggregated of {events:,}; hub up (2 SIGKILLs), connector up "
        "(2 SIGKILLs), worker up (2 SIGKILLs)",
    ]
    # The tables: a title, then aligned plain columns.
    at = lines.index("the SIGKILLs, and the recoveries")
    header = lines[at + 1]
    columns = ["immortal", "killed", "at stored", "at aggregated", "recovered in"]
    assert re.split(" {2,}", header.strip()) == columns, header
    rows = lines[at + 2 : at + 2 + len(QUICK.kills)]
    for kill, row in zip(QUICK.kills, rows, strict=True):
        assert re.fullmatch(rf"  {kill.service} +{kill.which} +[\d,]+ +[\d,]+ +\d+\.\d s", row)
    assert len({len(row) for row in rows}) == 1  # right-aligned columns: one width
    assert lines[-2] == "Spark analytics skipped (--no-spark)"


# --- heartbeats, read from a pipe as they come --------------------------------------------

# Stands in for ``ambrosia-py analyze``: runs until the test releases it (a file), then
# names its report as analyze does.
_STAND_IN = """
import os, sys, time
release, report = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
while not os.path.exists(release) and time.monotonic() < deadline:
    time.sleep(0.01)  # polling a condition, bounded by the deadline
print("report: " + report)
"""

_SPARK_STEP = """
import sys, threading
from pathlib import Path
from ambrosia_py.demo.analytics import run_analytics
from ambrosia_py.demo.output import Output

tmp, release, stand_in, interval = Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
out = Output(heartbeat=interval)
argv = [sys.executable, "-c", stand_in, release, str(tmp / "report.html")]
outcome = run_analytics(out, tmp / "data", tmp / "report", tmp / "analyze.log", 120, argv=argv)
alive = [t.name for t in threading.enumerate() if t.name.startswith("demo heartbeat")]
print(f"returned: terminal={out.terminal} report={outcome.report} heartbeats={alive}", flush=True)
"""

_PIPELINE_WAIT = """
import sys, threading
from pathlib import Path
from ambrosia_py.demo.output import Output
from ambrosia_py.demo.pipeline import Pipeline, Settings
from ambrosia_py.demo.view import PipelineView

tmp, release, root = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4])
interval = float(sys.argv[3])
out = Output(heartbeat=interval)
settings = Settings(events=100, rate=0, kills=(), deadline=60)
pipeline = Pipeline(tmp, settings, root, PipelineView(out, settings.events))
out.event("waiting starts")
pipeline.wait("the release file", release.exists, ())
out.event("waiting ended")
alive = [t.name for t in threading.enumerate() if t.name.startswith("demo heartbeat")]
print(f"returned: terminal={out.terminal} heartbeats={alive}", flush=True)
"""


def _lines_as_they_come(
    argv: list[str], release: Path, beats: int = 3, timeout: float = 60.0
) -> list[tuple[float, str]]:
    """Run ``argv`` with its stdout a pipe; each line with the time it arrived. Once
    ``beats`` heartbeat lines came, create ``release`` (which lets the step end)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=ENV
    )
    arrived: queue.Queue[tuple[float, str] | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            arrived.put((time.monotonic(), line.rstrip("\n")))
        arrived.put(None)

    threading.Thread(target=read, daemon=True).start()
    got: list[tuple[float, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                item = arrived.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"no end within {timeout:g} s; so far: {got}")
            if item is None:
                break
            got.append(item)
            if sum(": still running, " in line for _, line in got) >= beats:
                release.touch()
        assert proc.wait(timeout=max(0.0, deadline - time.monotonic())) == 0, got
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return got


def _gaps(got: list[tuple[float, str]]) -> list[float]:
    return [b - a for (a, _), (b, _) in itertools.pairwise(got)]


def test_the_spark_step_has_a_heartbeat_on_a_pipe_and_it_stops_with_the_step(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    got = _lines_as_they_come(
        [sys.executable, "-c", _SPARK_STEP, str(tmp_path), str(release), _STAND_IN, str(INTERVAL)],
        release,
    )
    lines = [line for _, line in got]
    assert re.fullmatch(
        STAMP + rf"Spark analytics: ambrosia-py analyze {tmp_path / 'data'} \(output in .*\)",
        lines[0],
    ), lines
    beats = lines[1:-2]
    assert len(beats) >= 3, lines
    assert all(re.fullmatch(STAMP + r"Spark analytics: still running, \d+ s", b) for b in beats)
    assert re.fullmatch(STAMP + r"Spark analytics: done in \d+ s", lines[-2]), lines
    # The thread ended with the step: nothing after the call returned.
    report = tmp_path / "report.html"
    assert lines[-1] == f"returned: terminal=False report={report} heartbeats=[]"
    # From the step's first line to its last, never a gap much longer than the interval.
    gaps = _gaps(got[:-1])
    assert max(gaps) < INTERVAL + MARGIN, gaps


def test_a_pipeline_wait_has_a_heartbeat_on_a_pipe(tmp_path: Path) -> None:
    release = tmp_path / "release"
    got = _lines_as_they_come(
        [
            sys.executable,
            "-c",
            _PIPELINE_WAIT,
            str(tmp_path),
            str(release),
            str(INTERVAL),
            str(ROOT),
        ],
        release,
    )
    lines = [line for _, line in got]
    assert re.fullmatch(STAMP + "waiting starts", lines[0]), lines
    beats = lines[1:-2]
    assert len(beats) >= 3, lines
    shape = STAMP + r"waiting for the release file: still running, \d+ s"
    assert all(re.fullmatch(shape, b) for b in beats), lines
    assert re.fullmatch(STAMP + "waiting ended", lines[-2]), lines
    assert lines[-1] == "returned: terminal=False heartbeats=[]"
    gaps = _gaps(got[:-1])
    assert max(gaps) < INTERVAL + MARGIN, gaps


@pytest.mark.parametrize("ending", ["fails", "times out", "raises"])
def test_the_heartbeat_stops_when_the_spark_step_goes_wrong(tmp_path: Path, ending: str) -> None:
    printed = io.StringIO()
    out = Output(Console(file=printed, width=80), heartbeat=0.05)
    never = tmp_path / "never"  # the stand-in's release, never made: it runs till killed
    argv = {
        "fails": [sys.executable, "-c", "raise SystemExit(3)"],
        "times out": [sys.executable, "-c", _STAND_IN, str(never), "-"],
        "raises": [str(tmp_path / "no-such-program")],
    }[ending]
    data, report, log = tmp_path / "data", tmp_path / "r", tmp_path / "a.log"
    if ending == "raises":
        with pytest.raises(FileNotFoundError):
            run_analytics(out, data, report, log, 60, argv=argv)
    else:
        outcome = run_analytics(out, data, report, log, 1.0, argv=argv)
        assert outcome.ran and outcome.report is None
        expected = {
            "fails": "ambrosia-py analyze failed (exit 3)",
            "times out": "ambrosia-py analyze took over 1 s",
        }[ending]
        assert outcome.message == expected
        last = printed.getvalue().splitlines()[-1]
        assert re.fullmatch(STAMP + rf"Spark analytics: {re.escape(expected)}, after \d+ s", last)
    assert _heartbeat_threads() == []


# --- in a terminal ------------------------------------------------------------------------


def test_in_a_terminal_the_output_stays_rich() -> None:
    printed = io.StringIO()
    out = Output(Console(file=printed, force_terminal=True, width=100), heartbeat=0.01)
    assert out.terminal
    out.progress("a step the live view shows")  # no line: the live view says it
    with out.heartbeat("a long step"):
        assert _heartbeat_threads() == []  # the spinner or live view shows it runs
    out.table("a table", [("name", "left"), ("count", "right")], [("a", "1,000")])
    out.rule("a heading")
    view = PipelineView(out, 100)
    with view.live():
        pass
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", printed.getvalue())  # colours, cursor
    assert "a step the live view shows" not in text
    assert "┏" in text and "┃ name" in text  # the table in its box
    assert "─ a heading ─" in text
    assert "╭" in text and "ambrosia-py demo" in text  # the live view's panel
    assert "pipeline: " not in text  # its plain summary is for pipes only


def test_another_programs_boxes_are_blanked_on_a_pipe() -> None:
    """A child's table (``ambrosia-py instances`` draws one on a pipe too): off a terminal
    its borders go and its columns stay aligned; in a terminal it is shown as it came."""
    drawn = io.StringIO()
    table = Table(title="instances")
    for header in ("name", "version"):
        table.add_column(header)
    table.add_row("counter", "0")
    Console(file=drawn, width=80).print(table)
    printed = io.StringIO()
    Output(Console(file=printed, width=80)).verbatim(drawn.getvalue() + "\nlast line")
    lines = printed.getvalue().splitlines()
    assert not BOXES.search(printed.getvalue())
    assert [line.strip() for line in lines] == [
        "instances",
        "name      version",
        "counter   0",
        "",
        "last line",
    ]
    assert lines[1].index("version") == lines[2].index("0")
    terminal = io.StringIO()
    console = Console(file=terminal, width=80, force_terminal=True, color_system=None)
    Output(console).verbatim(drawn.getvalue().rstrip("\n"))
    assert terminal.getvalue() == drawn.getvalue()
