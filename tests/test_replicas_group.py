"""Every replica of an instance runs in one group (``--replicas``, ``--replication-ack``):
real processes, a shared SQLite registry. A replica started with another group stops,
saying so, and the others serve on untouched: refused at start when its data dir holds
a log of the group, stopped by the primary's NEW_TERM when it starts empty. Started as
the others, it rejoins.

Why it matters: a term's quorum (``n - k + 1`` replicas) meets every set of ``k`` a
record was committed on only when both sides count alike. Three replicas committing on
2, and one restarted as one of 3 committing on 3, would take a term with its own
position alone and go on without a record the other two hold.
"""

from __future__ import annotations

import shutil

import pytest

from ambrosia_py.testing import wait_for
from tests.test_replicas_failover import (
    DEADLINE,
    Cluster,
    Machine,
    cluster,
    current_term,
    etcd_server,
    installed,
    registry,
)

__all__ = ["cluster", "etcd_server", "registry"]  # fixtures, used through their names

pytestmark = pytest.mark.timeout(300)


def _stops(machine: Machine) -> str:
    """Wait until the replica's processes have exited; what this start printed."""
    process = machine.process
    assert process is not None
    wait_for("the replica to stop", lambda: not process.alive(), DEADLINE)
    process.stop()  # reaps the coordinator, if it outlived its binding
    out: str = process.output()
    return out


@pytest.mark.parametrize("registry", ["sqlite"], indirect=True)
def test_a_replica_of_another_group_stops_saying_so_and_rejoins_as_the_others(
    cluster: Cluster,
) -> None:
    machines, registry, _ = cluster
    term = current_term(registry)
    assert term is not None
    replica = next(m for m in machines if m.replica != term.replica)

    # Holding a log of the group of 3 committing on 2: refused before it does anything.
    replica.stop()
    replica.start(extra=("--replicas", "5"))
    out = _stops(replica)
    assert "started with --replicas 5 --replication-ack 3" in out
    assert "holds the log of a group of 3 replicas committing on 2" in out
    assert "Start it with --replicas 3 --replication-ack 2." in out

    # Empty, it has nothing to check at start: the primary's NEW_TERM tells it.
    shutil.rmtree(replica.data_dir)
    replica.start(extra=("--replication-ack", "3"))
    out = _stops(replica)
    assert f"replica {term.replica}, primary of epoch {term.epoch}, runs in a group of " in out
    assert "replicas 0,1,2 committing on 2; this replica was started in one of replicas " in out
    assert "0,1,2 committing on 3 (--replicas, --replication-ack)" in out

    # As the others, it rejoins; the primary's term went on throughout.
    replica.start()
    wait_for(f"replica {replica.replica} to rejoin", lambda: installed(replica), DEADLINE)
    assert current_term(registry) == term
