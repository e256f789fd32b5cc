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
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..extras import missing

__all__ = ["available", "child", "measure_dbos"]

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


def _measure(directory: Path, count: int, sizes: list[int]) -> dict[str, dict[str, float]]:
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
        steps(WARM_UP, 16)
        for _ in range(WARM_UP):
            one(b"x" * 16)
        out: dict[str, dict[str, Any]] = {"steps_per_s": {}, "workflows_per_s": {}}
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
        return out
    finally:
        DBOS.destroy()
