"""``bench compare``'s peers (Restate, Temporal, DBOS) and ours called from programs.

Benchmarks are not tests: nothing here looks at a speed or a time. What is checked is
what a figure rests on: every call's answer is right (a counter ends at the number of
calls made, read back from the peer itself), syncs are counted exactly and are whole
numbers, every process a peer started is gone afterwards, also when its measure is
interrupted, and a peer that does not start is named and skipped while the run goes on.
Each peer runs at a tiny size where it is installed (``make bench``), and is skipped
with the reason where it is not (CI does not install the bench extra).
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from pathlib import Path

import attrs
import pytest

from ambrosia_py.bench import compare_dbos, compare_restate, compare_temporal
from ambrosia_py.bench.compare import QUICK
from ambrosia_py.bench.compare_callers import CallPlan, make_calls
from ambrosia_py.bench.compare_ours_ingress import measure_ours_client
from ambrosia_py.bench.compare_peer_process import (
    PeerProcess,
    PeerUnavailableError,
    count_syncs,
    descendants,
    group_gone,
)
from ambrosia_py.bench.compare_report import goal_ratios, markdown
from ambrosia_py.testing.processes import wait_for

# The quick plan, smaller still: a few calls each, four concurrent callers.
TINY = attrs.evolve(
    QUICK.calls, sequential=5, concurrent_cap_s=0.3, callers=4, awaits=3, sync_batch=3
)
CLIENT_FIGURES = {
    "client_p50_ms",
    "client_p99_ms",
    "client_calls_per_s",
    "client_concurrent_calls_per_s",
}
PEER_FIGURES = CLIENT_FIGURES | {"await_p50_ms"}
STRACE = shutil.which("strace") is not None
RESTATE_MISSING = compare_restate.unavailable()
TEMPORAL_MISSING = compare_temporal.unavailable()
needs_restate = pytest.mark.skipif(RESTATE_MISSING is not None, reason=f"{RESTATE_MISSING}")
needs_temporal = pytest.mark.skipif(TEMPORAL_MISSING is not None, reason=f"{TEMPORAL_MISSING}")


def _left_in(path: Path) -> list[str]:
    """Live processes whose command line names ``path`` or that run inside it."""
    left = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(proc / "cwd")
        except (OSError, IndexError):
            continue
        if state not in ("Z", "X") and (str(path) in cmdline or cwd.startswith(str(path))):
            left.append(f"{proc.name}: {cmdline}")
    return left


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A directory for a peer; whatever the test did, no process is left in it."""
    yield tmp_path
    assert _left_in(tmp_path) == []


def _whole(per_call: float, calls: int) -> int:
    """The count behind a per-call figure, which must be a whole number."""
    total = per_call * calls
    assert abs(total - round(total)) < 1e-9, (per_call, calls)
    return round(total)


# -- the machinery every peer runs on --------------------------------------------------

SYNCER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
for _ in range(3):  # before the counted batch: not counted
    os.write(fd, b"x"); os.fdatasync(fd)
print("ready", flush=True)
for line in sys.stdin:
    os.write(fd, b"x"); os.fsync(fd) if line.startswith("fsync") else os.fdatasync(fd)
    print("ok", flush=True)
"""


@pytest.mark.skipif(not STRACE, reason="no strace here")
def test_count_syncs_counts_the_batch_exactly(tmp_path: Path) -> None:
    argv = [sys.executable, "-c", SYNCER, str(tmp_path / "file")]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    stdin, stdout = proc.stdin, proc.stdout
    try:
        assert stdout.readline().strip() == "ready"

        def batch() -> str:
            for word in ["fdatasync"] * 5 + ["fsync"] * 2:
                stdin.write(word + "\n")
                stdin.flush()
                assert stdout.readline().strip() == "ok"
            return "done"

        result, syncs = count_syncs([proc.pid], tmp_path / "trace", batch)
    finally:
        proc.kill()
        proc.wait()
    assert (result, syncs) == ("done", 7)


def test_count_syncs_without_a_process_counts_nothing(tmp_path: Path) -> None:
    assert count_syncs([], tmp_path, lambda: 5) == (5, None)


@pytest.mark.parametrize("how", ["left", "interrupted", "ignores SIGTERM"])
def test_a_peer_process_takes_its_whole_group_with_it(workdir: Path, how: str) -> None:
    trap = "trap '' TERM; " if how == "ignores SIGTERM" else ""
    script = f"{trap}sleep 300 & sleep 300 & wait"
    peer = PeerProcess("group", ["sh", "-c", script], workdir)
    seen: list[int] = []
    expected = pytest.raises(KeyboardInterrupt) if how == "interrupted" else nullcontext()
    with expected, peer.running():
        peer.wait_until("its two children", lambda: len(descendants(peer.pid)) >= 3, 30.0)
        seen = descendants(peer.pid)
        if how == "interrupted":
            raise KeyboardInterrupt  # what Ctrl-C raises in the bench
    assert len(seen) >= 3  # the shell and its two children, all of its group
    assert group_gone(seen[0])


@pytest.mark.parametrize(
    ("variable", "measure", "named"),
    [
        (compare_restate.SERVER_ENV, compare_restate.measure_restate, "restate-server"),
        (compare_temporal.CLI_ENV, compare_temporal.measure_temporal, "temporal-server"),
    ],
)
def test_a_peer_that_does_not_start_is_named(
    workdir: Path,
    monkeypatch: pytest.MonkeyPatch,
    variable: str,
    measure: Callable[[Path, CallPlan], dict[str, float]],
    named: str,
) -> None:
    monkeypatch.setenv(variable, "/bin/false")  # a server that exits at once, status 1
    with pytest.raises(PeerUnavailableError, match=rf"{named} exited \(1\)"):
        measure(workdir, TINY)


def test_compare_names_peers_it_cannot_run_and_goes_on(workdir: Path) -> None:
    env = dict(os.environ)
    env[compare_restate.SERVER_ENV] = "/bin/false"
    env[compare_temporal.CLI_ENV] = "/bin/false"
    argv = [sys.executable, "-m", "ambrosia_py.cli", "bench", "compare", "--quick", "--json"]
    argv += ["--only", "restate", "--only", "temporal", "--only", "limits"]
    argv += ["--dir", str(workdir / "runs")]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for peer in ("restate", "temporal"):
        named = [line for line in lines if line.startswith(f"{peer}: ")]
        assert len(named) == 1 and "not measured" in named[0], lines[-10:]
    result = json.loads(lines[-1])
    assert set(result) == {"restate", "temporal", "limits"}
    assert result["restate"] == {} and result["temporal"] == {}
    assert result["limits"]["fdatasync_writes_per_s"] > 0


# -- each party at a tiny size ---------------------------------------------------------


def _check_figures(figures: dict[str, float], expected: set[str]) -> None:
    assert expected <= set(figures), figures
    assert all(value > 0 for value in figures.values()), figures
    if STRACE:
        assert _whole(figures["client_syncs_per_call"], TINY.sync_batch) > 0


def test_ours_through_the_ingress_tiny(workdir: Path) -> None:
    figures = measure_ours_client(workdir, TINY)
    _check_figures(figures, CLIENT_FIGURES)
    if STRACE:  # each call one after the other is durable before it is answered
        assert _whole(figures["client_syncs_per_call"], TINY.sync_batch) >= TINY.sync_batch


@needs_restate
def test_restate_tiny(workdir: Path) -> None:
    figures = compare_restate.measure_restate(workdir, TINY)
    _check_figures(figures, PEER_FIGURES)
    if STRACE:
        assert _whole(figures["await_syncs_per_call"], TINY.sync_batch) > 0


@needs_restate
def test_restate_counter_holds_every_call(workdir: Path) -> None:
    with compare_restate.running(workdir) as restate:
        caller = compare_restate.RestateCaller(restate.ingress, "k")
        try:
            make_calls(caller, 7)
        finally:
            caller.close()
        # Read back from Restate: adding nothing answers the counter's value.
        conn = http.client.HTTPConnection("127.0.0.1", restate.ingress, timeout=60)
        try:
            conn.request("POST", "/Counter/k/add", b"0", {"content-type": "application/json"})
            response = conn.getresponse()
            assert (response.status, json.loads(response.read())) == (200, 7)
        finally:
            conn.close()
        late = compare_restate.RestateCaller(restate.ingress, "k")
        try:
            with pytest.raises(RuntimeError, match="200 8 after 0 calls"):
                late.call()  # it expects 1: the key held 7 already, and it says so
        finally:
            late.close()
        stamps = compare_restate.loop(restate.ingress, 3)
        assert len(stamps) == 4 and stamps == sorted(stamps)


@needs_temporal
def test_temporal_tiny(workdir: Path) -> None:
    figures = compare_temporal.measure_temporal(workdir, TINY)
    _check_figures(figures, PEER_FIGURES)
    if STRACE:
        assert _whole(figures["await_syncs_per_call"], TINY.sync_batch + 1) > 0


@needs_temporal
def test_temporal_runs_one_workflow_per_call(workdir: Path) -> None:
    with compare_temporal.running(workdir) as temporal:
        caller = compare_temporal.TemporalCaller(temporal.driver, temporal.queue, "k")
        make_calls(caller, 4)
        assert caller.made == 4
        client = temporal.driver.client
        query = "WorkflowType='AddOne' AND ExecutionStatus='Completed'"

        def counted() -> bool:  # visibility catches up a moment after the results
            return int(temporal.driver.run(client.count_workflows(query)).count) == 5

        wait_for("5 completed AddOne workflows (4 and the first)", counted, 60.0)
        stamps = compare_temporal.stamps(temporal.driver, temporal.queue, 3)
        assert len(stamps) == 3 and stamps == sorted(stamps)


@pytest.mark.skipif(not compare_dbos.available(), reason="dbos not installed (bench extra)")
@pytest.mark.skipif(not STRACE, reason="no strace here")
def test_dbos_syncs_are_counted(workdir: Path) -> None:
    syncs = compare_dbos.measure_dbos_syncs(workdir, 3)
    assert syncs is not None and _whole(syncs, 3) > 0


# -- the goals against the peers -------------------------------------------------------


def test_goals_against_the_peers_are_the_projects_bars() -> None:
    """At most a fifth of Restate's p50, 20x its 16 callers, a tenth of its awaited
    p50; 100x Temporal on each; 20x DBOS's one-step workflows."""
    results = {
        "ours": {
            "client_p50_ms": 1.0,
            "client_calls_per_s": 300.0,
            "client_concurrent_calls_per_s": 1000.0,
            "remote_await_p50_ms": {"16": 2.0},
        },
        "restate": {
            "client_p50_ms": 4.0,
            "client_concurrent_calls_per_s": 40.0,
            "await_p50_ms": 40.0,
        },
        "temporal": {
            "client_p50_ms": 200.0,
            "client_concurrent_calls_per_s": 5.0,
            "await_p50_ms": 100.0,
        },
        "dbos": {"workflows_per_s": {"16": 10.0}},
    }
    ratios = goal_ratios(results)
    assert ratios == pytest.approx(
        {
            "client_p50_vs_restate": 0.8,
            "client_concurrent_vs_restate": 1.25,
            "await_p50_vs_restate": 2.0,
            "client_p50_vs_temporal": 2.0,
            "client_concurrent_vs_temporal": 2.0,
            "await_p50_vs_temporal": 0.5,
            "client_vs_dbos": 1.5,
        }
    )
    text = markdown(results, 1, {"temporal": "did not start, not measured: why"})
    assert "| Restate: Virtual Object over HTTP; ctx.service_call | 4.00 |" in text
    assert "3 documented, not counted" in text  # Restate's syncs, not counted here
    assert text.rstrip().endswith("temporal: did not start, not measured: why")
