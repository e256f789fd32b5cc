"""A real network partition between an immortal's replicas, with etcd choosing the primary.

Three replicas of the counter, each on a "machine" of its own: a network namespace with
one interface on a front network (the callers, etcd, the ingress addresses) and one on a
replication network (replica to replica), both bridges in the root namespace
(``tests/netns.py``). Under a load of ingress calls the primary's replication cable is
pulled. It still reaches etcd and its callers, so it goes on taking their calls; but it
can ship nothing, so it must commit, and answer, nothing it took since. The secondaries,
hearing nothing from it, take the role over; the registry's watch tells the cut-off
primary, which stops. Plugged in again and started again, it rejoins as a secondary.

The rules checked: no call is acknowledged without its quorum (a call first sent after
the cut is never answered by the cut-off primary, and at the end every call is counted
exactly once), and no two primaries acknowledge in the same epoch (the new term is a
later epoch held by another replica, and the old primary stops).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ambrosia_py.client import Client
from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.primary import Term, open_election
from ambrosia_py.testing import wait_for
from ambrosia_py.testing.processes import process_gone
from tests import netns
from tests import test_replicas_failover as failover
from tests.etcd_server import start_etcd
from tests.test_replicas_failover import DEADLINE, Registry, current_term

pytestmark = pytest.mark.timeout(300)

INGRESS_PORT = 7000  # every machine has its own addresses, so all may use one port
RECEIVE_PORT, SEND_PORT = 7001, 7002  # the binding's, on the machine's own loopback


class Replica(failover.Machine):
    """A replica's data dir and processes, its processes running on a machine of the
    network: replicas listen for each other, and publish that address, on the
    replication network; the ingress listens, and is published, on the front one."""

    def __init__(
        self, root: Path, host: netns.Machine, replica: int, registry: Registry, secret: Path
    ) -> None:
        super().__init__(root, replica, registry, secret)
        self.host = host
        self.ingress = f"{host.front_ip}:{INGRESS_PORT}"

    def start(self, env: dict[str, str] | None = None) -> None:
        assert env is None, "a replica on a machine of the network runs with the test's env"
        options = {
            "--registry": self.registry.spec,
            "--cluster": self.registry.cluster,
            "--secret-file": str(self.secret),
            "--replica": str(self.replica),
            "--replicas": "3",
            "--link-host": self.host.link_ip,
            "--ingress": self.ingress,
            "--receive-port": str(RECEIVE_PORT),
            "--send-port": str(SEND_PORT),
        }
        args = [word for option in options.items() for word in option]
        self.process = netns.NetnsProcess(
            self.host.namespace, str(self.service), self.instance, self.data_dir, args, log=self.log
        )
        self.process.start()


@attrs.frozen
class Answer:
    """One answered call, as its caller saw it."""

    value: Any
    where: str  # the ingress that answered: "counter at HOST:PORT"
    asked: float  # time.monotonic() when the call was made (before its first send)
    answered: float  # and when its answer came


class TracedClient(Client):
    """A client that notes each answer, where it came from and when its call was made."""

    answers: list[Answer]

    def call(
        self,
        method: Callable[..., Any],
        /,
        *args: Any,
        key: str | bytes | None = None,
        **kwargs: Any,
    ) -> Any:
        asked = time.monotonic()
        value = super().call(method, *args, key=key, **kwargs)
        answer = Answer(value, self.address, asked, time.monotonic())
        self.answers.append(answer)  # list.append: thread-safe
        return value


class TracedCallers(failover.Callers):
    """The failover test's callers, through :class:`TracedClient`s sharing one list."""

    def __init__(self, registry: Registry, secret: Path, n: int) -> None:
        super().__init__(registry, secret, n)
        self.traced: list[Answer] = []

    def _client(self) -> Client:
        client = TracedClient.connect(
            instance="counter",
            registry=self.registry.spec,
            cluster=self.registry.cluster,
            secret_file=self.secret,
            timeout=DEADLINE,
        )
        assert isinstance(client, TracedClient)
        client.answers = self.traced
        return client

    def answered_by(self, replica: Replica) -> list[Answer]:
        """The answers that came from ``replica``'s ingress."""
        return [a for a in list(self.traced) if a.where.endswith(f" at {replica.ingress}")]


Partitionable = tuple[list[Replica], Registry, Path]


@pytest.fixture
def partitionable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Partitionable]:
    """Three replicas on three machines, with etcd on the root namespace's front address;
    a primary chosen and both secondaries holding a checkpoint. Every process, namespace,
    cable and bridge is gone after the test, pass or fail."""
    yield from replica_machines(tmp_path, monkeypatch)


def replica_machines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, etcd_network: bool = False
) -> Iterator[Partitionable]:
    """What ``partitionable`` gives; with ``etcd_network``, etcd on a network of its
    own (``netns.network``)."""
    why = netns.unavailable()
    if why is not None:
        pytest.skip(why)
    monkeypatch.syspath_prepend(str(failover.COUNTER.parent))  # the callers import the counter
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    with contextlib.ExitStack() as cleanup:
        net = cleanup.enter_context(netns.network(3, etcd_network=etcd_network))
        etcd = start_etcd(tmp_path / "etcd", host=net.etcd_ip)
        cleanup.callback(etcd.stop)
        registry = Registry(f"{etcd.spec}?lease_ttl=1", f"c{os.getpid()}", tmp_path)
        replicas = [Replica(tmp_path, m, r, registry, secret) for r, m in enumerate(net.machines)]
        for replica in replicas:
            cleanup.callback(replica.stop)
            replica.start()
        wait_for(
            "a primary, and secondaries holding a checkpoint", lambda: ready(replicas), DEADLINE
        )
        yield replicas, registry, secret


def ready(replicas: list[Replica]) -> bool:
    """Whether a primary serves and every other replica could take over from it."""
    term = current_term(replicas[0].registry)
    others = [r for r in replicas if term is not None and r.replica != term.replica]
    return term is not None and all(failover.installed(r) for r in others)


def test_a_primary_cut_off_from_its_replicas_acknowledges_nothing_more(
    partitionable: Partitionable,
) -> None:
    replicas, registry, secret = partitionable
    callers = TracedCallers(registry, secret, 4)
    callers.start()
    try:
        term, old, coordinator = serving(replicas, registry, callers)
        old.host.cut()
        cut = time.monotonic()  # taken once the cable is out: later calls cannot be shipped
        # The secondaries take over: a later epoch, held by another replica.
        new_term, new = newer_primary(replicas, registry, term)
        # Calls are answered again, by the new primary.
        callers.wait_answers(30)
        assert callers.answered_by(new), "the new primary answers"
        # The cut-off primary, still reached by etcd's watch, finds it was deposed and
        # stops, its binding with it.
        out = stopped(old, coordinator)
        assert "the registry names replica" in out  # it learned from the registry

        # Plugged in again and started again, it rejoins as a secondary.
        old.host.heal()
        rejoined(old, registry, new_term)
        callers.wait_answers(20)
        assert current_term(registry) == new_term  # it came back as a secondary
    finally:
        callers.stop()
    failover.counted_once(callers)

    # No call made after the cut was answered by the cut-off primary: it could ship
    # nothing, so it could commit nothing. Calls in flight at the cut (at most one per
    # caller), committed before it, may still be answered by it: each counted once.
    late = [a for a in callers.answered_by(old) if a.answered > cut]
    print(f"the cut-off primary answered {len(late)} calls after the cut: {late}")
    made_after = [a for a in late if a.asked > cut]
    assert not made_after, f"the cut-off primary acknowledged {made_after} without a quorum"
    assert all(callers.answers.count(a.value) == 1 for a in late)


def serving(
    replicas: list[Replica], registry: Registry, callers: TracedCallers
) -> tuple[Term, Replica, int]:
    """Once calls are answered: the term, its primary, and its coordinator's pid."""
    callers.wait_answers(30)
    term = current_term(registry)
    assert term is not None
    primary = replicas[term.replica]
    assert primary.process is not None
    coordinator = primary.process.coordinator_pid()
    assert coordinator is not None
    assert callers.answered_by(primary), "the callers reach the primary's ingress"
    return term, primary, coordinator


def newer_primary(replicas: list[Replica], registry: Registry, term: Term) -> tuple[Term, Replica]:
    """Once a later term holds the role: it, and its replica (never ``term``'s)."""
    wait_for("a newer term", lambda: failover.newer_term(registry, term), DEADLINE)
    new_term = current_term(registry)
    assert new_term is not None and new_term.replica != term.replica
    return new_term, replicas[new_term.replica]


def stopped(deposed: Replica, coordinator: int) -> str:
    """Once a deposed primary's coordinator and service process are gone: its output,
    which says it is primary no more."""
    wait_for("the deposed primary to stop", lambda: process_gone(coordinator), DEADLINE)
    process = deposed.process
    assert process is not None
    wait_for("its service process to exit", lambda: not process.alive(), DEADLINE)
    out = deposed.process_output()
    assert "is primary no more" in out
    return out


def rejoined(replica: Replica, registry: Registry, term: Term) -> None:
    """Start ``replica`` again; return once it follows and holds records of ``term``."""
    replica.start()
    wait_for(f"replica {replica.replica} to rejoin", lambda: following(replica), DEADLINE)
    wait_for(
        f"replica {replica.replica} to hold records of the new term",
        lambda: position(registry, replica) > term.log_position,
        DEADLINE,
    )


def position(registry: Registry, replica: Replica) -> int:
    """How far ``replica``'s log reaches, as it last published (about once a second; -1
    while it is not registered); registered on the replication network."""
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    with contextlib.closing(reg), contextlib.closing(open_election(reg)) as election:
        for live in election.replicas(replica.instance):
            if live.replica == replica.replica:
                assert live.address.host == replica.host.link_ip
                return live.log_position
    return -1


def following(replica: Replica) -> bool:
    """Whether a replica started again follows the primary's log as a secondary."""
    assert replica.process is not None
    replica.process.check_alive()
    return "the binding follows the log from checkpoint" in replica.process_output()
