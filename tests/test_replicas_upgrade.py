"""A live upgrade of an instance with replicas, under a load of ingress calls: four
replicas of the counter run version 0 (``examples/counter.py``), committing on 2
(``--replication-ack 2``), sharing a SQLite registry or a real etcd. Two secondaries are
started again, one at a time, with the new code told to upgrade (``--upgrade-from
counter.py --upgrade-version 1``); they replay with the old code meanwhile. Once both
hold the whole log and ask for the role, the primary hands it to one of them and stops:
that one upgrades as it takes the role (its binding's state converted, checkpointed as
version 1's first checkpoint, the registry moved to version 1), the other upgrades in
place where the log turns to version 1, and the secondary left on the old code stops
there. Calls go on throughout, and every one is counted exactly once, also after the
upgraded primary's machine is lost.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replica_state import load_replica_state
from ambrosia_py.testing import free_port, wait_for
from tests.etcd_server import EtcdServer, etcd_server
from tests.test_replicas_failover import (
    COUNTER,
    DEADLINE,
    Callers,
    Machine,
    Registry,
    counted_once,
    current_term,
    installed,
    newer_term,
    sqlite_machines,
    until_serving,
)

__all__ = ["etcd_server"]  # a fixture, used through its name

pytestmark = pytest.mark.timeout(300)

# Version 1 keeps the count as "total" and counts the adds made since the upgrade.
COUNTER_V1 = """
from typing import Any

from ambrosia_py import Immortal, rpc


class Counter(Immortal):
    version = 1

    def __init__(self) -> None:
        self.total = 0
        self.adds = 0

    @classmethod
    def upgrade_state(cls, state: dict[str, Any], from_version: int) -> dict[str, Any]:
        return {"total": state["count"], "adds": 0}

    @rpc
    def add(self, n: int) -> int:
        self.total += n
        self.adds += 1
        return self.total

    @rpc
    def get(self) -> int:
        return self.total

    @rpc
    def adds_since_upgrade(self) -> int:
        return self.adds
"""
UPGRADING = ("--upgrade-from", str(COUNTER), "--upgrade-version", "1")
IN_PLACE = re.compile(r"replica (\d+) upgraded to version 1 at seq (\d+)")


GROUP = ("--replicas", "4", "--replication-ack", "2")


@pytest.fixture(params=["sqlite", "etcd"])
def machines(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[list[Machine]]:
    """Four replicas sharing a SQLite registry (the role: a lock the primary holds until
    it stops), or etcd (a key another replica may take over while it lives)."""
    monkeypatch.syspath_prepend(str(COUNTER.parent))
    group = sqlite_machines(tmp_path, 4, *GROUP)
    if request.param == "etcd":
        server: EtcdServer = request.getfixturevalue("etcd_server")
        registry = Registry(f"{server.spec}?lease_ttl=1", f"c{os.getpid()}x{free_port()}", tmp_path)
        for m in group:
            m.registry = registry
    try:
        for m in group:
            m.start()
        until_serving(group)
        yield group
    finally:
        for m in group:
            m.stop()


def registry_version(registry: Registry) -> int:
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    try:
        info = reg.get("counter")
        assert info is not None
        return info.current_version
    finally:
        reg.close()


def follows(machine: Machine) -> bool:
    """Whether a replica's binding replays the log (it is a secondary keeping up)."""
    assert machine.process is not None
    machine.process.check_alive()
    return "the binding follows the log from checkpoint" in machine.process_output()


def restart_upgrading(machine: Machine, v1: Path) -> None:
    machine.stop()
    machine.service = v1
    machine.start(extra=UPGRADING)
    wait_for(f"replica {machine.replica} to follow", lambda: follows(machine), DEADLINE)


def stopped_saying(machine: Machine, words: str) -> None:
    process = machine.process
    assert process is not None
    wait_for(f"replica {machine.replica} to stop", lambda: not process.alive(), DEADLINE)
    assert words in process.output()


def test_a_live_upgrade_hands_the_role_over_and_loses_no_call(
    machines: list[Machine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    v1 = tmp_path / "counter_v1.py"
    v1.write_text(COUNTER_V1)
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = machines[0].registry
    callers = Callers(registry, machines[0].secret, 4)
    callers.start()
    try:
        callers.wait_answers(50)
        term = current_term(registry)
        assert term is not None
        old_primary = machines[term.replica]
        first, second, old = (m for m in machines if m is not old_primary)

        # One replica started to upgrade asks for the role alone: not enough of them
        # would follow version 1 to commit (k = 2), so the primary keeps it.
        restart_upgrading(first, v1)
        callers.wait_answers(30)
        assert current_term(registry) == term and registry_version(registry) == 0

        # A second one: the primary hands the role over to one of the two and stops.
        restart_upgrading(second, v1)
        wait_for("the role handed over", lambda: newer_term(registry, term), DEADLINE)
        callers.wait_answers(50)
        upgraded = current_term(registry)
        assert upgraded is not None and upgraded.replica in (first.replica, second.replica)
        taker = machines[upgraded.replica]
        other = second if taker is first else first
        out = taker.process_output()
        assert f"(replica {old_primary.replica} handed it over)" in out
        assert "upgraded to version 1" in out
        assert registry_version(registry) == 1
        stopped_saying(old_primary, f"handed the role to replica {taker.replica}")

        # The other upgraded in place where the log turned to version 1: its own first
        # checkpoint of version 1 there, its log going on in version 1's files.
        def in_place() -> re.Match[str] | None:
            assert other.process is not None
            other.process.check_alive()
            return IN_PLACE.search(other.process_output())

        wait_for(f"replica {other.replica} to upgrade in place", in_place, DEADLINE)
        found = in_place()
        assert found is not None and int(found[1]) == other.replica
        state = load_replica_state(InstanceFiles(other.data_dir, "counter", 1))
        assert state is not None and state.checkpoint is not None

        # The replica left on the old code stopped where the log turned, saying why.
        stopped_saying(old, "runs version 0 of 'counter'")
        assert "Start it with version 1's code" in old.process_output()

        # Both come back with the new code alone: they rejoin from a checkpoint of
        # version 1, as replicas with an empty data dir do.
        for m in (old_primary, old):
            m.service = v1
            m.start()
        for m in (old_primary, old):
            wait_for(f"replica {m.replica} to rejoin", lambda m=m: installed(m), DEADLINE)
        callers.wait_answers(30)

        # The upgraded primary's machine is lost: another takes over with version 1's
        # state, and calls go on.
        taker.lose()
        wait_for("a primary after the loss", lambda: newer_term(registry, upgraded), DEADLINE)
        callers.wait_answers(50)
    finally:
        callers.stop()
    counted_once(callers)
    from counter_v1 import Counter  # written above, on sys.path

    with callers._client() as client:
        adds = client.call(Counter.adds_since_upgrade)
    # Every add since the upgrade was counted by version 1's code, and only those.
    assert 0 < adds < len(callers.answers)
