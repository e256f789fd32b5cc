"""The replication figures of ``bench compare`` (``ambrosia_py.bench.compare_replicas``):
measured at a tiny size with real replicas, a real etcd where there is one, and real
SIGKILLs; what is checked is what holds whatever the machine's speed.

Every call a caller had answered was counted once (each group's counter equals its
callers' answers), every failover round ended in a term of a higher epoch held by
another replica, every figure is a positive number, and no process the measure started
is left. Nothing here looks at a time or a ratio's size: benchmarks are not tests.
"""

from __future__ import annotations

import contextlib
import math
import shutil
from pathlib import Path

import pytest

from ambrosia_py.bench.compare_callers import CallPlan
from ambrosia_py.bench.compare_replicas import ReplicationPlan, measure_replication
from ambrosia_py.bench.replica_cluster import ReplicaGroup

pytestmark = pytest.mark.timeout(300)

TINY = ReplicationPlan(
    calls=CallPlan(sequential=10, sequential_cap_s=0.5, concurrent_cap_s=0.3, callers=4, warm_up=2),
    passes=2,  # there and back: the second pass goes on from the first's counts
    rounds=2,
    failover_cap_s=0.1,  # at least one round; a second only if the first was quick
    answers_between=5,
    long_log=40,  # one more failover, after 40 calls since the replicas' checkpoint
)


def processes_under(directory: Path) -> list[str]:
    """The command lines of live processes that name ``directory`` (every process the
    measure starts is given a path under it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (cmdline.parent / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if str(directory) in text and state not in ("Z", "X"):
                found.append(text)
    return found


def positive(value: float) -> bool:
    return math.isfinite(value) and value > 0


def test_the_replication_figures_count_every_call_once_and_leave_nothing_running(
    tmp_path: Path,
) -> None:
    figures = measure_replication(tmp_path, quick=True, plan=TINY)

    assert processes_under(tmp_path) == []
    assert [(c.replicas, c.ack) for c in figures.calls] == [(0, 1), (1, 1), (2, 2), (3, 2)]
    for shape in figures.calls:
        assert shape.calls > 0
        assert shape.counter == shape.calls, shape
        for figure in (shape.p50_ms, shape.p99_ms, shape.calls_per_s):
            assert positive(figure), shape
        assert positive(shape.concurrent_calls_per_s), shape

    expected = ["sqlite"] if shutil.which("etcd") is None else ["sqlite", "etcd"]
    assert [f.registry for f in figures.failover] == expected
    assert len(figures.skipped) == 2 - len(expected)
    for failover in figures.failover:
        assert failover.rounds
        assert failover.calls > 0
        assert failover.counter == failover.calls, failover
        for r in failover.rounds:
            assert r.epoch_after > r.epoch_before, r
            assert r.new_replica != r.lost_replica, r
            assert positive(r.seconds), r
        assert failover.min_s <= failover.median_s <= failover.max_s

    long_log = figures.long_log
    assert long_log is not None and figures.long_log_calls == 40
    assert len(long_log.rounds) == 1
    assert long_log.calls >= 40 and long_log.counter == long_log.calls, long_log
    assert long_log.rounds[0].epoch_after > long_log.rounds[0].epoch_before

    goals = figures.goals()
    names = {name for name, _, _ in goals}
    assert names == {
        "failover_long_log",
        *(f"failover_{registry}" for registry in expected),
        *(f"replicas{n}_{what}" for n in (2, 3) for what in ("p50", "throughput")),
    }
    for name, ratio, met in goals:
        assert positive(ratio), name
        assert met == (ratio >= 1.0), name
    figured = figures.as_dict()
    assert all(positive(v) for v in figured.values())
    one, two = figured["replicas1_client_p50_ms"], figured["replicas2_client_p50_ms"]
    assert figured["replicas2_p50_ratio"] == two / one  # the goals' base: one replica
    assert figured["replicas2_p50_vs_standalone"] == two / figured["standalone_client_p50_ms"]


def test_a_group_interrupted_while_it_runs_leaves_no_process(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), ReplicaGroup(tmp_path, 2, ack=2) as group:
        group.start(60.0)
        # Two replicas, each a group leader, a service process and its coordinator.
        assert len(processes_under(tmp_path)) == 6
        raise KeyboardInterrupt  # as a Ctrl-C at the bench would
    assert processes_under(tmp_path) == []


def test_the_report_holds_replication_to_its_bars() -> None:
    """``bench compare``'s replicas section: its goals against their bars (failover
    under 1 s, p50 at most 2x one replica's, at least half its throughput), from
    figures as ``--json`` holds them."""
    from ambrosia_py.bench.compare_report import goals, tables

    figures = {
        "standalone_client_p50_ms": 0.4,
        "replicas1_client_p50_ms": 0.5,
        "replicas1_client_p99_ms": 1.0,
        "replicas1_client_concurrent_calls_per_s": 4000.0,
        "replicas3_client_p50_ms": 1.5,
        "replicas3_client_p99_ms": 3.0,
        "replicas3_client_concurrent_calls_per_s": 1000.0,
        "replicas3_p50_ratio": 3.0,
        "replicas3_throughput_ratio": 0.25,
        "replicas3_p50_vs_standalone": 3.75,
        "replicas3_throughput_vs_standalone": 0.2,
        "failover_etcd_min_s": 0.4,
        "failover_etcd_median_s": 0.5,
        "failover_etcd_max_s": 0.8,
        "failover_long_log_s": 1.25,
        "failover_long_log_calls": 30000.0,
    }
    met = {g.key: (g.ratio, g.met) for g in goals({"replicas": figures})}
    assert met["replicas_failover_etcd"] == (2.0, True)  # 1 s / 0.5 s
    assert met["replicas3_p50"] == (2.0 / 3.0, False)  # 3x is over the 2x bar
    assert met["replicas3_throughput"] == (0.5, False)  # a quarter, against a half
    assert "replicas_failover_sqlite" not in met  # not measured: not judged
    assert met["replicas_failover_long_log"] == (0.8, False)  # 1 s / 1.25 s
    rows = {g.key: g for g in goals({"replicas": figures})}
    assert "(3.75x standalone's)" in rows["replicas3_p50"].measured
    made = tables({"replicas": figures}, 1)
    shapes = [row[0] for title, _, rows_ in made if title.startswith("Replicas:") for row in rows_]
    assert shapes == ["standalone", "1 replica", "3 replicas, ack 2"]
    titles = [t[0] for t in made]
    assert any(t.startswith("Replicas:") for t in titles)
    assert any(t.startswith("Failover:") for t in titles)
