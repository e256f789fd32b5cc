"""The replication section of ``bench compare``'s report: its goals and its table, from
the medians of :func:`.compare_replicas.measure_replication`'s figures (``--json``'s
``replicas`` section, :meth:`.compare_replicas.ReplicationFigures.as_dict`'s keys).

Goals, each a ratio to its bar (>= 1: met): from SIGKILL of every process of the
primary's machine to the first call answered by the new primary, the median under 1 s
(with a shared SQLite registry, and with etcd); with two and three replicas, a call's p50
at most twice one replica's, and at least half its calls/s with 16 callers (the table
shows standalone's beside them).
"""

from __future__ import annotations

from collections.abc import Mapping

from .compare_replicas import FAILOVER_GOAL_S, P50_GOAL_FACTOR, THROUGHPUT_GOAL_SHARE

__all__ = ["GoalRow", "replica_goals", "replica_tables"]

Figures = Mapping[str, object]
# (key, what, short, target, measured, ratio): what compare_report.goals makes a Goal of.
GoalRow = tuple[str, str, str, str, str, float | None]
REGISTRIES = ("sqlite", "etcd")
SHAPES = (2, 3)


def _f(figures: Figures, key: str) -> float | None:
    value = figures.get(key)
    return float(value) if isinstance(value, int | float) else None


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.0f} ms"


def replica_goals(figures: Figures) -> list[GoalRow]:
    """The replication goals that these figures measure (none for a section not run)."""
    out: list[GoalRow] = []
    for registry in REGISTRIES:
        median = _f(figures, f"failover_{registry}_median_s")
        if median is None:
            continue
        out.append(
            (
                f"replicas_failover_{registry}",
                f"SIGKILL of the primary's machine to the first call answered, {registry}",
                f"failover, {registry} (< {FAILOVER_GOAL_S:g} s)",
                f"median < {FAILOVER_GOAL_S:g} s",
                f"{_ms(median)} (max {_ms(_f(figures, f'failover_{registry}_max_s'))})",
                FAILOVER_GOAL_S / median if median else None,
            )
        )
    long_log = _f(figures, "failover_long_log_s")
    calls = _f(figures, "failover_long_log_calls")
    if long_log is not None and calls is not None:
        out.append(
            (
                "replicas_failover_long_log",
                f"the same after {calls:,.0f} calls since the replicas' checkpoint, sqlite",
                f"failover after {calls:,.0f} calls (< {FAILOVER_GOAL_S:g} s)",
                f"< {FAILOVER_GOAL_S:g} s",
                _ms(long_log),
                FAILOVER_GOAL_S / long_log if long_log else None,
            )
        )
    for n in SHAPES:
        p50 = _f(figures, f"replicas{n}_p50_ratio")
        share = _f(figures, f"replicas{n}_throughput_ratio")
        p50_alone = _f(figures, f"replicas{n}_p50_vs_standalone")
        share_alone = _f(figures, f"replicas{n}_throughput_vs_standalone")
        if p50 is not None:
            out.append(
                (
                    f"replicas{n}_p50",
                    f"a program's call with {n} replicas, p50, vs one replica",
                    f"{n} replicas: p50 (<= {P50_GOAL_FACTOR:g}x)",
                    f"<= {P50_GOAL_FACTOR:g}x one replica's",
                    f"{p50:.2f}x"
                    + ("" if p50_alone is None else f" ({p50_alone:.2f}x standalone's)"),
                    P50_GOAL_FACTOR / p50 if p50 else None,
                )
            )
        if share is not None:
            out.append(
                (
                    f"replicas{n}_throughput",
                    f"16 programs calling, {n} replicas, calls/s vs one replica",
                    f"{n} replicas: 16 callers (>= {THROUGHPUT_GOAL_SHARE:.0%})",
                    f">= {THROUGHPUT_GOAL_SHARE:.0%} of one replica's",
                    f"{share:.0%}"
                    + ("" if share_alone is None else f" ({share_alone:.0%} of standalone's)"),
                    share / THROUGHPUT_GOAL_SHARE,
                )
            )
    return out


def replica_tables(figures: Figures, runs: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """Two tables: each shape's p50, p99 and calls/s; failover per registry."""
    cost = []
    for name, label in (
        ("standalone", "standalone"),
        ("replicas1", "1 replica"),
        ("replicas2", "2 replicas, ack 2"),
        ("replicas3", "3 replicas, ack 2"),
    ):
        p50 = _f(figures, f"{name}_client_p50_ms")
        if p50 is None:
            continue
        p99 = _f(figures, f"{name}_client_p99_ms")
        many = _f(figures, f"{name}_client_concurrent_calls_per_s")
        cost.append(
            [
                label,
                f"{p50:.2f}",
                "-" if p99 is None else f"{p99:.2f}",
                "-" if many is None else f"{many:,.0f}",
            ]
        )
    failover = []
    for registry in REGISTRIES:
        stats = [_f(figures, f"failover_{registry}_{s}") for s in ("min_s", "median_s", "max_s")]
        if stats[1] is not None:
            failover.append([registry, *(_ms(s) for s in stats)])
    long_log = _f(figures, "failover_long_log_s")
    calls = _f(figures, "failover_long_log_calls")
    if long_log is not None and calls is not None:
        failover.append([f"sqlite, after {calls:,.0f} calls", *([_ms(long_log)] * 3)])
    out = []
    if cost:
        out.append(
            (
                f"Replicas: a durable counter called through the ingress (median of {runs})",
                ["shape", "p50 ms", "p99 ms", "16 callers, calls/s"],
                cost,
            )
        )
    if failover:
        out.append(
            (
                "Failover: SIGKILL of the primary's machine to the first call answered",
                ["registry", "min", "median", "max"],
                failover,
            )
        )
    return out
