"""Which replica is primary, in both registry backends: etcd (a real one, started for this
module) and a SQLite file shared by processes with separate data dirs.

Replicas are :class:`PrimaryElection` objects over registries opened as separate processes
would, or child processes (``tests/primary_holder.py``) where a holder is killed or paused.
What must hold in both: one term at a time, epochs that only grow, a deposed primary that
knows it and cannot disturb the term after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.etcd_client import EtcdUnavailable
from ambrosia_py.coordinator.registry.etcd_primary import _replica
from ambrosia_py.coordinator.registry.interface import Endpoint, RegistryError
from ambrosia_py.coordinator.registry.primary import (
    PrimaryElection,
    Replica,
    Term,
    open_election,
)
from ambrosia_py.testing.processes import DEADLINE, readline_within, wait_for
from tests.etcd_server import EtcdServer, etcd_server
from tests.test_registry_backends import REPO, Backend, backend

__all__ = ["backend", "etcd_server"]  # fixtures, used through their names

NAME = "svc"
T = TypeVar("T")

Elect = Callable[[int], PrimaryElection]


@pytest.fixture
def elect(backend: Backend) -> Iterator[Elect]:
    """Replica N of ``svc`` as a process of its own would hold it: its own registry and
    election, the replica registered. Closed before the registries."""
    backend.open("setup").register(NAME)
    made: list[PrimaryElection] = []

    def replica(number: int) -> PrimaryElection:
        election = open_election(backend.open(f"replica{number}"))
        made.append(election)
        election.register_replica(NAME, number, Endpoint("127.0.0.1", 7000 + number), 0)
        return election

    try:
        yield replica
    finally:
        for election in made:
            election.close()


class Holder:
    """A child process that took the role as replica ``replica``."""

    def __init__(self, backend: Backend, replica: int) -> None:
        arguments = [backend.spec, str(backend.tmp_path / f"holder{replica}"), backend.cluster]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.primary_holder", *arguments, NAME, str(replica)],
            cwd=REPO,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self._line()
        assert line.startswith("primary "), f"the holder says {line!r}"
        self.term = Term(NAME, replica, int(line.split()[1]), 0)

    def _line(self) -> str:
        assert self.process.stdout is not None
        return readline_within(self.process.stdout).strip()

    def ask(self, command: str) -> str:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        return self._line()

    def signal(self, number: int) -> None:
        os.kill(self.process.pid, number)

    def end(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.signal(signal.SIGCONT)
        self.process.kill()
        self.process.wait(DEADLINE)


@pytest.fixture
def holder(backend: Backend, elect: Elect) -> Iterator[Callable[[int], Holder]]:
    started: list[Holder] = []

    def start(replica: int) -> Holder:
        started.append(Holder(backend, replica))
        return started[-1]

    try:
        yield start
    finally:
        for one in started:
            one.end()


def eventually(what: str, attempt: Callable[[], T | None]) -> T:
    """``attempt()``'s first answer that is not ``None``, within the deadline."""
    found: list[T] = []

    def done() -> bool:
        answer = attempt()
        if answer is not None:
            found.append(answer)
        return bool(found)

    wait_for(what, done)
    return found[0]


def test_the_first_campaign_wins_and_others_lose_while_it_holds(
    backend: Backend, elect: Elect
) -> None:
    one, two = elect(1), elect(2)
    assert isinstance(one, PrimaryElection) and one.current(NAME) is None
    first = one.campaign(NAME, 1, 10, group_version=0)
    assert first is not None and first.replica == 1 and first.log_position == 10
    assert first.epoch > 0
    assert two.campaign(NAME, 2, 20, group_version=0) is None
    assert two.current(NAME) == one.current(NAME) == first
    assert one.still_primary(first) and two.still_primary(first)
    assert [r.replica for r in two.replicas(NAME)] == [1, 2]
    assert one.replicas(NAME)[1] == Replica(2, Endpoint("127.0.0.1", 7002), 0, socket.gethostname())
    one.register_replica(NAME, 1, Endpoint("127.0.0.1", 7001), 30)  # its log moved on
    assert two.replicas(NAME)[0].log_position == 30
    with pytest.raises(RegistryError, match="registered by another live process"):
        two.register_replica(NAME, 1, Endpoint("127.0.0.1", 7003), 0)
    with pytest.raises(RegistryError, match="register it in this process first"):
        two.campaign(NAME, 3, 0, group_version=0)
    one.resign(first)
    assert two.current(NAME) is None and not one.still_primary(first)
    second = two.campaign(NAME, 2, 20, group_version=0)
    assert second is not None and second.epoch > first.epoch
    one.resign(first)  # long over: the term after it stays
    one.resign(second)  # not its own to end
    assert one.current(NAME) == second


def test_a_replica_says_whether_it_recovers(backend: Backend, elect: Elect) -> None:
    one = elect(1)
    assert not one.replicas(NAME)[0].recovering  # registered as the fixture does
    one.register_replica(NAME, 1, Endpoint("127.0.0.1", 7001), 3, recovering=True)
    assert one.replicas(NAME)[0].recovering
    one.register_replica(NAME, 1, Endpoint("127.0.0.1", 7001), 40)  # caught up
    (replica,) = one.replicas(NAME)
    assert (replica.log_position, replica.recovering) == (40, False)


def test_an_etcd_replica_record_without_recovering_reads_as_not_recovering() -> None:
    key, base = "/c/replicas/svc/1", '"host":"h","host_name":"m","log_position":4,"port":7001'
    assert not _replica(key, "1", ("{" + base + "}").encode()).recovering
    assert _replica(key, "1", ("{" + base + ',"recovering":true}').encode()).recovering
    with pytest.raises(RegistryError, match="field 'recovering' is 'yes', not true or false"):
        _replica(key, "1", ("{" + base + ',"recovering":"yes"}').encode())


def test_a_sqlite_registry_made_before_gains_the_column(tmp_path: Path) -> None:
    """A registry file whose replicas table has no ``recovering`` column (as made before
    replicas said it) gains it, its rows reading as not recovering."""
    spec = str(tmp_path / "registry.sqlite3")
    reg = open_registry(spec, tmp_path, "c")
    reg.register(NAME)
    reg.close()
    with sqlite3.connect(spec) as db:
        db.execute(
            "CREATE TABLE replicas (name TEXT NOT NULL REFERENCES instances(name), "
            "replica INTEGER NOT NULL, host TEXT NOT NULL, port INTEGER NOT NULL, "
            "host_name TEXT NOT NULL, log_position INTEGER NOT NULL, "
            "PRIMARY KEY (name, replica))"
        )
        db.execute("INSERT INTO replicas VALUES (?, 1, '127.0.0.1', 7001, 'm', 8)", (NAME,))
    reg = open_registry(spec, tmp_path, "c")
    try:
        election = open_election(reg)
        try:
            election.register_replica(NAME, 2, Endpoint("127.0.0.1", 7002), 9, recovering=True)
            with sqlite3.connect(spec) as db:
                rows = db.execute("SELECT replica, recovering FROM replicas ORDER BY replica")
                assert rows.fetchall() == [(1, 0), (2, 1)]
        finally:
            election.close()
    finally:
        reg.close()


def test_a_killed_holders_role_is_won_with_a_higher_epoch(
    backend: Backend, elect: Elect, holder: Callable[[int], Holder]
) -> None:
    other = elect(2)
    held = holder(1)
    assert other.current(NAME) == held.term and other.campaign(NAME, 2, 0, group_version=0) is None
    held.signal(signal.SIGKILL)
    # etcd: its lease (1 s) runs out; SQLite: the kernel dropped its lock at once.
    won = eventually("the role to be won", lambda: other.campaign(NAME, 2, 0, group_version=0))
    assert won.epoch > held.term.epoch and other.current(NAME) == won
    wait_for("the killed replica to vanish", lambda: len(other.replicas(NAME)) == 1)


def race_take_overs(
    elections: dict[int, PrimaryElection], seen: Term, racers: tuple[int, ...]
) -> dict[int, Term | None]:
    """What each of ``racers`` got from taking over from ``seen``, all let go at once."""
    barrier = threading.Barrier(len(racers))
    won: dict[int, Term | None] = {}

    def race(n: int) -> None:
        barrier.wait(DEADLINE)
        won[n] = elections[n].take_over(NAME, n, seen, 0, group_version=0)

    threads = [threading.Thread(target=race, args=(n,)) for n in racers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    return won


def test_racing_take_overs_of_one_term_have_one_winner(backend: Backend, elect: Elect) -> None:
    elections = {n: elect(n) for n in (1, 2, 3)}
    seen = elections[1].campaign(NAME, 1, 0, group_version=0)
    assert seen is not None
    for _ in range(20):
        if backend.kind == "sqlite":
            # One machine: a take-over waits for the lock, so the holder must be gone.
            elections[seen.replica].resign(seen)
        won = race_take_overs(elections, seen, (1, 2, 3))
        winners = [term for term in won.values() if term is not None]
        assert len(won) == 3 and len(winners) == 1, won
        assert winners[0].epoch > seen.epoch
        assert elections[1].current(NAME) == winners[0]
        seen = winners[0]


def test_a_paused_holder_is_deposed_and_cannot_disturb_the_next_term(
    backend: Backend, elect: Elect, holder: Callable[[int], Holder]
) -> None:
    other = elect(2)
    held = holder(1)
    held.signal(signal.SIGSTOP)
    if backend.kind == "sqlite":
        # A paused process keeps its lock: no take-over on one machine until it is gone.
        assert other.take_over(NAME, 2, held.term, 0, group_version=0) is None
        assert (
            other.campaign(NAME, 2, 0, group_version=0) is None and other.current(NAME) == held.term
        )
        held.signal(signal.SIGCONT)
        assert held.ask("still") == "yes"
        held.signal(signal.SIGKILL)
        won = eventually(
            "the take-over", lambda: other.take_over(NAME, 2, held.term, 0, group_version=0)
        )
        assert won.epoch > held.term.epoch
        return
    # etcd: taken over at once (lost by the replicas' own heartbeats), before the TTL.
    won_now = other.take_over(NAME, 2, held.term, 0, group_version=0)
    assert won_now is not None and won_now.epoch > held.term.epoch
    # Past the holder's TTL its lease ends; the term it lost went onto the taker's lease.
    wait_for("the paused holder's lease to end", lambda: len(other.replicas(NAME)) == 1)
    assert other.current(NAME) == won_now
    held.signal(signal.SIGCONT)
    assert held.ask("still") == "no"
    assert held.ask("resign") == "resigned"
    assert other.current(NAME) == won_now and other.still_primary(won_now)


async def expect(watch: AsyncGenerator[Term | None, None], wanted: Term | None) -> None:
    """The next term ``watch`` yields is ``wanted``, within the deadline."""
    try:
        assert await asyncio.wait_for(anext(watch), DEADLINE) == wanted
    except TimeoutError:
        raise AssertionError(f"the watch did not yield {wanted}") from None


async def test_watch_primary_sees_each_term(backend: Backend, elect: Elect) -> None:
    one, two = elect(1), elect(2)
    watch = two.watch_primary(NAME)
    try:
        await expect(watch, None)
        first = await asyncio.to_thread(one.campaign, NAME, 1, 0, group_version=0)
        await expect(watch, first)
        await asyncio.to_thread(one.resign, first)
        await expect(watch, None)
        second = await asyncio.to_thread(two.campaign, NAME, 2, 5, group_version=0)
        await expect(watch, second)
        assert first is not None and second is not None
        if backend.kind == "sqlite":  # a take-over waits for the holder's lock
            await asyncio.to_thread(two.resign, second)
            await expect(watch, None)
        third = await asyncio.to_thread(one.take_over, NAME, 1, second, 9, group_version=0)
        assert third is not None and first.epoch < second.epoch < third.epoch
        await expect(watch, third)
    finally:
        await watch.aclose()


def test_an_etcd_restart_never_lowers_the_epoch(etcd_server: EtcdServer, tmp_path: Path) -> None:
    store = Backend("etcd", tmp_path, etcd_server)
    store.open("setup").register(NAME)
    one, two = open_election(store.open("one")), open_election(store.open("two"))
    try:
        one.register_replica(NAME, 1, Endpoint("127.0.0.1", 7001), 0)
        two.register_replica(NAME, 2, Endpoint("127.0.0.1", 7002), 0)
        first = one.campaign(NAME, 1, 0, group_version=0)
        assert first is not None
        etcd_server.kill()
        etcd_server.start()
        now = eventually("etcd to answer again", lambda: _answer(lambda: two.current(NAME)))
        if now[0] is None:  # the lease ran out meanwhile: a new term, higher
            later = two.campaign(NAME, 2, 0, group_version=0)
            assert later is not None and later.epoch > first.epoch
        else:
            assert now[0] == first or now[0].epoch > first.epoch
        for held in (one.current(NAME), two.current(NAME)):
            if held is not None:
                (one if held.replica == 1 else two).resign(held)
        again = two.campaign(NAME, 2, 0, group_version=0)
        assert again is not None and again.epoch > first.epoch
    finally:
        one.close()
        two.close()
        store.close()


def _answer(ask: Callable[[], T]) -> tuple[T] | None:
    """``(ask(),)``, or ``None`` while etcd cannot be reached."""
    try:
        return (ask(),)
    except EtcdUnavailable:
        return None
