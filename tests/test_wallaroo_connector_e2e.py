"""The connector immortal end to end: ``ambrosia-py run immortals.wallaroo.connector``.

Real processes on loopback: connectors (a file, a generator, an Ockam stream through a
real hub) feed a worker (``ambrosia-py run immortals.wallaroo.worker``) whose
application counts words. Mid-stream the connectors, the worker and the hub are
SIGKILLed (service process, coordinator, or both) and started again with the same
command, more than once; every stream must end with the worker's counts equal to
exactly-once processing of the source, and ``ambrosia-py replay --verify`` must find the
connector's recorded history deterministic. A worker told to move its connectors
(MIGRATE in the draft, RESTART in v3) hands the stream to a second worker with nothing
lost or taken twice across both. A connector with the wrong cookie is refused, again
and again with back-off, while a healthy one streams on.

Every wait has a deadline; kills land when the worker has applied a given number of
messages (read through its control port), never after a sleep.
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing import wait_for as _wait_for
from immortals.ockam.hub_client import OckamClient, Publisher
from immortals.wallaroo import stream_id_for
from immortals.wallaroo.sources import generate
from immortals.wallaroo.worker_client import request

ROOT = Path(__file__).resolve().parents[1]
COOKIE = "e2e-cookie"
DEADLINE = 180.0  # seconds for a whole exchange to finish
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def wait_for(
    what: str,
    condition: Callable[[], bool],
    timeout: float = DEADLINE,
    context: Callable[[], str] = lambda: "",
) -> None:
    """The testing helper's wait, with this file's deadline."""
    _wait_for(what, condition, timeout, context)


class Service(ServiceProcess):
    """One ``ambrosia-py run SERVICE`` and its coordinator child process."""

    def __init__(self, data_dir: Path, instance: str, service: str, *args: str) -> None:
        super().__init__(service, instance, data_dir, args, cwd=ROOT, env=ENV)


class Worker(Service):
    def __init__(self, data_dir: Path, instance: str, dialect: str, *extra: str) -> None:
        self.port = free_port()
        self.control = f"127.0.0.1:{free_port()}"
        self.address = f"127.0.0.1:{self.port}"
        super().__init__(
            data_dir,
            instance,
            "immortals.wallaroo.worker",
            *("--listen", self.address, "--control", self.control, "--cookie", COOKIE),
            *("--dialect", dialect, "--app", "tests.wallaroo_apps:word_count"),
            *("--max-credits", "100", "--refill-credits", "50", *extra),
        )

    def start(self) -> None:
        super().start()
        wait_for(f"worker {self.instance}\n{self.tail()}", self._answers, 60)

    def _answers(self) -> bool:
        if not self.alive():
            raise AssertionError(f"worker {self.instance} exited:\n{self.tail()}")
        try:
            request(self.control, COOKIE, {"op": "status"}, timeout=2)
            return True
        except (OSError, ValueError):
            return False

    def status(self) -> dict[str, Any]:
        answer = request(self.control, COOKIE, {"op": "status"})
        assert answer["ok"], answer
        return dict(answer["status"])

    def applied(self) -> int:
        return int(self.status()["app_state"].get("messages", 0))

    def stream(self, name: str) -> dict[str, Any] | None:
        s = self.status()["streams"].get(str(stream_id_for(name)))
        return None if s is None else dict(s)

    def counts(self) -> Counter[str]:
        return Counter(self.status()["app_state"].get("counts", {}))


class Connector(Service):
    def __init__(
        self, data_dir: Path, instance: str, worker: Worker, source: str, dialect: str, *extra: str
    ) -> None:
        super().__init__(
            data_dir,
            instance,
            "immortals.wallaroo.connector",
            *("--worker", worker.address, "--cookie", COOKIE, "--dialect", dialect),
            *("--source", source, "--backoff-max", "0.5", *extra),
        )


@pytest.fixture
def processes() -> Iterator[list[Service]]:
    """Every process a test starts, stopped pass or fail."""
    started: list[Service] = []
    try:
        yield started
    finally:
        for p in started:
            p.stop()


def words(lines: list[bytes]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in lines:
        counts.update(line.decode().split())
    return counts


def text(lines: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    vocabulary = [f"t{k}" for k in range(50)]
    return [" ".join(rng.choices(vocabulary, k=rng.randint(1, 9))).encode() for _ in range(lines)]


def finished(worker: Worker, name: str, point: int) -> bool:
    s = worker.stream(name)
    return s is not None and s["point"] == point and s["state"] == "closed"


def kill_at(
    plan: list[tuple[int, Service, str]], applied: Callable[[], int], done: Callable[[], bool]
) -> list[str]:
    """Run ``plan`` ((messages applied, process, which)): SIGKILL each when the worker
    has applied that many messages, start it again; then wait for ``done``."""
    kills = []
    deadline = time.monotonic() + DEADLINE
    for at, victim, which in plan:
        wait_for(f"{at} messages before killing {victim.instance}", lambda at=at: applied() >= at)
        before = applied()
        victim.kill(which)
        kills.append(f"{victim.instance}:{which}@{before}")
        victim.start()
    victims = list({id(v): v for _, v, _ in plan}.values())
    wait_for(
        "every stream to finish",
        done,
        max(1.0, deadline - time.monotonic()),
        context=lambda: (
            f"applied {applied()}, kills {kills}\n"
            + "\n".join(f"--- {svc.instance}:\n{svc.tail(3000)}" for svc in victims)
        ),
    )
    return kills


def replay_verify(service: Service) -> None:
    replay = subprocess.run(
        [
            *(sys.executable, "-m", "ambrosia_py.cli", "replay", service.service),
            *("--instance", service.instance, "--data-dir", str(service.data_dir), "--verify"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=ENV,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "deterministic" in replay.stdout


# --- the tests ----------------------------------------------------------------------------


def test_a_file_and_a_generator_exactly_once_through_sigkills(
    tmp_path: Path, processes: list[Service]
) -> None:
    lines = text(12000, 1)
    path = tmp_path / "words.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    gen, n_gen = "gen://12000?seed=3", 12000
    worker = Worker(tmp_path / "w", "worker", "draft")
    files = Connector(tmp_path / "c1", "files", worker, f"file://{path}", "draft")
    gens = Connector(tmp_path / "c2", "gens", worker, gen, "draft")
    processes += [worker, files, gens]
    worker.start()
    files.start()
    gens.start()
    total = len(lines) + n_gen
    name = f"file://{path}"
    # Kills from a tenth to six tenths in: the stream must still be running when the last
    # lands, and on an idle machine thousands of records pass between a poll and a kill.
    plan = [
        (total // 10, files, "service"),
        (2 * total // 10, worker, "coordinator"),
        (3 * total // 10, gens, "both"),
        (4 * total // 10, worker, "service"),
        (5 * total // 10, files, "coordinator"),
        (6 * total // 10, worker, "both"),
    ]
    kills = kill_at(
        plan,
        worker.applied,
        lambda: finished(worker, name, len(lines)) and finished(worker, gen, n_gen),
    )
    print("kills (process:which@messages applied just before):", kills)
    assert len(kills) == 6
    assert all(int(k.rsplit("@", 1)[1]) < total for k in kills)  # mid-stream
    expected = words(lines) + words([generate(3, k) for k in range(1, n_gen + 1)])
    status = worker.status()
    assert status["app_state"]["messages"] == total, kills
    assert worker.counts() == expected
    for c in (files, gens):
        c.stop()
        replay_verify(c)


@pytest.mark.parametrize("dialect", ["draft", "v3"])
def test_the_duplicates_of_a_run_with_no_crash(
    tmp_path: Path, processes: list[Service], dialect: str
) -> None:
    """With no crash, no reconnect and no NACK nothing is re-sent, so the worker's
    ``duplicates`` (v3: ids at or below the stream's point, dropped) is 0; the draft
    drops nothing by id, and its end of stream (a MESSAGE flagged EOS, no payload, at the
    last id sent) moves the point to where it was. Nothing is applied twice."""
    lines = text(300, 7)
    path = tmp_path / "words.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    worker = Worker(tmp_path / "w", "worker", dialect)
    conn = Connector(tmp_path / "c", "files", worker, f"file://{path}", dialect)
    processes += [worker, conn]
    worker.start()
    conn.start()
    wait_for("the stream to end", lambda: finished(worker, f"file://{path}", len(lines)))
    status = worker.status()
    assert status["applied"] == status["app_state"]["messages"] == len(lines)
    assert worker.counts() == words(lines)
    assert status["duplicates"] == 0
    assert worker.starts == conn.starts == 1  # no crash, no restart


def test_v3_generator_exactly_once_through_sigkills(
    tmp_path: Path, processes: list[Service]
) -> None:
    gen, n = "gen://8000?seed=9", 8000
    worker = Worker(tmp_path / "w", "worker", "v3")
    conn = Connector(tmp_path / "c", "conn", worker, gen, "v3")
    processes += [worker, conn]
    worker.start()
    conn.start()
    plan = [(n // 5, conn, "both"), (2 * n // 5, worker, "service"), (3 * n // 5, conn, "service")]
    kill_at(plan, worker.applied, lambda: finished(worker, gen, n))
    assert worker.applied() == n
    assert worker.counts() == words([generate(9, k) for k in range(1, n + 1)])


class Move:
    """Two workers sharing a data dir (so they find each other's calls), a generator's
    connector streaming to ``a``, and ``a`` told to move it to ``b`` once it has applied
    ``share`` of the records; then :meth:`wait_finished`, and across both, exactly once."""

    def __init__(
        self, tmp_path: Path, processes: list[Service], dialect: str, seed: int, n: int
    ) -> None:
        self.gen, self.n, self.seed = f"gen://{n}?seed={seed}", n, seed
        self.a = Worker(tmp_path / "w", "a", dialect)
        self.b = Worker(tmp_path / "w", "b", dialect)
        self.conn = Connector(tmp_path / "c", "conn", self.a, self.gen, dialect)
        processes += [self.a, self.b, self.conn]
        for process in (self.a, self.b, self.conn):
            process.start()

    def order(self, share: float) -> dict[str, Any]:
        """Wait until ``a`` has applied ``share`` of the records, tell it to move; its
        answer."""
        wait_for(f"{share:.0%} of the stream at a", lambda: self.a.applied() >= self.n * share)
        body = {"op": "move", "target": self.b.address, "instance": "b"}
        return dict(request(self.a.control, COOKIE, body))

    def wait_finished(self) -> None:
        a, b = self.a, self.b
        wait_for(
            "the stream to finish at b",
            lambda: finished(b, self.gen, self.n),
            context=lambda: (
                f"applied a={a.applied()} b={b.applied()}\n"
                + "\n".join(f"--- {s.instance}:\n{s.tail(3000)}" for s in (a, b, self.conn))
            ),
        )
        assert a.applied() + b.applied() == self.n
        records = [generate(self.seed, k) for k in range(1, self.n + 1)]
        assert a.counts() + b.counts() == words(records)


@pytest.mark.parametrize("dialect", ["draft", "v3"])
def test_a_worker_moves_its_connector_mid_stream(
    tmp_path: Path, processes: list[Service], dialect: str
) -> None:
    """Draft: MIGRATE (seed 001); v3: RESTART. The stream's point goes from a to b first
    (calls between the two immortals, which share a data dir and so find each other),
    with the default options: across both workers, exactly once."""
    move = Move(tmp_path, processes, dialect, seed=4, n=12000)
    answer = move.order(1 / 4)
    assert answer == {"ok": True, "streams": 1, "to": "b"}, answer
    move.wait_finished()
    assert move.n // 4 <= move.a.applied() < move.n
    log = move.conn.tail(100_000)
    assert ("migrated to" if dialect == "draft" else "sent RESTART to") in log
    # The connector goes on to the new worker after a restart too: its target is state.
    move.conn.kill("both")
    move.conn.start()
    wait_for("the restarted connector at b", lambda: len(move.b.status()["connections"]) == 1)
    assert not move.a.status()["connections"]


@pytest.mark.parametrize("dialect", ["draft", "v3"])
def test_a_move_is_exactly_once_through_sigkills_of_both_workers(
    tmp_path: Path, processes: list[Service], dialect: str
) -> None:
    """The old worker SIGKILLed right after it was told to move (the hand-off to b under
    way, its connector on the move), then the new one once it took over: across both,
    every record exactly once, and the stream closed where it ended."""
    move = Move(tmp_path, processes, dialect, seed=6, n=9000)
    answer = move.order(1 / 3)
    assert answer["ok"], answer
    move.a.kill("both")
    move.a.start()
    wait_for("b to take the stream over", lambda: move.b.applied() >= 1)
    move.b.kill("service")
    move.b.start()
    move.wait_finished()
    moved = move.a.status()["move"]
    assert moved["done"] and moved["handed"] == 1, moved


@pytest.mark.parametrize("dialect", ["draft", "v3"])
def test_a_rewind_from_the_worker_is_followed(
    tmp_path: Path, processes: list[Service], dialect: str
) -> None:
    """Draft: a NACK; v3: an ACK with a lower point. Draft: the records after the point
    up to where the worker was are taken exactly once more (the stream ignores MESSAGEs
    until the connector's NOTIFY), the rest once. v3 has no such pause: messages in
    flight past the point move it on again, so the connector's resends may all be
    duplicates; either way each record is taken once, or twice if it was rewound over."""
    gen, n = "gen://10000?seed=12", 10000
    worker = Worker(tmp_path / "w", "worker", dialect)
    conn = Connector(tmp_path / "c", "conn", worker, gen, dialect)
    processes += [worker, conn]
    worker.start()
    conn.start()
    wait_for("a third of the stream", lambda: worker.applied() >= n // 3)
    point = int((worker.stream(gen) or {})["point"])
    back = point - 300
    answer = request(worker.control, COOKIE, {"op": "nack", "stream": gen, "point": back})
    assert answer["ok"], answer
    wait_for("the stream to finish", lambda: finished(worker, gen, n))
    at = worker.applied() - n + back  # the last record taken twice
    assert (point if dialect == "draft" else back) <= at < n
    records = [generate(12, k) for k in range(1, n + 1)]
    assert worker.counts() == words(records) + words(records[back:at])
    assert "rewound" in conn.tail(100_000) or "NACKed" in conn.tail(100_000)


def test_a_wrong_cookie_is_refused_without_disturbing_a_healthy_connector(
    tmp_path: Path, processes: list[Service]
) -> None:
    gen, n = "gen://6000?seed=6", 6000
    worker = Worker(tmp_path / "w", "worker", "draft")
    healthy = Connector(tmp_path / "c1", "healthy", worker, gen, "draft")
    intruder = Service(
        tmp_path / "c2",
        "intruder",
        "immortals.wallaroo.connector",
        *("--worker", worker.address, "--cookie", "wrong", "--source", "gen://100?seed=1"),
        *("--backoff-max", "0.2"),
    )
    processes += [worker, healthy, intruder]
    worker.start()
    healthy.start()
    wait_for("the healthy connector streaming", lambda: worker.applied() >= 500)
    intruder.start()
    wait_for("two refusals", lambda: intruder.tail(100_000).count("sent ERROR: Bad cookie") >= 2)
    wait_for("the healthy stream to finish", lambda: finished(worker, gen, n))
    assert worker.applied() == n
    assert worker.counts() == words([generate(6, k) for k in range(1, n + 1)])
    assert worker.stream("gen://100?seed=1") is None
    assert intruder.alive()  # it backs off and tries again; it does not give up or crash


def test_an_ockam_stream_through_a_hub_exactly_once_through_sigkills(
    tmp_path: Path, processes: list[Service]
) -> None:
    hub_port = free_port()
    hub = Service(
        tmp_path / "hub", "hub", "immortals.ockam.hub", "--listen", f"127.0.0.1:{hub_port}"
    )
    worker = Worker(tmp_path / "w", "worker", "draft")
    source = f"ockam://127.0.0.1:{hub_port}/words"
    conn = Connector(tmp_path / "c", "conn", worker, source, "draft")
    processes += [hub, worker, conn]
    hub.start()
    worker.start()
    lines = text(4000, 8)
    first, second = lines[:2500], lines[2500:]

    def publish(payloads: list[bytes]) -> None:
        asyncio.run(Publisher("127.0.0.1", hub_port, "words", window=200).publish(payloads))

    publish(first)
    conn.start()
    name = "ockam:words"

    def at(point: int) -> Callable[[], bool]:
        return lambda: (worker.stream(name) or {}).get("point") == point

    plan = [(400, hub, "both"), (800, conn, "service"), (1200, worker, "coordinator")]
    plan += [(1600, hub, "coordinator"), (2000, conn, "both")]
    kills = kill_at(plan, worker.applied, at(len(first)))
    publish(second)  # more arrives while the connector waits on the hub: it picks it up
    plan = [(2800, worker, "service"), (3200, hub, "service")]
    kills += kill_at(plan, worker.applied, at(len(lines)))
    print("kills (process:which@messages applied just before):", kills)
    assert all(int(k.rsplit("@", 1)[1]) < len(lines) for k in kills)  # mid-stream
    assert worker.applied() == len(lines)
    assert worker.counts() == words(lines)

    async def saved() -> int | None:  # acknowledged points reach the index service
        try:
            client = await OckamClient.connect("127.0.0.1", hub_port)
        except ConnectionRefusedError:
            return None  # the hub's service, killed last, is not listening again yet
        try:
            return await client.get_index("conn", "words")
        finally:
            await client.close()

    wait_for("the index service to hold the last point", lambda: asyncio.run(saved()) == 4000)
