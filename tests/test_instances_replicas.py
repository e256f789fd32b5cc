"""``ambrosia-py instances`` on an instance run as three replicas of the counter, each its
own "machine" (data dir and processes) sharing one registry: a SQLite file, or a real
etcd (the machines and registries of ``test_replicas_failover.py``).

The command runs as a subprocess, as an operator would run it. What it prints is held
against the registry's own answers (who holds the current term, and its epoch), against
what each replica's process said it listens on, and against itself over time: positions
that grow with calls made through the ingress, a secondary that catches up, a killed
primary that drops out of the listing while the replica that took over is named.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.interface import Endpoint
from ambrosia_py.coordinator.registry.primary import Term, open_election
from ambrosia_py.coordinator.replication import Group
from ambrosia_py.testing import wait_for
from tests.test_replicas_failover import (
    COUNTER,
    DEADLINE,
    Callers,
    Cluster,
    Machine,
    Registry,
    cluster,
    current_term,
    etcd_server,
    newer_term,
    registry,
)

__all__ = ["cluster", "etcd_server", "registry"]  # fixtures, used through their names

pytestmark = pytest.mark.timeout(300)

Row = dict[str, str]


def ambrosia(*args: str | Path, cwd: Path | None = None) -> str:
    """Run ``ambrosia-py ARGS`` as a process; what it printed (it must succeed)."""
    argv = [sys.executable, "-m", "ambrosia_py.cli", *map(str, args)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def tables(output: str) -> dict[str, list[Row]]:
    """The tables of ``output`` (as rich draws them off a terminal), by the first word
    of their titles: each a list of rows, each row by column header."""
    found: dict[str, list[Row]] = {}
    lines = output.splitlines()
    headers: list[str] = []
    rows: list[Row] = []
    for n, line in enumerate(lines):
        cells = [c.strip() for c in re.split("[┃│]", line)[1:-1]]
        if line.startswith("┃"):
            title = lines[n - 2].split()[0]  # the title, then the top border
            headers, rows = cells, []
            found[title] = rows
        elif line.startswith("│"):
            rows.append(dict(zip(headers, cells, strict=True)))
    return found


def listing(registry: Registry) -> tuple[list[Row], list[Row]]:
    """``instances`` with the replicas' registry: its instances' rows and replicas' rows."""
    out = ambrosia(
        *("instances", "--registry", registry.spec, "--cluster", registry.cluster),
        *("--data-dir", registry.root),
    )
    found = tables(out)
    return found["instances"], found.get("replicas", [])


def registered(registry: Registry) -> dict[int, tuple[str, str]]:
    """Each live replica's address and machine as the registry holds them."""
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    try:
        election = open_election(reg)
        try:
            return {
                r.replica: (f"{r.address.host}:{r.address.port}", r.host_name)
                for r in election.replicas("counter")
            }
        finally:
            election.close()
    finally:
        reg.close()


def said_port(machine: Machine) -> int:
    """The port a replica's coordinator said it listens on for its group."""
    assert machine.process is not None
    found = re.search(
        rf"replica {machine.replica} listens for its group on [^\s:]+:(\d+)",
        machine.process.output(),
    )
    assert found, machine.process.tail()
    return int(found.group(1))


def the_primary(rows: list[Row]) -> Row:
    (primary,) = [r for r in rows if r["role"] == "primary"]
    return primary


def shows_term(rows: list[Row], term: Term) -> bool:
    """Whether the listing names ``term``'s replica primary with ``term``'s epoch."""
    primaries = [r for r in rows if r["role"] == "primary"]
    return [(p["replica"], p["epoch"]) for p in primaries] == [(str(term.replica), str(term.epoch))]


def positions(rows: list[Row]) -> dict[int, int]:
    return {int(r["replica"]): int(r["position"]) for r in rows}


def wait_listing(what: str, registry: Registry, shows: Callable[[list[Row]], bool]) -> list[Row]:
    """The replicas' rows of the first listing that ``shows`` what is waited for."""
    seen: list[list[Row]] = [[]]

    def listed() -> bool:
        seen[0] = listing(registry)[1]
        return shows(seen[0])

    wait_for(what, listed, DEADLINE)
    return seen[0]


def none_recovering(registry: Registry) -> list[Row]:
    """The rows once all three replicas are listed and none as recovering: each
    secondary started empty, and says so until it has caught up (it publishes that
    within a second or so)."""
    return wait_listing(
        "no secondary to be shown recovering",
        registry,
        lambda rows: len(rows) == 3 and all("recovering" not in r["role"] for r in rows),
    )


def caught_up(registry: Registry) -> None:
    """Once calls have stopped and all three replicas have published the same position,
    no secondary is shown behind."""
    rows = wait_listing(
        "the replicas to publish the same position",
        registry,
        lambda rows: len(rows) == 3 and len(set(positions(rows).values())) == 1,
    )
    assert sorted(r["behind"] for r in rows) == ["-", "0", "0"]


def test_instances_shows_each_replica_its_role_and_how_far_behind(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    machines, registry, secret = cluster
    monkeypatch.syspath_prepend(str(COUNTER.parent))
    term = current_term(registry)
    assert term is not None

    rows = none_recovering(registry)
    instances, _ = listing(registry)
    assert [i["name"] for i in instances] == ["counter"]
    assert current_term(registry) == term, "the term moved while nothing failed"
    assert sorted(int(r["replica"]) for r in rows) == [0, 1, 2]
    assert {r["instance"] for r in rows} == {"counter"}
    primary = the_primary(rows)
    assert (primary["replica"], primary["epoch"]) == (str(term.replica), str(term.epoch))
    assert primary["behind"] == "-"
    assert primary["from seq"] == str(term.log_position)
    assert term.log_position <= int(primary["position"])
    for r in rows:
        assert r["in group"] == "yes"
        if r is not primary:
            assert r["role"] == "secondary" and r["epoch"] == "-" and r["from seq"] == "-"
    held = registered(registry)
    for r in rows:
        machine = machines[int(r["replica"])]
        assert (r["replication"], r["host"]) == held[machine.replica]
        assert r["replication"].endswith(f":{said_port(machine)}")
        assert r["host"] == socket.gethostname()

    # Calls through the ingress: every replica's log grows, and once the positions are
    # published (about once a second) every one is past where it was.
    before = positions(rows)
    callers = Callers(registry, secret, 2)
    callers.start()
    try:
        callers.wait_answers(20)
    finally:
        callers.stop()

    def all_moved(rows: list[Row]) -> bool:
        now = positions(rows)
        return now.keys() == before.keys() and all(now[r] > before[r] for r in now)

    rows = wait_listing("every replica's published position to move on", registry, all_moved)
    primary = the_primary(rows)
    for r in rows:
        assert int(r["position"]) > 1
        if r is not primary:
            behind = int(r["behind"])
            assert behind == max(0, int(primary["position"]) - int(r["position"]))

    caught_up(registry)

    # The primary's machine loses its processes; a secondary takes over.
    lost = machines[term.replica]
    assert lost.process is not None
    lost.process.kill("both")
    wait_for("a new primary", lambda: newer_term(registry, term), DEADLINE)

    def moved_on(rows: list[Row]) -> bool:
        now = current_term(registry)
        return (
            now is not None
            and shows_term(rows, now)
            and sorted(int(r["replica"]) for r in rows) == sorted({0, 1, 2} - {term.replica})
        )

    rows = wait_listing("the listing to name the new primary, not the lost one", registry, moved_on)
    new = the_primary(rows)
    assert new["replica"] != str(term.replica) and int(new["epoch"]) > term.epoch
    assert {r["role"] for r in rows if r is not new} == {"secondary"}


def test_a_replica_still_recovering_is_shown_so(tmp_path: Path) -> None:
    """Replicas registered in a SQLite registry by this process (no term yet): one that
    started empty and has not caught up, one that has."""
    registry = Registry(str(tmp_path / "registry.sqlite3"), "ambrosia", tmp_path)
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    try:
        reg.register("counter")
        election = open_election(reg)
        try:
            election.register_replica("counter", 1, Endpoint("127.0.0.1", 7001), 5, True)
            election.register_replica("counter", 2, Endpoint("127.0.0.1", 7002), 9)
            rows = listing(registry)[1]
        finally:
            election.close()
    finally:
        reg.close()
    roles = {r["replica"]: r["role"] for r in rows}
    assert roles == {"1": "secondary (recovering)", "2": "secondary"}


def test_each_replica_is_shown_in_or_out_of_the_group_and_changes_under_way() -> None:
    from ambrosia_py.cli.instances import _in_group

    settled = Group.of({0, 1, 2}, 2, version=3)
    changing = Group.of({1, 2, 3}, 2, version=4, previous=Group.of({0, 1, 2}, 2))
    assert [_in_group(r, settled) for r in (0, 3)] == ["yes", "no"]
    assert [_in_group(r, changing) for r in (0, 1, 3, 7)] == ["leaving", "yes", "joining", "no"]
    assert _in_group(0, None) == "-"  # a registry of an earlier release: no group stored


def test_instances_without_replicas_shows_no_replicas_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """A standalone instance in a SQLite registry: its line alone, and the registry's
    directory as it was (no place for replicas made just to look for them)."""
    ambrosia("register", "solo", "--data-dir", tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    out = ambrosia("instances", "--data-dir", tmp_path)
    assert set(tables(out)) == {"instances"}
    assert [r["name"] for r in tables(out)["instances"]] == ["solo"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize("registry", ["sqlite"], indirect=True)
def test_a_paused_secondary_is_shown_behind_until_it_catches_up(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secondary paused (SIGSTOP) while calls go on: its published position stays
    where it was, the primary's grows, and the listing says by how much it is behind.
    (SQLite only: a paused process keeps its lock, so it stays listed; with etcd its
    lease would run out and it would leave the listing.)"""
    machines, registry, secret = cluster
    monkeypatch.syspath_prepend(str(COUNTER.parent))
    term = current_term(registry)
    assert term is not None
    paused = machines[(term.replica + 1) % 3]
    assert paused.process is not None and paused.process.proc is not None
    none_recovering(registry)
    pids = [paused.process.proc.pid, paused.process.coordinator_pid()]
    callers = Callers(registry, secret, 2)
    callers.start()

    def shown_behind(rows: list[Row]) -> bool:
        behind = {int(r["replica"]): r["behind"] for r in rows}
        return behind.get(paused.replica, "-") not in ("-", "0")

    try:
        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            callers.wait_answers(50)
            listed = wait_listing("the paused secondary to be shown behind", registry, shown_behind)
        finally:
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)
    finally:
        callers.stop()
    rows = {int(r["replica"]): r for r in listed}
    primary = rows[term.replica]
    assert primary["role"] == "primary"
    lagging = rows[paused.replica]
    assert lagging["role"] == "secondary"
    behind = int(primary["position"]) - int(lagging["position"])
    assert behind > 0 and lagging["behind"] == str(behind)
    caught_up(registry)
