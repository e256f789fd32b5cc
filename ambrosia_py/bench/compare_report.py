"""Medians, ratios, goals, tables and charts for ``bench compare``.

The figures of one run are ``{section: {measure: value or {payload size: value}}}``,
sections ``ours``, ``grpc``, ``dbos`` and ``limits`` (the ``--json`` shape). This module
reduces several runs to medians, works out the ratios between sections and where each
performance goal stands (:func:`goals`), and renders them: rich tables for the terminal,
Markdown for ``docs/performance.md``, and PNG charts (matplotlib, from the ``spark``
extra).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

import attrs
from rich.console import Console
from rich.table import Table

from .. import eventloop

__all__ = [
    "Figures",
    "Goal",
    "Results",
    "SECTIONS",
    "SIZES",
    "goals",
    "markdown",
    "median_results",
    "print_tables",
    "tables",
    "write_charts",
]

SIZES = (16, 1024, 64 * 1024)
SECTIONS = ("ours", "grpc", "dbos", "limits")
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

    what: str
    short: str  # for the chart
    target: str
    measured: str
    ratio: float | None
    met: bool | None


def goals(results: Results) -> list[Goal]:
    """Where each performance goal stands in these figures (ratio >= 1 means met): the
    bars of the table "Performance goals" in docs/performance.md."""

    def goal(what: str, short: str, target: str, measured: str, ratio: float | None) -> Goal:
        met = None if ratio is None else ratio >= 1.0
        return Goal(what, short, target, measured, ratio, met)

    def over(a: float | None, b: float | None, factor: float = 1.0) -> float | None:
        return None if a is None or not b else a / (b * factor)

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
            "durable forks between two instances vs non-durable gRPC, 16 B",
            "forks vs gRPC, 16 B (>= 5x)",
            ">= 5x",
            _ratio(fork16, grpc16),
            over(fork16, grpc16, 5.0),
        ),
        goal(
            "durable forks between two instances, 64 KiB, share of fdatasync'ed seq. bandwidth",
            "forks 64 KiB vs disk MB/s (>= 50%)",
            ">= 50%",
            "-" if fork64_mb is None or not seq_mb else f"{100 * fork64_mb / seq_mb:.0f}%",
            over(fork64_mb, seq_mb, 0.5),
        ),
        goal(
            "durable forks vs DBOS durable steps, 16 B",
            "forks vs DBOS steps (>= 20x)",
            ">= 20x",
            _ratio(fork16, steps16),
            over(fork16, steps16, 20.0),
        ),
        goal(
            "replay after SIGKILL (logged calls/s)",
            "replay (>= 200k calls/s)",
            ">= 200,000/s",
            f"{_num(replay)}/s",
            over(replay, 200_000.0),
        ),
        goal(
            "failover after SIGKILL of the service process",
            "failover (< 2 s)",
            "< 2 s",
            f"{_num(failover, 2)} s",
            None if failover is None else 2.0 / failover,
        ),
        goal(
            "async/await round trip between two instances, p50, 16 B",
            "await p50 (< 1 ms + fdatasync)",
            f"< 1 ms + one fdatasync ({_num(p50_bar, 2)} ms)",
            f"{_num(p50, 2)} ms (with no work: {_num(floor, 2)} ms)",
            None if p50 is None or p50_bar is None else p50_bar / p50,
        ),
    ]


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


def _pair(results: Results, prefix: str) -> str:
    a = _get(results, "ours", f"{prefix}_service_mib")
    b = _get(results, "ours", f"{prefix}_coordinator_mib")
    return f"{_num(a, 1)} / {_num(b, 1)}"


def print_tables(console: Console, results: Results, runs: int) -> None:
    for title, columns, rows in tables(results, runs):
        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)


def markdown(results: Results, runs: int) -> str:
    """The same tables in Markdown (for ``docs/performance.md``)."""
    parts = []
    for title, columns, rows in tables(results, runs):
        lines = [f"**{title}**", "", "| " + " | ".join(columns) + " |"]
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(columns) - 1)) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        parts.append("\n".join(lines))
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
