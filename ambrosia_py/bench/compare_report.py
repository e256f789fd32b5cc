"""Medians, ratios, goals, tables and charts for ``bench compare``.

The figures of one run are ``{section: {measure: value or {payload size: value}}}``,
sections ``ours``, ``grpc``, ``dbos``, ``restate``, ``temporal`` and ``limits`` (the
``--json`` shape). This module reduces several runs to medians, works out the ratios
between sections and where each performance goal stands (:func:`goals`;
:func:`goal_ratios` for ``--json``), and renders them: rich tables for the terminal,
Markdown for ``docs/performance.md``, and PNG charts (matplotlib, from the ``spark``
extra). A peer's syncs per call are shown as counted in the run where they were, and
else as documented (:data:`DOCUMENTED_SYNCS`), marked so.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
from rich.console import Console
from rich.table import Table

from .. import eventloop
from .compare_replicas_report import replica_goals, replica_tables

__all__ = [
    "Figures",
    "Goal",
    "Results",
    "DOCUMENTED_SYNCS",
    "SECTIONS",
    "SIZES",
    "goal_ratios",
    "goals",
    "markdown",
    "median_results",
    "print_tables",
    "tables",
    "write_charts",
]

SIZES = (16, 1024, 64 * 1024)
SECTIONS = ("ours", "grpc", "dbos", "restate", "temporal", "limits", "replicas")
# ``fsync`` plus ``fdatasync`` per call, shown where the run could not count them: what
# strace counted on this machine before (docs/performance.md), and for ours' awaited
# call the design's two (each coordinator makes its input durable before its binding
# sees it). {section: (per call from a program, per awaited call)}.
DOCUMENTED_SYNCS: dict[str, tuple[float | None, float | None]] = {
    "ours": (1.0, 2.0),
    "restate": (3.0, None),
    "temporal": (60.0, None),
    "dbos": (12.0, None),
}
Figures = dict[str, float | dict[str, float]]
Results = dict[str, Figures]


def median_results(runs: Sequence[Results]) -> Results:
    """Each figure's median over the runs that measured it."""
    out: Results = {section: {} for section in SECTIONS}
    for section in SECTIONS:
        measures = {m: None for run in runs for m in run.get(section, {})}
        for measure in measures:
            values = [run[section][measure] for run in runs if measure in run.get(section, {})]
            if isinstance(values[0], dict):
                keys = {k: None for v in values if isinstance(v, dict) for k in v}
                out[section][measure] = {
                    k: statistics.median(v[k] for v in values if isinstance(v, dict) and k in v)
                    for k in keys
                }
            else:
                out[section][measure] = statistics.median(
                    v for v in values if isinstance(v, float | int)
                )
    return out


def _get(results: Results, section: str, measure: str, size: int | None = None) -> float | None:
    value = results.get(section, {}).get(measure)
    if isinstance(value, dict):
        return value.get(str(size)) if size is not None else None
    return value if size is None else None


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ratio(a: float | None, b: float | None) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _size(size: int) -> str:
    return f"{size // 1024} KiB" if size >= 1024 else f"{size} B"


def _fdatasync_ms(results: Results) -> float | None:
    """One ``fdatasync``, ms: the inverse of the measured rate of fdatasync'ed writes."""
    syncs = _get(results, "limits", "fdatasync_writes_per_s")
    return None if not syncs else 1e3 / syncs


def _await_bar_ms(results: Results) -> float | None:
    """The awaited round trip's goal: 1 ms plus one ``fdatasync``."""
    sync = _fdatasync_ms(results)
    return None if sync is None else 1.0 + sync


def _small_sync_ms(results: Results) -> float | None:
    """One ``fdatasync`` of a 256 B write into preallocated space, ms (what a small record
    costs our log): the stricter reading of the await goal's "one fdatasync"."""
    syncs = _get(results, "limits", "fdatasync_small_prealloc_writes_per_s")
    return None if not syncs else 1e3 / syncs


@attrs.frozen
class Goal:
    """One performance goal: what it asks, what we measured, and the ratio to the bar
    (``met`` is None when a figure it needs was not measured)."""

    key: str  # its name in ``--json``'s ``ours.goals``
    what: str
    short: str  # for the chart
    target: str
    measured: str
    ratio: float | None
    met: bool | None


def goals(results: Results) -> list[Goal]:
    """Where each performance goal stands in these figures (ratio >= 1 means met): the
    bars of the table "Performance goals" in docs/performance.md."""

    def goal(
        key: str, what: str, short: str, target: str, measured: str, ratio: float | None
    ) -> Goal:
        met = None if ratio is None else ratio >= 1.0
        return Goal(key, what, short, target, measured, ratio, met)

    fork16 = _get(results, "ours", "remote_fork_msgs_per_s", 16)
    grpc16 = _get(results, "grpc", "msgs_per_s", 16)
    fork64_mb = _get(results, "ours", "remote_fork_mb_per_s", SIZES[-1])
    seq_mb = _get(results, "limits", "fdatasync_seq_write_mb_per_s")
    steps16 = _get(results, "dbos", "steps_per_s", 16)
    replay = _get(results, "ours", "replay_calls_per_s")
    failover = _get(results, "ours", "failover_s")
    p50 = _get(results, "ours", "remote_await_p50_ms", 16)
    p50_bar = _await_bar_ms(results)
    floor = _get(results, "limits", "await_floor_asyncio_p50_ms")
    return [
        goal(
            "forks_vs_grpc",
            "durable forks between two instances vs non-durable gRPC, 16 B",
            "forks vs gRPC, 16 B (>= 5x)",
            ">= 5x",
            _ratio(fork16, grpc16),
            _over(fork16, grpc16, 5.0),
        ),
        goal(
            "forks_64k_disk_share",
            "durable forks between two instances, 64 KiB, share of fdatasync'ed seq. bandwidth",
            "forks 64 KiB vs disk MB/s (>= 50%)",
            ">= 50%",
            "-" if fork64_mb is None or not seq_mb else f"{100 * fork64_mb / seq_mb:.0f}%",
            _over(fork64_mb, seq_mb, 0.5),
        ),
        goal(
            "forks_vs_dbos_steps",
            "durable forks vs DBOS durable steps, 16 B",
            "forks vs DBOS steps (>= 20x)",
            ">= 20x",
            _ratio(fork16, steps16),
            _over(fork16, steps16, 20.0),
        ),
        goal(
            "replay",
            "replay after SIGKILL (logged calls/s)",
            "replay (>= 200k calls/s)",
            ">= 200,000/s",
            f"{_num(replay)}/s",
            _over(replay, 200_000.0),
        ),
        goal(
            "failover",
            "failover after SIGKILL of the service process",
            "failover (< 2 s)",
            "< 2 s",
            f"{_num(failover, 2)} s",
            None if failover is None else 2.0 / failover,
        ),
        goal(
            "await_p50",
            "async/await round trip between two instances, p50, 16 B",
            "await p50 (< 1 ms + fdatasync)",
            f"< 1 ms + one fdatasync ({_num(p50_bar, 2)} ms)",
            f"{_num(p50, 2)} ms (with no work: {_num(floor, 2)} ms)",
            None if p50 is None or p50_bar is None else p50_bar / p50,
        ),
        *_peer_goals(results, goal),
        *(goal(*row) for row in replica_goals(results.get("replicas", {}))),
    ]


def _peer_goals(results: Results, goal: Callable[..., Goal]) -> list[Goal]:
    """The goals against Restate, Temporal and DBOS on the work each is measured on: a
    counter called from ordinary programs (one after the other, and 16 at once), and
    one service awaiting another's handler."""
    p50 = _get(results, "ours", "client_p50_ms")
    many = _get(results, "ours", "client_concurrent_calls_per_s")
    await_p50 = _get(results, "ours", "remote_await_p50_ms", SIZES[0])
    out = []
    for section, name, factor in (("restate", "Restate", 5.0), ("temporal", "Temporal", 100.0)):
        their_p50 = _get(results, section, "client_p50_ms")
        their_many = _get(results, section, "client_concurrent_calls_per_s")
        their_await = _get(results, section, "await_p50_ms")
        many_factor, await_factor = (20.0, 10.0) if section == "restate" else (factor, factor)
        out += [
            goal(
                f"client_p50_vs_{section}",
                f"a program's calls to a durable counter, p50, vs {name}'s",
                f"client p50 vs {name} (<= 1/{factor:.0f})",
                f"<= 1/{factor:.0f} of {name}'s",
                f"{_num(p50, 2)} vs {_num(their_p50, 2)} ms ({_ratio(their_p50, p50)} lower)",
                _over(their_p50, p50, factor),
            ),
            goal(
                f"client_concurrent_vs_{section}",
                f"16 programs calling a durable counter, calls/s, vs {name}'s",
                f"16 callers vs {name} (>= {many_factor:.0f}x)",
                f">= {many_factor:.0f}x",
                f"{_num(many)} vs {_num(their_many, 1)} calls/s ({_ratio(many, their_many)})",
                _over(many, their_many, many_factor),
            ),
            goal(
                f"await_p50_vs_{section}",
                f"one service awaiting another's handler, p50, vs {name}'s",
                f"await p50 vs {name} (<= 1/{await_factor:.0f})",
                f"<= 1/{await_factor:.0f} of {name}'s",
                f"{_num(await_p50, 2)} vs {_num(their_await, 2)} ms "
                f"({_ratio(their_await, await_p50)} lower)",
                _over(their_await, await_p50, await_factor),
            ),
        ]
    one = _get(results, "ours", "client_calls_per_s")
    workflows = _get(results, "dbos", "workflows_per_s", SIZES[0])
    out.append(
        goal(
            "client_vs_dbos",
            "a program's calls one after the other vs DBOS one-step workflows, calls/s",
            "client calls vs DBOS workflows (>= 20x)",
            ">= 20x",
            f"{_num(one)} vs {_num(workflows)} /s ({_ratio(one, workflows)})",
            _over(one, workflows, 20.0),
        )
    )
    return out


def _over(a: float | None, b: float | None, factor: float = 1.0) -> float | None:
    """``a`` as a multiple of ``factor`` times ``b`` (>= 1: the goal is met)."""
    return None if a is None or not b else a / (b * factor)


def goal_ratios(results: Results) -> dict[str, float]:
    """Each measured goal's ratio to its bar, by key (>= 1: met), for ``--json``."""
    return {g.key: g.ratio for g in goals(results) if g.ratio is not None}


def tables(results: Results, runs: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """The report as (title, columns, rows) tables, for rich and for Markdown alike."""
    g = results
    out = []
    rows = []
    for size in SIZES:
        fork = _get(g, "ours", "remote_fork_msgs_per_s", size)
        grpc = _get(g, "grpc", "msgs_per_s", size)
        loop = _get(g, "limits", "loopback_msgs_per_s", size)
        steps = _get(g, "dbos", "steps_per_s", size)
        rows.append(
            [
                _size(size),
                _num(fork),
                _num(_get(g, "ours", "remote_fork_mb_per_s", size), 1),
                _num(grpc),
                _ratio(fork, grpc),
                _num(loop),
                _ratio(fork, loop),
                _num(steps),
                _ratio(fork, steps),
            ]
        )
    out.append(
        (
            f"One-way messages between two processes, msgs/s (median of {runs} runs)",
            [
                "payload",
                "ours: durable forks",
                "ours MB/s",
                "gRPC stream (not durable)",
                "ours/gRPC",
                f"{eventloop.loop_name()} loopback (limit)",
                "ours/limit",
                "DBOS steps",
                "ours/DBOS",
            ],
            rows,
        )
    )
    rows = []
    for size in SIZES:
        calls = _get(g, "ours", "remote_await_calls_per_s", size)
        wfs = _get(g, "dbos", "workflows_per_s", size)
        rows.append(
            [
                _size(size),
                _num(calls),
                _num(_get(g, "ours", "remote_await_p50_ms", size), 2),
                _num(wfs),
                _ratio(calls, wfs),
                _num(_get(g, "dbos", "steps_per_s", size)),
            ]
        )
    out.append(
        (
            "Durable calls one after the other: ours awaited between two instances, DBOS",
            [
                "payload",
                "ours: awaited calls/s",
                "ours p50 ms",
                "DBOS workflows/s",
                "ours/DBOS",
                "DBOS steps/s",
            ],
            rows,
        )
    )
    out.append(_peer_table(g))
    p50 = _get(g, "ours", "remote_await_p50_ms", SIZES[0])
    floor = _get(g, "limits", "await_floor_asyncio_p50_ms")
    bare = _get(g, "limits", "await_floor_blocking_p50_ms")
    small = _small_sync_ms(g)
    out.append(
        (
            f"An awaited round trip, {_size(SIZES[0])}, p50 ms: ours and its path with no work "
            "(6 crossings, 2 fdatasyncs)",
            [
                "ours",
                f"no work, {eventloop.loop_name()} (floor)",
                "ours/floor",
                "no work, no event loop",
                "one fdatasync (4 KiB)",
                "goal: 1 ms + one fdatasync",
                "fdatasync, 256 B preallocated",
                "1 ms + that",
            ],
            [
                [
                    _num(p50, 2),
                    _num(floor, 2),
                    _ratio(p50, floor),
                    _num(bare, 2),
                    _num(_fdatasync_ms(g), 2),
                    _num(_await_bar_ms(g), 2),
                    _num(small, 2),
                    _num(None if small is None else 1.0 + small, 2),
                ]
            ],
        )
    )
    seq = _get(g, "limits", "fdatasync_seq_write_mb_per_s")
    big = _get(g, "ours", "remote_fork_mb_per_s", SIZES[-1])
    syncs = _get(g, "limits", "fdatasync_writes_per_s")
    out.append(
        (
            "The disk of the data dir",
            [
                "fdatasync'ed 4 KiB writes/s",
                "seq. MB/s (4 MiB + fdatasync)",
                "ours 64 KiB MB/s",
                "ours/limit",
            ],
            [[_num(syncs), _num(seq, 1), _num(big, 1), _ratio(big, seq)]],
        )
    )
    out.append(
        (
            "Recovery and memory (ours)",
            ["measure", "value"],
            [
                [
                    "replay after SIGKILL, logged calls/s",
                    _num(_get(g, "ours", "replay_calls_per_s")),
                ],
                ["replay, log records/s", _num(_get(g, "ours", "replay_records_per_s"))],
                ["log records replayed (group commits)", _num(_get(g, "ours", "replay_records"))],
                ["restart with that log, s", _num(_get(g, "ours", "recovery_s"), 2)],
                ["failover after SIGKILL, s", _num(_get(g, "ours", "failover_s"), 2)],
                ["RSS idle: service / coordinator, MiB", _pair(g, "rss_idle")],
                ["RSS peak under load: service / coordinator, MiB", _pair(g, "rss_load")],
            ],
        )
    )
    out += replica_tables(results.get("replicas", {}), runs)
    out.append(
        (
            "Performance goals",
            ["goal", "target", "measured", "met"],
            [
                [x.what, x.target, x.measured, {True: "yes", False: "no", None: "-"}[x.met]]
                for x in goals(results)
            ],
        )
    )
    return out


def _syncs(results: Results, section: str, measure: str, documented: float | None) -> str:
    """Syncs per call: as counted in this run, else as documented, marked so."""
    counted = _get(results, section, measure)
    if counted is not None:
        return f"{counted:,.1f} counted"
    return "-" if documented is None else f"{documented:g} documented, not counted"


def _peer_table(g: Results) -> tuple[str, list[str], list[list[str]]]:
    """Ours, Restate, Temporal and DBOS on the same work, each with its durability."""
    rows = []
    for section, name in (
        ("ours", "ours: ingress; awaited between two instances"),
        ("restate", "Restate: Virtual Object over HTTP; ctx.service_call"),
        ("temporal", "Temporal: workflow + activity; activities awaited"),
    ):
        client, awaited = DOCUMENTED_SYNCS[section]
        await_p50 = (
            _get(g, "ours", "remote_await_p50_ms", SIZES[0])
            if section == "ours"
            else _get(g, section, "await_p50_ms")
        )
        rows.append(
            [
                name,
                _num(_get(g, section, "client_p50_ms"), 2),
                _num(_get(g, section, "client_p99_ms"), 2),
                _num(_get(g, section, "client_calls_per_s"), 1),
                _num(_get(g, section, "client_concurrent_calls_per_s"), 1),
                _syncs(g, section, "client_syncs_per_call", client),
                _num(await_p50, 2),
                _syncs(g, section, "await_syncs_per_call", awaited),
            ]
        )
    client, _ = DOCUMENTED_SYNCS["dbos"]
    workflows = _get(g, "dbos", "workflows_per_s", SIZES[0])
    dbos_syncs = _syncs(g, "dbos", "workflow_syncs_per_call", client)
    rows.append(
        ["DBOS: one-step workflow", "-", "-", _num(workflows, 1), "-", dbos_syncs, "-", "-"]
    )
    return (
        "A durable counter called by ordinary programs (16 B or less), and one service "
        "awaiting another's handler; syncs: fsync + fdatasync per call",
        [
            "party: calls; awaited",
            "p50 ms",
            "p99 ms",
            "calls/s, 1 caller",
            "calls/s, 16 callers",
            "syncs per call",
            "awaited p50 ms",
            "syncs per awaited call",
        ],
        rows,
    )


def _pair(results: Results, prefix: str) -> str:
    a = _get(results, "ours", f"{prefix}_service_mib")
    b = _get(results, "ours", f"{prefix}_coordinator_mib")
    return f"{_num(a, 1)} / {_num(b, 1)}"


def print_tables(
    console: Console, results: Results, runs: int, skipped: Mapping[str, str] | None = None
) -> None:
    """The tables, then one line for each peer that was not measured, and why."""
    for title, columns, rows in tables(results, runs):
        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    for section, why in (skipped or {}).items():
        console.print(f"{section}: {why}", markup=False, highlight=False)


def markdown(results: Results, runs: int, skipped: Mapping[str, str] | None = None) -> str:
    """The same tables in Markdown (for ``docs/performance.md``)."""
    parts = []
    for title, columns, rows in tables(results, runs):
        lines = [f"**{title}**", "", "| " + " | ".join(columns) + " |"]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        parts.append("\n".join(lines))
    parts += [f"{section}: {why}" for section, why in (skipped or {}).items()]
    return "\n\n".join(parts) + "\n"


def write_charts(results: Results, directory: Path) -> list[Path]:
    """Two PNGs: msgs/s by payload size for every party (log scale), and each goal's
    measured figure as a multiple of its bar."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    series = [
        ("ours: durable forks", "ours", "remote_fork_msgs_per_s"),
        ("ours: awaited calls", "ours", "remote_await_calls_per_s"),
        ("gRPC stream (not durable)", "grpc", "msgs_per_s"),
        (f"{eventloop.loop_name()} loopback (limit)", "limits", "loopback_msgs_per_s"),
        ("DBOS steps", "dbos", "steps_per_s"),
        ("DBOS workflows", "dbos", "workflows_per_s"),
    ]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / len(series)
    for i, (label, section, measure) in enumerate(series):
        values = [_get(results, section, measure, size) or 0.0 for size in SIZES]
        xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(SIZES))]
        ax.bar(xs, values, width, label=label)
    ax.set_xticks(range(len(SIZES)), [_size(s) for s in SIZES])
    ax.set_yscale("log")
    ax.set_ylabel("messages or calls per second (log)")
    ax.set_title("Between two processes, by payload size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    throughput = directory / "throughput.png"
    fig.savefig(throughput, dpi=110)
    plt.close(fig)

    measured = [x for x in goals(results) if x.ratio is not None]
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(measured) + 1.2))
    colors = ["tab:green" if x.met else "tab:red" for x in measured]
    ratios = [x.ratio or 0.0 for x in measured]
    ax.barh([x.short for x in measured], ratios, color=colors)
    for y, ratio in enumerate(ratios):
        ax.annotate(f" {ratio:.2f}", (ratio, y), va="center", fontsize=8)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.set_xscale("log")
    ax.set_xlabel("measured / goal (>= 1: met)")
    ax.invert_yaxis()
    ax.set_title("Performance goals: measured / goal")
    fig.tight_layout()
    goal_chart = directory / "goals.png"
    fig.savefig(goal_chart, dpi=110)
    plt.close(fig)
    return [throughput, goal_chart]
