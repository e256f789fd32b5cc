"""The demo's last step: ``ambrosia-py analyze`` (Spark) over every log the pipeline wrote.

It runs the command as a child process, as a user would, on the data directory the
three immortals shared, naming their methods after the three services. Where it cannot
run (no Java, no ``spark`` extra) it says in one line what to install and the demo goes
on: the pipeline's check stands on its own.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import attrs

from ..extras import EXTRAS, install_command, missing
from .output import Output

__all__ = ["Analytics", "run_analytics"]

SERVICES = ("immortals.ockam.hub", "immortals.wallaroo.connector", "immortals.wallaroo.worker")
_STEP = "Spark analytics"  # how its lines off a terminal begin


@attrs.frozen
class Analytics:
    """How the step went: ``report`` is the page written (None if skipped or failed)."""

    ran: bool
    report: Path | None
    message: str
    seconds: float = 0.0


def why_not() -> str | None:
    """Why the analytics cannot run here, with what to install; None if they can."""
    from ..spark.session import JAVA_HINT, java_problem

    absent = missing(*EXTRAS["spark"])
    if absent:
        shown = ", ".join(EXTRAS["spark"][m] for m in absent)
        return f"no {shown}; to run them: {install_command('spark')}"
    if java_problem() is not None:
        return f"no Java runtime; to run them: {JAVA_HINT}"
    return None


def run_analytics(
    output: Output,
    data_dir: Path,
    out: Path,
    log: Path,
    timeout: float,
    *,
    argv: Sequence[str] | None = None,
) -> Analytics:
    """``ambrosia-py analyze DATA_DIR --out OUT``, its output in ``log``; ``argv``, a
    command to run instead (whose last line starting ``report:`` names its report).

    In a terminal a spinner runs meanwhile; elsewhere a line says the step started, a
    heartbeat that it still runs, and a line how it ended (:mod:`.output`).
    """
    problem = why_not() if argv is None else None
    if problem is not None:
        return Analytics(False, None, f"Spark analytics skipped: {problem}")
    if argv is None:
        argv = [sys.executable, "-m", "ambrosia_py.cli", "analyze", str(data_dir)]
        argv += ["--out", str(out)]
        for service in SERVICES:
            argv += ["--service", service]
    output.progress(f"{_STEP}: ambrosia-py analyze {data_dir} (output in {log})")
    outcome = _run(output, list(argv), data_dir, log, timeout)
    took = f"{outcome.seconds:.0f} s"
    ended = f"done in {took}" if outcome.report is not None else f"{outcome.message}, after {took}"
    output.progress(f"{_STEP}: {ended}")
    return outcome


def _run(output: Output, argv: list[str], data_dir: Path, log: Path, timeout: float) -> Analytics:
    start = time.monotonic()
    with (
        log.open("wb") as sink,
        output.status(f"Spark: ambrosia-py analyze {data_dir} (output in {log})"),
        output.heartbeat(_STEP),
    ):
        try:
            done = subprocess.run(
                argv, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            took = time.monotonic() - start
            return Analytics(True, None, f"ambrosia-py analyze took over {timeout:g} s", took)
    seconds = time.monotonic() - start
    text = log.read_text(errors="replace")
    reports = [
        line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("report:")
    ]
    if done.returncode != 0 or not reports:
        return Analytics(
            True, None, f"ambrosia-py analyze failed (exit {done.returncode})", seconds
        )
    return Analytics(True, Path(reports[-1]), "", seconds)
