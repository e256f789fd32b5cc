"""The replica group of an instance, with real processes: the registry holds it, and
``ambrosia-py group`` changes it under a load of ingress calls.

Three replicas of the counter; a fourth machine starts empty as replica 3 and waits,
taking no part, until the group adds it; the primary begins a term of the changing
group in place, settles the change once it has committed its start, and replica 3
catches up. Then replica 0 is removed (it stops, saying so), and the primary's machine
is lost with its disk: the three left take over. Every call is counted exactly once.

A replica restarted with other ``--replicas`` runs in the registry's group and says so
(the flags count at an instance's first start only): a replica counting by other
numbers than the rest could take a term without a record the others hold.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ambrosia_py.bench.replica_cluster import CAUGHT_UP, RECOVERS
from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.primary import open_election
from ambrosia_py.coordinator.replication import Group
from ambrosia_py.testing import wait_for
from tests.test_replicas_failover import (
    DEADLINE,
    Callers,
    Cluster,
    Machine,
    Registry,
    callers,
    cluster,
    counted_once,
    current_term,
    etcd_server,
    newer_term,
    registry,
)

__all__ = ["callers", "cluster", "etcd_server", "registry"]  # fixtures, used by name

pytestmark = pytest.mark.timeout(300)

FOLLOWS = "the binding follows the log from checkpoint"


def stored_group(registry: Registry) -> Group | None:
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    try:
        election = open_election(reg)
        try:
            return election.group("counter")
        finally:
            election.close()
    finally:
        reg.close()


def change(registry: Registry, *options: str) -> str:
    """``ambrosia-py group`` for the counter; what it printed (it must succeed)."""
    where = ["--registry", registry.spec, "--cluster", registry.cluster]
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "group",
            "--instance",
            "counter",
            *where,
            *options,
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE + 30,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def follows(machine: Machine) -> bool:
    """Whether a replica's binding follows the log and it counts toward new terms (one
    that started empty, once it has caught up)."""
    assert machine.process is not None
    machine.process.check_alive()
    out = machine.process.output()
    return FOLLOWS in out and (RECOVERS not in out or CAUGHT_UP in out)


def stops(machine: Machine) -> str:
    """Wait until the replica's processes have exited; what this start printed."""
    process = machine.process
    assert process is not None
    wait_for(f"replica {machine.replica} to stop", lambda: not process.alive(), DEADLINE)
    process.stop()  # reaps the coordinator, if it outlived its binding
    out: str = process.output()
    return out


@pytest.mark.parametrize("registry", ["sqlite"], indirect=True)
def test_a_replica_restarted_with_other_flags_runs_in_the_registrys_group(
    cluster: Cluster,
) -> None:
    machines, registry, _ = cluster
    term = current_term(registry)
    assert term is not None
    replica = next(m for m in machines if m.replica != term.replica)
    replica.stop()
    replica.start(extra=("--replicas", "5", "--replication-ack", "3"))
    wait_for(f"replica {replica.replica} to rejoin", lambda: follows(replica), DEADLINE)
    assert (
        "the group of 'counter' is replicas 0,1,2 committing on 2, as the registry holds it"
        in replica.process_output()
    )
    assert current_term(registry) == term  # the term went on throughout
    assert stored_group(registry) == Group.of({0, 1, 2}, 2, version=1)


def test_replicas_join_and_leave_the_group_under_load_losing_no_call(
    cluster: Cluster, callers: Callers
) -> None:
    machines, registry, secret = cluster
    try:
        callers.wait_answers(30)
        # A new machine, started before the change: it waits, taking no part.
        new = Machine(machines[0].data_dir.parent, 3, registry, secret)
        machines.append(new)
        new.start()
        wait_for(
            "replica 3 to wait to be added",
            lambda: "replica 3 is not of the group of 'counter'" in new.process_output(),
            DEADLINE,
        )
        term = current_term(registry)
        assert term is not None
        out = change(registry, "--members", "0,1,2,3")
        assert "counter: changing to replicas 0,1,2,3 committing on 3 (changing from " in out
        assert "counter: settled, replicas 0,1,2,3 committing on 3" in out
        # The primary kept the role: a term of its own in the changing group.
        renewed = current_term(registry)
        assert renewed is not None and renewed.replica == term.replica
        assert renewed.epoch > term.epoch
        said = machines[term.replica].process_output()
        assert f"is primary from epoch {renewed.epoch} (the group of 'counter' changed" in said
        assert "settled the change of 'counter''s group: replicas 0,1,2,3 committing on 3" in said
        for m in (m for m in machines if m.replica != renewed.replica):
            wait_for(f"replica {m.replica} to hold its log", lambda m=m: follows(m), DEADLINE)
        callers.wait_answers(30)

        # Replica 0 leaves, and stops, saying so (if it was the primary, once it has
        # settled the change; the next term is of the three left).
        out = change(registry, "--members", "1,2,3")
        assert "counter: settled, replicas 1,2,3 committing on 2" in out
        left = stops(machines[0])
        assert "replica 0 left the group of 'counter' (replicas 1,2,3 committing on 2)" in left

        def of_the_three() -> bool:
            term = current_term(registry)
            return term is not None and term.replica in (1, 2, 3)

        wait_for("a primary of the three left", of_the_three, DEADLINE)
        now = current_term(registry)
        assert now is not None
        for m in (m for m in machines[1:] if m.replica != now.replica):
            wait_for(f"replica {m.replica} to hold its log", lambda m=m: follows(m), DEADLINE)
        callers.wait_answers(30)

        # The new group survives the loss of its primary's machine, disk and all.
        term = current_term(registry)
        assert term is not None and term.replica in (1, 2, 3)
        machines[term.replica].lose()
        wait_for("a new primary", lambda t=term: newer_term(registry, t), DEADLINE)
        callers.wait_answers(30)
    finally:
        callers.stop()
    counted_once(callers)
    group = stored_group(registry)
    assert group is not None and (group.replicas, group.k, group.previous) == (
        frozenset({1, 2, 3}),
        2,
        None,
    )
