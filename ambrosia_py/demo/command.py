"""``ambrosia-py demo``: the main job, a pipeline of immortals that survives SIGKILLs.

A producer pushes sensor readings into an Ockam stream on the Ockam hub immortal; the
Wallaroo connector immortal reads the stream through the index service and feeds the
Wallaroo worker immortal, whose application keeps per-sensor counts and sums. Partway
through, the hub, the connector and the worker are SIGKILLed (each one's service process
and coordinator, at different points of the run) and started again with the same
command (:mod:`.pipeline`). At the end the aggregates are checked against exactly-once
processing of everything produced (:mod:`.check`), and Spark analyses every log the
pipeline wrote (:mod:`.analytics`). ``--quick`` is a smaller run, the one the tests run.
``--basics`` runs the counter and hello examples instead (:mod:`.basics`). Whether the
output is a terminal (a live view and tables) or not (plain lines, for a pipe or a CI
log) is decided once, in :mod:`.output`, and everything prints through it.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import click

from .analytics import Analytics, run_analytics
from .basics import run_basics
from .check import ReadBackError, Verdict, compare, read_stream
from .output import Output
from .pipeline import EACH_PROCESS, PLAN, STREAM, DemoError, Pipeline, Settings
from .view import PipelineView

__all__ = ["FULL", "QUICK", "demo"]

# The readings come at a rate, so the crashes land while the producer still pushes.
FULL = Settings(events=60_000, rate=2_000.0, kills=PLAN)
QUICK = Settings(events=3_000, rate=150.0, kills=EACH_PROCESS)
_SPARK_TIMEOUT = 300.0


def _examples_root() -> Path:
    """The clone whose ``examples/pipeline`` the demo runs: this package's, else the
    working directory."""
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        if (root / "examples" / "pipeline" / "sensors.py").is_file():
            return root
    raise click.ClickException(
        "the demo runs examples/pipeline/ of a clone of the repository; none found beside "
        f"{Path(__file__).resolve().parents[2]} or in {Path.cwd()}: run it from the clone"
    )


def _fresh(workdir: Path | None) -> Path:
    if workdir is None:
        return Path(tempfile.mkdtemp(prefix="ambrosia-demo-"))
    if workdir.exists() and any(workdir.iterdir()):
        raise click.ClickException(f"--workdir {workdir} is not empty: the demo needs a fresh one")
    workdir.mkdir(parents=True, exist_ok=True)
    return workdir


@click.command()
@click.option(
    "--quick",
    is_flag=True,
    help="A smaller run: 3,000 readings, six SIGKILLs (the full run: 60,000, nine).",
)
@click.option("--events", type=click.IntRange(min=100), help="Readings to produce.")
@click.option("--rate", type=click.FloatRange(min=0), help="Readings per second (0: no limit).")
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="A fresh directory for the data, logs and report (default: a new temporary one).",
)
@click.option("--spark/--no-spark", default=True, show_default=True, help="Run the analytics.")
@click.option("--basics", is_flag=True, help="Instead: the counter and hello examples.")
def demo(
    quick: bool,
    events: int | None,
    rate: float | None,
    workdir: Path | None,
    spark: bool,
    basics: bool,
) -> None:
    """The main job: producer -> Ockam hub -> Wallaroo connector -> Wallaroo worker,
    each immortal SIGKILLed mid-stream and recovered, checked for exactly once, then
    analysed with Spark."""
    out = Output()
    root = _examples_root()
    if basics:
        if not run_basics(out, root / "examples"):
            raise SystemExit(1)
        return
    settings = QUICK if quick else FULL
    if events is not None:
        settings = attrs.evolve(settings, events=events)
    if rate is not None:
        settings = attrs.evolve(settings, rate=rate)
    workdir = _fresh(workdir)
    started = time.monotonic()
    view = PipelineView(out, settings.events)
    pipeline = Pipeline(workdir, settings, root, view)
    try:
        verdict, manifest, state = _run(pipeline, view)
    except DemoError as exc:
        _failed(out, exc, workdir)
        raise SystemExit(1) from None
    finally:
        for problem in pipeline.stop():
            out.print(problem, style="red", markup=False)
    pipeline_seconds = time.monotonic() - started
    _crashes(out, pipeline)
    c = view.counters
    out.print(
        f"the producer reconnected to the hub {c.reconnects} times in the middle of a push; "
        f"{c.recovered:,} readings it had pushed without seeing the confirmation were found "
        "stored, and not pushed again"
    )
    _sensors(out, manifest, state)
    out.print(verdict.summary, style="bold green" if verdict.ok else "bold red")
    for line in verdict.details:
        out.print(f"  {line}", style="red", markup=False)
    analytics = (
        run_analytics(
            out,
            pipeline.data,
            workdir / "report",
            workdir / "logs" / "analyze.log",
            _SPARK_TIMEOUT,
        )
        if spark
        else Analytics(False, None, "Spark analytics skipped (--no-spark)")
    )
    _analytics(out, analytics, workdir)
    total = time.monotonic() - started
    out.print(
        f"wall time {total:.0f} s (pipeline {pipeline_seconds:.0f} s"
        + (f", Spark {analytics.seconds:.0f} s)" if analytics.ran else ")")
        + f"; everything is in {workdir}"
    )
    if not verdict.ok or (analytics.ran and analytics.report is None):
        raise SystemExit(1)


def _run(pipeline: Pipeline, view: PipelineView) -> tuple[Verdict, dict[str, Any], dict[str, Any]]:
    """Run the pipeline through its crashes; the verdict, the manifest, the aggregates."""
    with view.live():
        pipeline.start()
        for kill in pipeline.settings.kills:
            pipeline.crash(kill)
        pipeline.finish()
        view.next_step = "checking: reading the hub's stream back, comparing the aggregates"
        view.out.progress(view.next_step)
        try:
            with view.out.heartbeat("reading the hub's stream back"):
                hub = f"127.0.0.1:{pipeline.hub_port}"
                stream = read_stream(hub, STREAM, cwd=pipeline.root, env=pipeline.env)
        except (OSError, ReadBackError) as exc:
            what = f"reading the hub's stream back: {exc}"
            raise DemoError(what, pipeline.logs_of("hub")) from None
        state = pipeline.final_state()
        view.next_step = ""
    manifest: dict[str, Any] = json.loads(pipeline.manifest.read_text())
    return compare(manifest, state, stream, len(pipeline.crashes)), manifest, state


def _failed(out: Output, exc: DemoError, workdir: Path) -> None:
    for name, tail in exc.logs.items():
        out.rule(f"the end of the {name}'s log")
        out.verbatim(tail.rstrip())
    out.print(f"demo failed: {exc.what}", style="bold red", markup=False)
    out.print(f"every log and the data are in {workdir}", markup=False)


def _crashes(out: Output, pipeline: Pipeline) -> None:
    columns = ("immortal", "killed", "at stored", "at aggregated", "recovered in")
    out.table(
        "the SIGKILLs, and the recoveries",
        [(c, "left" if c in ("immortal", "killed") else "right") for c in columns],
        [
            (
                c.kill.service,
                c.kill.which,
                f"{c.stored:,}",
                f"{c.aggregated:,}",
                f"{c.recovered_in:.1f} s",
            )
            for c in pipeline.crashes
        ],
    )


def _sensors(out: Output, manifest: dict[str, Any], state: dict[str, Any]) -> None:
    """The busiest sensors: what the worker aggregated beside what the producer made."""
    shown = 5
    columns = ("sensor", "count", "produced", "sum", "produced", "mean")
    counts, sums = state.get("counts", {}), state.get("sums", {})
    rows = []
    for key in sorted(manifest["counts"], key=lambda k: -manifest["counts"][k])[:shown]:
        count, total = counts.get(key, 0), sums.get(key, 0)
        rows.append(
            (
                key,
                f"{count:,}",
                f"{manifest['counts'][key]:,}",
                f"{total:,}",
                f"{manifest['sums'][key]:,}",
                f"{total / count / 10:.2f}" if count else "-",  # values are tenths of a degree
            )
        )
    out.table(
        f"the busiest {shown} of {len(manifest['counts'])} sensors",
        [(c, "left" if c == "sensor" else "right") for c in columns],
        rows,
    )


def _analytics(out: Output, analytics: Analytics, workdir: Path) -> None:
    if analytics.report is not None:
        out.print(f"Spark report over every log: {analytics.report}", style="bold")
    elif analytics.ran:
        log = workdir / "logs" / "analyze.log"
        out.rule("the end of ambrosia-py analyze's output")
        out.verbatim(log.read_text(errors="replace")[-3000:])
        out.print(analytics.message, style="bold red")
    else:  # not markup: the install line's "[spark]" is text
        out.print(analytics.message, style="yellow", markup=False)
