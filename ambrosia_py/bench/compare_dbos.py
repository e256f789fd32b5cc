"""The durable peer for ``bench compare``: DBOS on its embedded SQLite.

DBOS is what a Python user would pick for durable execution without a coordinator: a
library that records each step's output and each workflow's status in a system
database. Here that database is a SQLite file in a temporary directory (no Postgres, no
cloud; SQLite's default rollback journal with ``synchronous=FULL``, so every commit is
on disk). The same work as ours, a call that takes a ``size``-byte argument, done two
ways:

- **steps**: one workflow runs ``count`` steps one after the other, each step's input
  and output recorded durably (steps/s);
- **workflows**: ``count`` workflows run one after the other, each one step (workflows/s).

DBOS is a process-wide singleton (``DBOS(config=...)`` then ``DBOS.launch()``), with
threads and a database engine of its own, so it runs in a child process
(:func:`child`) that prints its figures
as one JSON line; nothing of it leaks into the bench process.

What it makes durable is counted in another child (:func:`syncs_child`), which runs
one-step workflows when told to on its standard input, between two lines, while this
process counts its ``fsync`` and ``fdatasync`` calls
(:func:`~.compare_peer_process.count_syncs`): :func:`measure_dbos_syncs`.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from ..extras import missing
from ..testing.processes import readline_within
from .compare_peer_process import count_syncs

__all__ = ["available", "child", "measure_dbos", "measure_dbos_syncs", "syncs_child"]

WARM_UP = 5  # the first workflows pay for table creation and cold caches


def available() -> bool:
    """dbos is installed (``pip install -e '.[bench]'``)."""
    return not missing("dbos")


def measure_dbos(directory: Path, sizes: list[int], count: int) -> dict[str, dict[str, float]]:
    """``{"steps_per_s": {size: ...}, "workflows_per_s": {size: ...}}`` from a child."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", _CHILD, str(directory), str(count), *map(str, sizes)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1800, check=False)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"the DBOS run failed ({done.returncode}):\n{done.stderr[-3000:]}")
    figures: dict[str, dict[str, float]] = json.loads(lines[-1])
    return figures


def child(argv: list[str]) -> None:
    """The child process: ``DIR COUNT SIZE...``; prints the figures as one JSON line."""
    print(json.dumps(_measure(Path(argv[0]), int(argv[1]), [int(s) for s in argv[2:]])))


# Not ``-m`` this module: runpy warns when the package has imported it already.
_CHILD = f"import sys; from {__name__} import child; child(sys.argv[1:])"


def measure_dbos_syncs(directory: Path, count: int) -> float | None:
    """``fsync`` plus ``fdatasync`` calls per one-step workflow, counted over ``count``
    of them after a warm-up; None where they cannot be counted here."""
    directory.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, "-c", _SYNCS_CHILD, str(directory), str(count)]
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout
        _expect(stdout, "ready", proc)

        def batch() -> None:
            stdin.write("go\n")
            stdin.flush()
            _expect(stdout, "done", proc)

        _, syncs = count_syncs([proc.pid], directory / "syncs", batch)
        stdin.write("stop\n")
        stdin.flush()
        proc.wait(60)
        return None if syncs is None else syncs / count
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def _expect(stdout: IO[str], word: str, proc: subprocess.Popen[str]) -> None:
    line = readline_within(stdout, 300.0).strip()
    if line != word:
        proc.kill()
        err = proc.stderr.read()[-2000:] if proc.stderr else ""
        raise RuntimeError(f"the DBOS child said {line!r}, not {word!r}:\n{err}")


def syncs_child(argv: list[str]) -> None:
    """The child process: ``DIR COUNT``; says ``ready``, runs COUNT one-step workflows
    when a line comes, says ``done``, and stops at the next line."""
    directory, count = Path(argv[0]), int(argv[1])

    def ready(one: One, steps: Steps) -> None:
        print("ready", flush=True)
        sys.stdin.readline()
        for _ in range(count):
            one(b"x" * 16)
        print("done", flush=True)
        sys.stdin.readline()

    _launched(directory, ready)


_SYNCS_CHILD = f"import sys; from {__name__} import syncs_child; syncs_child(sys.argv[1:])"


def _measure(directory: Path, count: int, sizes: list[int]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, Any]] = {"steps_per_s": {}, "workflows_per_s": {}}

    def measure(one: One, steps: Steps) -> None:
        steps(WARM_UP, 16)
        for size in sizes:
            start = time.perf_counter()
            if steps(count, size) != count * size:
                raise RuntimeError("DBOS steps returned a wrong total")
            out["steps_per_s"][str(size)] = count / (time.perf_counter() - start)
            data = b"x" * size
            start = time.perf_counter()
            for _ in range(count):
                one(data)
            out["workflows_per_s"][str(size)] = count / (time.perf_counter() - start)

    _launched(directory, measure)
    return out


One = Callable[[bytes], int]  # the one-step workflow
Steps = Callable[[int, int], int]  # the workflow of ``k`` steps of ``size`` bytes


def _launched(directory: Path, body: Callable[[One, Steps], None]) -> None:
    """Launch DBOS on a SQLite file in ``directory``, warm it up, run ``body`` with its
    two workflows, and destroy it."""
    from dbos import DBOS, DBOSConfig  # type: ignore[import-not-found,unused-ignore]

    config: DBOSConfig = {
        "name": "ambrosia-bench",
        "system_database_url": f"sqlite:///{directory / 'dbos-system.sqlite'}",
        "log_level": "WARNING",
    }
    DBOS(config=config)

    @DBOS.step()
    def work(data: bytes) -> int:
        return len(data)

    @DBOS.workflow()
    def steps(k: int, size: int) -> int:
        data = b"x" * size
        return sum(work(data) for _ in range(k))

    @DBOS.workflow()
    def one(data: bytes) -> int:
        return work(data)

    DBOS.launch()
    try:
        for _ in range(WARM_UP):
            one(b"x" * 16)
        body(one, steps)
    finally:
        DBOS.destroy()
