"""The demo's last step: ``ambrosia-py analyze`` (Spark) over every log the pipeline wrote.

It runs the command as a child process, as a user would, on the data directory the
three immortals shared, naming their methods after the three services. Where it cannot
run (no Java, no ``spark`` extra) it says in one line what to install and the demo goes
on: the pipeline's check stands on its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import attrs
from rich.console import Console

from ..extras import EXTRAS, install_command, missing

__all__ = ["Analytics", "run_analytics"]

SERVICES = ("immortals.ockam.hub", "immortals.wallaroo.connector", "immortals.wallaroo.worker")


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
    console: Console, data_dir: Path, out: Path, log: Path, timeout: float
) -> Analytics:
    """``ambrosia-py analyze DATA_DIR --out OUT``, its output in ``log``."""
    import time

    problem = why_not()
    if problem is not None:
        return Analytics(False, None, f"Spark analytics skipped: {problem}")
    argv = [sys.executable, "-m", "ambrosia_py.cli", "analyze", str(data_dir), "--out", str(out)]
    for service in SERVICES:
        argv += ["--service", service]
    start = time.monotonic()
    with (
        log.open("wb") as output,
        console.status(f"Spark: ambrosia-py analyze {data_dir} (output in {log})"),
    ):
        try:
            done = subprocess.run(
                argv, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            return Analytics(True, None, f"ambrosia-py analyze took over {timeout:g} s")
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
