"""``ambrosia-py bench compare``: ours beside the peers and the machine's limits, one run.

This machine's disk and CPU swing by 2-4x from minute to minute, so a figure measured
at another time proves nothing about a ratio; only ratios taken in one run hold. One
invocation measures, ``--runs`` times, interleaved (limits, gRPC, DBOS, ours; then again)
so a slow minute hits every party alike, and reports each figure's median:

- **limits** (``compare_limits``): fdatasync'ed writes/s and sequential MB/s in the
  data dir's filesystem; raw asyncio loopback msgs/s between two processes; the floor
  under an awaited round trip, its path with no work (``compare_floor``);
- **grpc** (``compare_grpc``): grpcio client-streaming between two processes, raw bytes;
- **dbos** (``compare_dbos``): DBOS on SQLite, durable steps/s and workflows/s;
- **ours** (``compare_ours``): durable forks and awaited calls between two immortals on
  two coordinators, replay after SIGKILL, failover, memory.

The peers are optional (the ``bench`` extra); one that is not installed is named, with
what to install, and the rest is still measured; a run left with nothing to measure, or
asked for ``--charts`` without matplotlib, stops first (:mod:`ambrosia_py.extras`).
``--json`` ends the output with the medians as one JSON object (``compare_report`` has
its shape).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import attrs
import click
from rich.console import Console

from ..extras import install_command, missing, require
from ..testing import ImmortalRunner
from . import compare_dbos, compare_grpc
from .compare_floor import MODES, measure_await_floor
from .compare_limits import loopback_server, measure_disk_limits, measure_loopback
from .compare_ours import (
    measure_awaits,
    measure_failover_and_memory,
    measure_remote_forks,
    measure_replay,
)
from .compare_report import (
    SECTIONS,
    SIZES,
    Figures,
    Results,
    markdown,
    median_results,
    print_tables,
    write_charts,
)

__all__ = ["FULL", "Plan", "QUICK", "compare_bench"]

REPLAY_DEADLINE = 180.0
ORDER = ("limits", "grpc", "dbos", "ours")  # each run; the medians keep SECTIONS' order


@attrs.frozen
class Plan:
    """How much each measure does in one run (counts per payload size)."""

    disk_seconds: float
    loopback: dict[int, int]
    grpc: dict[int, int]
    dbos: int
    forks: dict[int, int]
    awaits: int
    floor: int  # round trips through the awaited path's skeleton, each way
    replay: int
    load_calls: int


FULL = Plan(
    disk_seconds=1.0,
    loopback={16: 200_000, 1024: 200_000, SIZES[-1]: 20_000},
    grpc={16: 30_000, 1024: 30_000, SIZES[-1]: 5_000},
    dbos=100,
    forks={16: 50_000, 1024: 30_000, SIZES[-1]: 2_000},
    awaits=300,
    floor=1_000,
    replay=50_000,
    load_calls=10_000,
)
QUICK = Plan(
    disk_seconds=0.2,
    loopback={16: 2_000, 1024: 2_000, SIZES[-1]: 200},
    grpc={16: 1_000, 1024: 1_000, SIZES[-1]: 100},
    dbos=5,
    forks={16: 500, 1024: 500, SIZES[-1]: 20},
    awaits=5,
    floor=20,
    replay=500,
    load_calls=100,
)


def _by_size(values: dict[int, float]) -> dict[str, float]:
    return {str(size): value for size, value in values.items()}


def run_limits(plan: Plan, directory: Path) -> Figures:
    figures: Figures = dict(measure_disk_limits(directory / "disk", plan.disk_seconds))
    with loopback_server(directory).running() as port:
        rates = {s: measure_loopback(port, s, n) for s, n in plan.loopback.items()}
    figures["loopback_msgs_per_s"] = _by_size(rates)
    figures["loopback_mb_per_s"] = _by_size({s: r * s / 1e6 for s, r in rates.items()})
    for mode in MODES:
        p50 = measure_await_floor(directory / f"floor-{mode}", mode, SIZES[0], plan.floor)
        figures[f"await_floor_{mode}_p50_ms"] = p50 * 1e3
    return figures


def run_grpc(plan: Plan, directory: Path) -> Figures:
    with compare_grpc.grpc_server(directory).running() as port:
        rates = {s: compare_grpc.measure_grpc(port, s, n) for s, n in plan.grpc.items()}
    return {
        "msgs_per_s": _by_size(rates),
        "mb_per_s": _by_size({s: r * s / 1e6 for s, r in rates.items()}),
    }


def run_dbos(plan: Plan, directory: Path) -> Figures:
    return dict(compare_dbos.measure_dbos(directory / "dbos", list(SIZES), plan.dbos))


def run_ours(plan: Plan, directory: Path, run: int) -> Figures:
    # Starts wait for the instance to be primary, which after a crash means replayed: a
    # long log on a loaded machine takes longer than the runner's default 30 s deadline.
    runner = ImmortalRunner(directory / "data", timeout=REPLAY_DEADLINE)
    try:
        if (
            run == 0 and plan is not QUICK
        ):  # not reported: the first calls in a process pay for imports and caches
            measure_remote_forks(runner.data_dir, 16, max(1, plan.forks[16] // 10), "-warm-up")
        forks = {
            s: measure_remote_forks(runner.data_dir, s, n, f"-{s}") for s, n in plan.forks.items()
        }
        awaits = measure_awaits(runner.data_dir, SIZES, plan.awaits, "", REPLAY_DEADLINE)
        figures: Figures = {
            "remote_fork_msgs_per_s": _by_size(forks),
            "remote_fork_mb_per_s": _by_size({s: r * s / 1e6 for s, r in forks.items()}),
            "remote_await_calls_per_s": _by_size({s: a[0] for s, a in awaits.items()}),
            "remote_await_p50_ms": _by_size({s: a[1] * 1e3 for s, a in awaits.items()}),
        }
        figures.update(measure_replay(runner, plan.replay, ""))
    finally:
        runner.close()
    figures.update(measure_failover_and_memory(directory / "service", plan.load_calls))
    return figures


@click.command("compare")
@click.option(
    "--runs", type=int, default=None, help="Runs, each figure their median [3; --quick: 1]."
)
@click.option("--quick", is_flag=True, help="Small counts: a fast check that everything runs.")
@click.option(
    "--only",
    type=click.Choice(SECTIONS),
    multiple=True,
    help="Measure only these (repeatable); the others stay empty in the output.",
)
@click.option(
    "--dir",
    "base",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the temporary data dir goes (its filesystem is the disk measured).",
)
@click.option("--json", "as_json", is_flag=True, help="End with the medians as one JSON line.")
@click.option("--charts", type=click.Path(file_okay=False, path_type=Path), help="Write PNGs here.")
@click.option(
    "--markdown",
    "md",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the tables as Markdown here.",
)
def compare_bench(
    runs: int | None,
    quick: bool,
    only: tuple[str, ...],
    base: Path | None,
    as_json: bool,
    charts: Path | None,
    md: Path | None,
) -> None:
    """Ours against gRPC, DBOS and this machine's limits, measured in one run."""
    plan = QUICK if quick else FULL
    runs = runs if runs is not None else (1 if quick else 3)
    if runs < 1:
        raise click.BadParameter("at least one run", param_hint="--runs")
    console = Console(width=160)
    note = Console(stderr=True, width=160)
    wanted = set(only or SECTIONS)
    if charts is not None:
        require("matplotlib")  # now, not after the measures
    absent = [peer for peer in ("grpc", "dbos") if peer in wanted and missing(peer)]
    if absent and wanted <= set(absent):
        require(*absent)  # nothing else asked for: nothing to measure
    for peer in absent:
        hint = install_command("bench")
        note.print(f"{peer}: not installed, not measured; to measure it: {hint}")
        wanted.discard(peer)
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    measures: dict[str, Callable[[Path, int], Figures]] = {
        "limits": lambda d, i: run_limits(plan, d),
        "grpc": lambda d, i: run_grpc(plan, d),
        "dbos": lambda d, i: run_dbos(plan, d),
        "ours": lambda d, i: run_ours(plan, d, i),
    }
    all_runs: list[Results] = []
    failed = 0
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-compare-", dir=base) as tmp:
        for i in range(runs):
            results: Results = {section: {} for section in SECTIONS}
            for section in ORDER:
                if section not in wanted:
                    continue
                directory = Path(tmp) / f"run-{i}" / section
                directory.mkdir(parents=True)
                start = time.perf_counter()
                try:
                    results[section] = measures[section](directory, i)
                except Exception:
                    failed += 1
                    note.print(f"{section}, run {i + 1}: failed\n{traceback.format_exc()}")
                    continue
                note.print(f"{section}, run {i + 1}/{runs}: {time.perf_counter() - start:.1f} s")
            all_runs.append(results)
    medians = median_results(all_runs)
    print_tables(console, medians, runs)
    if charts is not None:
        for path in write_charts(medians, charts):
            note.print(f"wrote {path}")
    if md is not None:
        md.write_text(markdown(medians, runs))
        note.print(f"wrote {md}")
    if as_json:
        sys.stdout.flush()
        print(json.dumps(medians, sort_keys=True))
    if failed:
        raise SystemExit(f"{failed} measure(s) failed (above)")
