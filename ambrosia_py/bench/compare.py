"""``ambrosia-py bench compare``: ours beside the peers and the machine's limits, one run.

This machine's disk and CPU swing by 2-4x from minute to minute, so a figure measured
at another time proves nothing about a ratio; only ratios taken in one run hold. One
invocation measures, ``--runs`` times, interleaved (limits, gRPC, DBOS, Restate,
Temporal, ours; then again) so a slow minute hits every party alike, and reports each
figure's median:

- **limits** (``compare_limits``): fdatasync'ed writes/s and sequential MB/s in the
  data dir's filesystem; raw asyncio loopback msgs/s between two processes; the floor
  under an awaited round trip, its path with no work (``compare_floor``);
- **grpc** (``compare_grpc``): grpcio client-streaming between two processes, raw bytes;
- **dbos** (``compare_dbos``): DBOS on SQLite, durable steps/s and workflows/s, and
  the syncs of one workflow, counted;
- **restate**, **temporal** (``compare_restate``, ``compare_temporal``): their servers
  and SDKs, each with its defaults: a durable counter called by ordinary programs, one
  after the other and 16 at once, and one service awaiting another's handler
  (``compare_callers``), each with its syncs per call counted;
- **ours** (``compare_ours``): durable forks and awaited calls between two immortals on
  two coordinators, replay after SIGKILL, failover, memory; and the same counter as the
  peers', called through the ingress (``compare_ours_ingress``).

The peers are optional (the ``bench`` extra, and Restate's server from npm: ``make
bench`` installs them all); one that is not installed, or does not start, is named on
one line and skipped, and the rest is still measured; a run left with nothing to
measure, or asked for ``--charts`` without matplotlib, stops first
(:mod:`ambrosia_py.extras`). Every peer's processes run in their own temporary dirs and
process groups and are gone when its measure ends, whether it ends well, fails or is
interrupted (``compare_peer_process``). ``--json`` ends the output with the medians as
one JSON object, and the goals' ratios in it (``compare_report`` has its shape).
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
from . import compare_dbos, compare_grpc, compare_restate, compare_temporal
from .compare_callers import CallPlan
from .compare_floor import MODES, measure_await_floor
from .compare_limits import loopback_server, measure_disk_limits, measure_loopback
from .compare_ours import (
    measure_awaits,
    measure_failover_and_memory,
    measure_remote_forks,
    measure_replay,
)
from .compare_ours_ingress import measure_ours_client
from .compare_peer_process import PeerUnavailableError
from .compare_replicas import measure_replication
from .compare_report import (
    SECTIONS,
    SIZES,
    Figures,
    Results,
    goal_ratios,
    markdown,
    median_results,
    print_tables,
    write_charts,
)

__all__ = ["FULL", "Plan", "QUICK", "compare_bench", "run_restate", "run_temporal"]

REPLAY_DEADLINE = 180.0
# Each run; the medians keep SECTIONS' order.
ORDER = ("limits", "grpc", "dbos", "restate", "temporal", "ours", "replicas")
# The peers that are programs of their own: why each cannot run here, or None.
SERVERS: dict[str, Callable[[], str | None]] = {
    "restate": compare_restate.unavailable,
    "temporal": compare_temporal.unavailable,
}


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
    calls: CallPlan  # a counter called by programs, and one service awaiting another


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
    calls=CallPlan(),
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
    calls=CallPlan(
        sequential=20, sequential_cap_s=1.5, concurrent_cap_s=1.0, awaits=10, sync_batch=5
    ),
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


def run_dbos_syncs(plan: Plan, directory: Path) -> Figures:
    """DBOS's syncs per one-step workflow, counted (none where they cannot be)."""
    syncs = compare_dbos.measure_dbos_syncs(directory / "dbos-syncs", plan.calls.sync_batch)
    return {} if syncs is None else {"workflow_syncs_per_call": syncs}


def run_restate(plan: Plan, directory: Path) -> Figures:
    return dict(compare_restate.measure_restate(directory / "restate", plan.calls))


def run_temporal(plan: Plan, directory: Path) -> Figures:
    return dict(compare_temporal.measure_temporal(directory / "temporal", plan.calls))


def run_replicas(plan: Plan, directory: Path) -> Figures:
    """Replication's cost and failover (:mod:`.compare_replicas`)."""
    figures = measure_replication(directory, quick=plan is QUICK)
    return dict(figures.as_dict())


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
    figures.update(measure_ours_client(directory / "client", plan.calls))
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
    help="Measure only these (repeatable); --json holds only these.",
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
    """Ours against gRPC, DBOS, Restate, Temporal and this machine's limits, in one run;
    with replicas, what replication costs and how fast failover is."""
    plan = QUICK if quick else FULL
    runs = runs if runs is not None else (1 if quick else 3)
    if runs < 1:
        raise click.BadParameter("at least one run", param_hint="--runs")
    console = Console(width=160)
    note = Console(stderr=True, width=160)
    wanted = set(only or SECTIONS)
    if charts is not None:
        require("matplotlib")  # now, not after the measures
    asked = [section for section in SECTIONS if section in wanted]
    absent = [peer for peer in ("grpc", "dbos") if peer in wanted and missing(peer)]
    why_not = {peer: why for peer, check in SERVERS.items() if peer in wanted and (why := check())}
    if absent and wanted <= {*absent, *why_not}:
        require(*absent)  # nothing else asked for: nothing to measure
    if why_not and wanted <= set(why_not):
        raise click.ClickException("; ".join(f"{p}: {why}" for p, why in why_not.items()))
    for peer in absent:
        hint = install_command("bench")
        note.print(f"{peer}: not installed, not measured; to measure it: {hint}")
        wanted.discard(peer)
    skipped: dict[str, str] = {}
    for server, why in why_not.items():
        skipped[server] = f"not installed, not measured: {why}"
        note.print(f"{server}: {skipped[server]}", markup=False, highlight=False)
        wanted.discard(server)
    if base is not None:
        base.mkdir(parents=True, exist_ok=True)
    measures: dict[str, Callable[[Path, int], Figures]] = {
        "limits": lambda d, i: run_limits(plan, d),
        "grpc": lambda d, i: run_grpc(plan, d),
        "dbos": lambda d, i: {**run_dbos(plan, d), **run_dbos_syncs(plan, d)},
        "restate": lambda d, i: run_restate(plan, d),
        "temporal": lambda d, i: run_temporal(plan, d),
        "ours": lambda d, i: run_ours(plan, d, i),
        "replicas": lambda d, i: run_replicas(plan, d),
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
                except PeerUnavailableError as exc:  # named, and not tried again
                    skipped[section] = f"did not start, not measured: {exc}"
                    note.print(f"{section}: {skipped[section]}", markup=False, highlight=False)
                    wanted.discard(section)
                    continue
                except Exception:
                    failed += 1
                    note.print(f"{section}, run {i + 1}: failed\n{traceback.format_exc()}")
                    continue
                note.print(f"{section}, run {i + 1}/{runs}: {time.perf_counter() - start:.1f} s")
            all_runs.append(results)
    medians = median_results(all_runs)
    print_tables(console, medians, runs, skipped)
    if charts is not None:
        for path in write_charts(medians, charts):
            note.print(f"wrote {path}")
    if md is not None:
        md.write_text(markdown(medians, runs, skipped))
        note.print(f"wrote {md}")
    if as_json:
        out = {section: medians[section] for section in asked}
        if "ours" in out and (ratios := goal_ratios(medians)):
            out["ours"] = {**out["ours"], "goals": ratios}
        sys.stdout.flush()
        print(json.dumps(out, sort_keys=True))
    if failed:
        raise SystemExit(f"{failed} measure(s) failed (above)")
