"""What replication costs and how fast failover is: the replication figures of ``bench
compare``, measured in one run so that their ratios hold on a machine whose speed swings.

- **Cost of replication**: the counter ``bench compare`` calls through the ingress
  (:mod:`.compare_ours_ingress`: ``IngressBench.add(b"x")``, each call answered once
  durable) run four ways, each in its own data dirs on this machine: standalone (no
  ``--replica``), one replica (``--replicas 1``: the replicated instance's own path,
  with nobody to ship to), two replicas committing once both hold a record
  (``--replicas 2 --replication-ack 2``), three replicas committing once two do
  (``--replicas 3``, the default majority), the replicas meeting in a shared SQLite
  registry. The goals hold two and three replicas to one replica, as the replication
  issue words them ("at most 2x the single-replica latency", "at least half its
  throughput"); the ratios to standalone are reported beside them. The callers are
  :mod:`.compare_callers`' (one ``Client`` calling one call after the other: p50, p99;
  16 threads with a ``Client`` each: calls/s), aimed at the primary's ingress. All three
  run at once, idle but for the one measured, and are measured in turn, back and forth
  (in order, then in reverse, ...), each figure the median of its passes: a slow minute of the
  machine then falls on all three alike.
- **Failover** (:mod:`.replica_failover`): three replicas, a program calling by name,
  the primary's machine lost round after round; min, median and max of the time from
  the kill to the first answer after it, with a shared SQLite registry and with a real
  etcd (:mod:`.etcd_process`; skipped, saying why, where there is none).

Each group's counter is read at the end and must equal the calls its callers had
answered: a call lost or counted twice fails the measure. Every process runs in a
directory under the one given, in a process group of its own, and is gone when the
measure ends, however it ends (:mod:`.replica_cluster`).

``python -m ambrosia_py.bench.compare_replicas [--quick]`` runs it alone and prints
the figures.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import attrs

from ..client import Client
from .compare_callers import CallPlan, measure_callers

# The very callers ours is measured with against the peers, so the standalone figures
# here are those of ``bench compare``'s ingress section.
from .compare_ours_ingress import OursCaller, Tally
from .compare_peer_process import PeerUnavailableError
from .etcd_process import EtcdProcess
from .ingress import IngressBench
from .replica_cluster import ReplicaGroup
from .replica_failover import FailoverFigures, measure_failover

__all__ = [
    "FULL",
    "QUICK",
    "CallFigures",
    "ReplicationFigures",
    "ReplicationPlan",
    "measure_replication",
    "report_lines",
]

FAILOVER_GOAL_S = 1.0  # the median failover must take less
P50_GOAL_FACTOR = 2.0  # a replicated call's p50 at most this times one replica's
THROUGHPUT_GOAL_SHARE = 0.5  # and at least this share of its calls/s with 16 callers
# (replicas, --replication-ack) measured; None: standalone, or the coordinator's default.
SHAPES: tuple[tuple[int | None, int | None], ...] = ((None, None), (1, None), (2, 2), (3, None))
REPLICATED = (2, 3)  # the shapes held to the goals, against one replica


@attrs.frozen
class ReplicationPlan:
    """How much one measure does; :data:`FULL` and :data:`QUICK` are the bench's."""

    calls: CallPlan  # each pass, per group
    passes: int  # cost measures of each group, back and forth
    rounds: int  # failovers per registry, at most
    failover_cap_s: float  # no round begun after this long (per registry)
    answers_between: int  # answers the caller gets before each failover round
    long_log: int = 0  # calls logged before one more failover (0: none)
    timeout: float = 60.0  # any wait for a process or an answer, before it fails


FULL = ReplicationPlan(
    calls=CallPlan(sequential=150, sequential_cap_s=1.5, concurrent_cap_s=1.5),
    passes=6,
    rounds=5,
    failover_cap_s=20.0,
    answers_between=20,
    long_log=30_000,
)
QUICK = ReplicationPlan(
    calls=CallPlan(sequential=40, sequential_cap_s=0.4, concurrent_cap_s=0.4, warm_up=3),
    passes=3,
    rounds=2,
    failover_cap_s=6.0,
    answers_between=10,
    long_log=1_000,
)


@attrs.frozen
class CallFigures:
    """One shape's figures through the ingress (``replicas`` 0: standalone), and the
    calls its callers had answered beside the counter's value at the end."""

    replicas: int
    ack: int
    p50_ms: float
    p99_ms: float
    calls_per_s: float  # one caller, one call after the other
    concurrent_calls_per_s: float  # ``callers`` callers, each with a client of its own
    callers: int
    calls: int
    counter: int


@attrs.frozen
class ReplicationFigures:
    """The figures of one measure; ``skipped`` says what was not measured, and why."""

    calls: tuple[CallFigures, ...]  # standalone first, then 1, 2 and 3 replicas
    failover: tuple[FailoverFigures, ...]  # "sqlite", then "etcd" unless skipped
    skipped: tuple[str, ...]
    # One failover (SQLite) after ``long_log_calls`` calls since the replicas' checkpoint:
    # taking over must not replay them (secondaries replay as records commit).
    long_log: FailoverFigures | None = None
    long_log_calls: int = 0

    def shape(self, replicas: int) -> CallFigures:
        """The figures of ``replicas`` replicas (0: standalone)."""
        return next(c for c in self.calls if c.replicas == replicas)

    def ratios(self) -> dict[str, float]:
        """Two and three replicas against one replica: ``replicasN_p50_ratio`` (its p50
        over one replica's; lower is better) and ``replicasN_throughput_ratio`` (its
        calls/s with 16 callers over one replica's; higher is better); and every
        replicated shape against standalone, the same with ``_vs_standalone``."""
        one, alone = self.shape(1), self.shape(0)
        out = {}
        for n in REPLICATED:
            shape = self.shape(n)
            out[f"replicas{n}_p50_ratio"] = shape.p50_ms / one.p50_ms
            out[f"replicas{n}_throughput_ratio"] = (
                shape.concurrent_calls_per_s / one.concurrent_calls_per_s
            )
        for shape in self.calls:
            if shape.replicas:
                name = f"replicas{shape.replicas}"
                out[f"{name}_p50_vs_standalone"] = shape.p50_ms / alone.p50_ms
                out[f"{name}_throughput_vs_standalone"] = (
                    shape.concurrent_calls_per_s / alone.concurrent_calls_per_s
                )
        return out

    def goals(self) -> list[tuple[str, float, bool]]:
        """(name, ratio to the bar, met) for each goal; a ratio of 1 or more meets it:
        failover's median under 1 s; with two and three replicas, a p50 at most twice
        one replica's and at least half its calls/s with 16 callers."""
        out = []
        for failover in self.failover:
            ratio = FAILOVER_GOAL_S / failover.median_s
            out.append((f"failover_{failover.registry}", ratio, ratio >= 1.0))
        if self.long_log is not None:
            ratio = FAILOVER_GOAL_S / self.long_log.max_s
            out.append(("failover_long_log", ratio, ratio >= 1.0))
        base = self.shape(1)
        for shape in map(self.shape, REPLICATED):
            ratio = P50_GOAL_FACTOR * base.p50_ms / shape.p50_ms
            out.append((f"replicas{shape.replicas}_p50", ratio, ratio >= 1.0))
            share = base.concurrent_calls_per_s * THROUGHPUT_GOAL_SHARE
            ratio = shape.concurrent_calls_per_s / share
            out.append((f"replicas{shape.replicas}_throughput", ratio, ratio >= 1.0))
        return out

    def as_dict(self) -> dict[str, float]:
        """Every figure and ratio by name, as ``bench compare --json`` lists figures."""
        out: dict[str, float] = {}
        for shape in self.calls:
            name = f"replicas{shape.replicas}" if shape.replicas else "standalone"
            out[f"{name}_client_p50_ms"] = shape.p50_ms
            out[f"{name}_client_p99_ms"] = shape.p99_ms
            out[f"{name}_client_calls_per_s"] = shape.calls_per_s
            out[f"{name}_client_concurrent_calls_per_s"] = shape.concurrent_calls_per_s
        for failover in self.failover:
            for stat in ("min_s", "median_s", "max_s"):
                out[f"failover_{failover.registry}_{stat}"] = getattr(failover, stat)
        if self.long_log is not None:
            out["failover_long_log_s"] = self.long_log.max_s
            out["failover_long_log_calls"] = float(self.long_log_calls)
        out.update(self.ratios())
        return out


def _counter(group: ReplicaGroup) -> int:
    """The group's counter now (a call that adds nothing)."""
    with Client(group.primary().ingress, data_dir=group.root) as client:
        value: int = client.call(IngressBench.add, b"")
    return value


def _median_figures(
    group: ReplicaGroup, passes: list[dict[str, float]], callers: int, calls: int
) -> CallFigures:
    def median(key: str) -> float:
        return statistics.median(p[key] for p in passes)

    return CallFigures(
        replicas=group.replicas or 0,
        ack=group.quorum,
        p50_ms=median("client_p50_ms"),
        p99_ms=median("client_p99_ms"),
        calls_per_s=median("client_calls_per_s"),
        concurrent_calls_per_s=median("client_concurrent_calls_per_s"),
        callers=callers,
        calls=calls,
        counter=_counter(group),
    )


def _counted_once(figures: CallFigures | FailoverFigures) -> None:
    """Raise unless the counter counted each answered call once."""
    if figures.counter != figures.calls:
        raise RuntimeError(
            f"the counter holds {figures.counter} after {figures.calls} calls answered: "
            "a call was lost or counted twice"
        )


def _callers(group: ReplicaGroup, tally: Tally) -> Callable[[int], OursCaller]:
    """How :func:`~.compare_callers.measure_callers` opens caller ``k`` of ``group``:
    a ``Client`` of its own at the primary's ingress (the first one alone, so exact)."""
    address = group.primary().ingress
    return lambda k: OursCaller(address, group.root, tally, exact=k == 0)


def measure_costs(directory: Path, plan: ReplicationPlan) -> tuple[CallFigures, ...]:
    """Standalone, one, two and three replicas, started together and measured in turn."""
    with contextlib.ExitStack() as stack:
        groups = [
            stack.enter_context(ReplicaGroup(directory / f"shape{i}", replicas, ack=ack))
            for i, (replicas, ack) in enumerate(SHAPES)
        ]
        for group in groups:
            group.start(plan.timeout)
        tallies = [Tally() for _ in groups]
        passes: list[list[dict[str, float]]] = [[] for _ in groups]
        for n in range(plan.passes):
            for i in range(len(groups)) if n % 2 == 0 else reversed(range(len(groups))):
                passes[i].append(measure_callers(_callers(groups[i], tallies[i]), plan.calls))
        figures = tuple(
            _median_figures(g, p, plan.calls.callers, t.made)
            for g, p, t in zip(groups, passes, tallies, strict=True)
        )
    for shape in figures:
        _counted_once(shape)
    return figures


def _failover(group: ReplicaGroup, name: str, plan: ReplicationPlan) -> FailoverFigures:
    figures = measure_failover(
        group,
        name,
        rounds=plan.rounds,
        answers_between=plan.answers_between,
        cap_s=plan.failover_cap_s,
        timeout=plan.timeout,
    )
    _counted_once(figures)
    return figures


def measure_replication(
    directory: Path, *, quick: bool, plan: ReplicationPlan | None = None
) -> ReplicationFigures:
    """The replication figures (module docstring), with every process under
    ``directory`` and gone on return; ``plan`` (default :data:`QUICK` or :data:`FULL`)
    says how much to do."""
    plan = plan or (QUICK if quick else FULL)
    calls = measure_costs(directory / "costs", plan)
    failover: list[FailoverFigures] = []
    skipped: list[str] = []
    with ReplicaGroup(directory / "failover-sqlite", 3) as group:
        failover.append(_failover(group, "sqlite", plan))
    long_log = None
    if plan.long_log:
        with ReplicaGroup(directory / "failover-long-log", 3) as group:
            long_log = measure_failover(
                group,
                "sqlite",
                rounds=1,
                answers_between=plan.long_log,
                answers_after=plan.answers_between,
                cap_s=0.0,
                timeout=plan.timeout,
            )
        _counted_once(long_log)
    etcd = EtcdProcess(directory / "etcd")
    try:
        with etcd.running():
            cluster = f"bench{os.getpid()}x{secrets.token_hex(4)}"
            root = directory / "failover-etcd"
            with ReplicaGroup(root, 3, registry=etcd.spec, cluster=cluster) as group:
                failover.append(_failover(group, "etcd", plan))
    except PeerUnavailableError as exc:
        skipped.append(f"failover with etcd: {exc}")
    return ReplicationFigures(
        tuple(calls), tuple(failover), tuple(skipped), long_log, plan.long_log
    )


def report_lines(figures: ReplicationFigures) -> list[str]:
    """The figures in plain lines, ratios and goals last."""
    lines = []
    for shape in figures.calls:
        what = "standalone" if not shape.replicas else f"{shape.replicas} replicas, ack {shape.ack}"
        lines.append(
            f"{what}: p50 {shape.p50_ms:.2f} ms, p99 {shape.p99_ms:.2f} ms, "
            f"{shape.calls_per_s:,.0f} calls/s alone, "
            f"{shape.concurrent_calls_per_s:,.0f} calls/s with {shape.callers} callers"
        )
    for f in figures.failover:
        lines.append(
            f"failover ({f.registry}, {len(f.rounds)} rounds): min {f.min_s * 1e3:.0f} ms, "
            f"median {f.median_s * 1e3:.0f} ms, max {f.max_s * 1e3:.0f} ms"
        )
    if figures.long_log is not None:
        lines.append(
            f"failover after {figures.long_log_calls:,} calls since the replicas' checkpoint "
            f"(sqlite): {figures.long_log.max_s * 1e3:.0f} ms"
        )
    lines += [f"skipped: {why}" for why in figures.skipped]
    lines += [f"{name}: {value:.2f}" for name, value in figures.ratios().items()]
    lines += [
        f"goal {name}: {ratio:.2f} ({'met' if met else 'not met'})"
        for name, ratio, met in figures.goals()
    ]
    return lines


def main(argv: list[str]) -> None:
    """``python -m ambrosia_py.bench.compare_replicas [--quick]``."""
    with tempfile.TemporaryDirectory(prefix="ambrosia-replication-") as directory:
        figures = measure_replication(Path(directory), quick="--quick" in argv)
    print("\n".join(report_lines(figures)))


if __name__ == "__main__":
    main(sys.argv[1:])
