"""Three replicas of the counter on one machine, each "machine" its own data dir and
processes, sharing one registry (a SQLite file, or a real etcd started for the module):
the primary's processes are SIGKILLed and its data dir deleted, round after round, under
a load of ingress calls; a secondary takes over, the lost replica rejoins empty, and at
the end every call is counted exactly once. With etcd, a primary paused past its lease
(SIGSTOP) is taken over from, and once resumed (SIGCONT) acknowledges nothing more: it
finds it was deposed and stops.

Each call goes through ``Client.connect(instance=...)``, which finds the ingress in the
registry before every connection, and retries a call whose connection failed with the
same idempotency key until it is answered: so every call a caller made is acknowledged
by the end, and the counter must equal the number of calls, with every answer (the count
after that call) distinct.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.bench.replica_cluster import could_lead
from ambrosia_py.client import Client
from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.primary import Term, open_election
from ambrosia_py.testing import ServiceProcess, free_port, wait_for
from ambrosia_py.testing.processes import process_gone
from tests.etcd_server import EtcdServer, etcd_server

__all__ = ["etcd_server"]  # a fixture, used through its name

COUNTER = Path(__file__).resolve().parent.parent / "examples" / "counter.py"
DEADLINE = 60.0

pytestmark = pytest.mark.timeout(300)


class Machine:
    """One replica's "machine": its data dir and its ``run`` process."""

    def __init__(
        self,
        root: Path,
        replica: int,
        registry: Registry,
        secret: Path,
        service: Path = COUNTER,
        instance: str = "counter",
        group: tuple[str, ...] = (),
    ) -> None:
        self.replica = replica
        self.group = group  # options every replica of the group is started with
        self.data_dir = root / f"{instance}{replica}"
        self.log = root / f"{instance}{replica}.log"
        self.registry = registry
        self.secret = secret
        self.service = service
        self.instance = instance
        self.process: ServiceProcess | None = None

    def start(self, env: dict[str, str] | None = None, extra: tuple[str, ...] = ()) -> None:
        args = [
            "--registry",
            self.registry.spec,
            "--cluster",
            self.registry.cluster,
            "--replica",
            str(self.replica),
            "--secret-file",
            str(self.secret),
            "--ingress",
            f"127.0.0.1:{free_port()}",
            "--receive-port",
            str(free_port()),
            "--send-port",
            str(free_port()),
            *self.group,
            *extra,
        ]
        self.process = ServiceProcess(
            str(self.service), self.instance, self.data_dir, args, log=self.log, env=env
        )
        self.process.start()

    def lose(self) -> None:
        """SIGKILL every process of this machine, and lose its disk."""
        assert self.process is not None
        self.process.kill("both")
        shutil.rmtree(self.data_dir)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def process_output(self) -> str:
        assert self.process is not None
        return self.process.output()


class Registry:
    """Where the replicas meet: a SQLite file, or etcd under a cluster of the test's own."""

    def __init__(self, spec: str, cluster: str, root: Path) -> None:
        self.spec = spec
        self.cluster = cluster
        self.root = root


def current_term(registry: Registry, instance: str = "counter") -> Term | None:
    reg = open_registry(registry.spec, registry.root, registry.cluster)
    try:
        election = open_election(reg)
        try:
            return election.current(instance)
        finally:
            election.close()
    finally:
        reg.close()


def newer_term(registry: Registry, than: Term) -> bool:
    """Whether a term after ``than`` holds the primary role now."""
    term = current_term(registry, than.instance)
    return term is not None and term.epoch > than.epoch


def installed(machine: Machine) -> bool:
    """Whether a replica could take over: it was sent a checkpoint and, if it started
    empty once the instance was founded (it recovers), has caught up since (until then
    no new term counts it)."""
    assert machine.process is not None
    machine.process.check_alive()
    return could_lead(machine.process.output())


def sqlite_machines(tmp_path: Path, n: int = 3, *group: str) -> list[Machine]:
    """``n`` replicas' machines (not started) sharing a SQLite registry and a secret,
    each started with ``group`` (the group's options: ``--replicas`` and the like)."""
    registry = Registry(str(tmp_path / "registry.sqlite3"), "ambrosia", tmp_path)
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    return [Machine(tmp_path, r, registry, secret, group=group) for r in range(n)]


@pytest.fixture(params=["sqlite", "etcd"])
def registry(request: pytest.FixtureRequest, tmp_path: Path) -> Registry:
    if request.param == "sqlite":
        return Registry(str(tmp_path / "registry.sqlite3"), "ambrosia", tmp_path)
    server: EtcdServer = request.getfixturevalue("etcd_server")
    return Registry(f"{server.spec}?lease_ttl=1", f"c{os.getpid()}x{free_port()}", tmp_path)


def until_serving(machines: list[Machine]) -> None:
    """Wait for a primary, and for every other replica to hold a checkpoint (so that it
    could take over)."""
    registry = machines[0].registry
    wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
    primary = current_term(registry)
    assert primary is not None
    for m in machines:
        if m.replica != primary.replica:
            wait_for(
                f"replica {m.replica} to hold a checkpoint", lambda m=m: installed(m), DEADLINE
            )


Cluster = tuple[list[Machine], Registry, Path]


@pytest.fixture
def cluster(registry: Registry, tmp_path: Path) -> Iterator[Cluster]:
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    machines = [Machine(tmp_path, r, registry, secret) for r in range(3)]
    try:
        for m in machines:
            m.start()
        until_serving(machines)
        yield machines, registry, secret
    finally:
        for m in machines:
            m.stop()


class Callers:
    """Threads calling ``Counter.add(1)`` until told to stop, each with its own client;
    every answer kept."""

    def __init__(self, registry: Registry, secret: Path, n: int) -> None:
        self.registry = registry
        self.secret = secret
        self.answers: list[int] = []
        self.calls = 0
        self.errors: list[BaseException] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run) for _ in range(n)]

    def _client(self) -> Client:
        return Client.connect(
            instance="counter",
            registry=self.registry.spec,
            cluster=self.registry.cluster,
            secret_file=self.secret,
            timeout=DEADLINE,
        )

    def _run(self) -> None:
        from counter import Counter  # examples/ is on sys.path (see below)

        try:
            with self._client() as client:
                while not self._stop.is_set():
                    answer = client.call(Counter.add, 1)
                    with self._lock:
                        self.answers.append(answer)
        except BaseException as exc:
            self.errors.append(exc)

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def wait_answers(self, more: int) -> None:
        target = len(self.answers) + more

        def enough() -> bool:
            if self.errors:
                raise self.errors[0]
            return len(self.answers) >= target

        wait_for(f"{more} more answers", enough, DEADLINE)

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(DEADLINE)
        if self.errors:
            raise self.errors[0]


@pytest.fixture
def callers(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callers]:
    """Four callers of the cluster's counter, calling from the start of the test; stopped
    at its end (a test stops them itself before it counts)."""
    _, registry, secret = cluster
    monkeypatch.syspath_prepend(str(COUNTER.parent))
    running = Callers(registry, secret, 4)
    running.start()
    try:
        yield running
    finally:
        running.stop()


def counted_once(callers: Callers) -> None:
    """Every call was answered once and counted once: the answers are 1..N exactly."""
    from counter import Counter

    with callers._client() as client:
        final = client.call(Counter.get)
    answers = sorted(callers.answers)
    assert len(set(answers)) == len(answers), "two calls were given the same count"
    assert final == len(answers)
    assert answers == list(range(1, final + 1))


def test_losing_the_primary_machine_loses_no_acknowledged_call(
    cluster: Cluster, callers: Callers
) -> None:
    machines, registry, _ = cluster
    epochs = []
    try:
        callers.wait_answers(50)
        for _ in range(3):
            term = current_term(registry)
            assert term is not None
            epochs.append(term.epoch)
            lost = machines[term.replica]
            lost.lose()
            # A secondary takes over, and calls are answered again.
            wait_for("a new primary", lambda t=term: newer_term(registry, t), DEADLINE)
            callers.wait_answers(50)
            # Its binding had followed the log as a secondary: it took over replaying
            # nothing from its files (recovery's replay says "records from logs").
            taker = current_term(registry)
            assert taker is not None and taker.replica != lost.replica
            out = machines[taker.replica].process_output()
            assert "the binding follows the log from checkpoint" in out
            assert "records from logs" not in out
            # The lost machine comes back with an empty disk and catches up.
            lost.start()
            wait_for(f"replica {lost.replica} to rejoin", lambda m=lost: installed(m), DEADLINE)
            callers.wait_answers(20)
    finally:
        callers.stop()
    counted_once(callers)
    assert len(set(epochs)) == 3  # three different terms were lost


@pytest.mark.parametrize("registry", ["etcd"], indirect=True)
def test_a_primary_paused_past_its_lease_acknowledges_nothing_more(
    cluster: Cluster, callers: Callers
) -> None:
    machines, registry, _ = cluster
    try:
        callers.wait_answers(50)
        term = current_term(registry)
        assert term is not None
        paused = machines[term.replica].process
        assert paused is not None and paused.proc is not None
        pids = [paused.proc.pid, paused.coordinator_pid()]
        for pid in pids:
            assert pid is not None
            os.kill(pid, signal.SIGSTOP)
        try:
            wait_for("a new primary", lambda: newer_term(registry, term), DEADLINE)
        finally:
            # Resumed (the callers connected to it wait meanwhile: a paused process
            # keeps its connections open), it finds it was deposed and stops without
            # acknowledging anything more; its callers send their calls again, with
            # their keys, to the new primary.
            for pid in pids:
                assert pid is not None
                os.kill(pid, signal.SIGCONT)
        wait_for("the deposed primary to stop", lambda: not paused.alive(), DEADLINE)
        assert "is primary no more" in paused.output()
        callers.wait_answers(50)
    finally:
        callers.stop()
    counted_once(callers)


@pytest.mark.parametrize("registry", ["sqlite"], indirect=True)
def test_a_secondary_stops_when_its_service_goes(cluster: Cluster) -> None:
    """A secondary's coordinator reads nothing from its binding yet; it must still notice
    the binding go, and stop, rather than live on and take the role with no service."""
    machines, registry, _ = cluster
    term = current_term(registry)
    assert term is not None
    secondary = next(m for m in machines if m.replica != term.replica)
    process = secondary.process
    assert process is not None and process.proc is not None
    coordinator = process.coordinator_pid()
    assert coordinator is not None
    os.kill(process.proc.pid, signal.SIGKILL)
    wait_for("the secondary's coordinator to stop", lambda: process_gone(coordinator), DEADLINE)
    assert f"the binding left while replica {secondary.replica} was a secondary" in (
        process.output()
    )
    assert current_term(registry) == term  # the primary goes on, untouched


@pytest.mark.parametrize("registry", ["etcd"], indirect=True)
def test_replicas_serve_through_an_etcd_restart_and_fail_over_after(
    cluster: Cluster, etcd_server: EtcdServer, callers: Callers
) -> None:
    """etcd chooses the primary; it does not carry the log. Killed, the primary goes on
    serving the callers connected to it; restarted (its data kept), the replicas find it
    again, and the next loss of the primary's machine fails over as before."""
    machines, registry, _ = cluster
    try:
        callers.wait_answers(30)
        etcd_server.kill()
        callers.wait_answers(30)  # no registry: the log is shipped replica to replica
        etcd_server.start()  # same data dir and ports
        callers.wait_answers(30)
        term = current_term(registry)
        assert term is not None
        lost = machines[term.replica]
        lost.lose()
        wait_for("a new primary", lambda: newer_term(registry, term), DEADLINE)
        callers.wait_answers(30)
    finally:
        callers.stop()
    counted_once(callers)


@pytest.mark.parametrize("registry", ["sqlite"], indirect=True)
def test_replica_0_founds_again_after_a_crash_while_founding(
    registry: Registry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its first record is durable and before the founding checkpoint is
    written, replica 0 leaves a log nothing was told about; started again, it clears it
    and founds the instance afresh, and the others join."""
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    machines = [Machine(tmp_path, r, registry, secret) for r in range(3)]
    founder = machines[0]
    try:
        founder.start(env={**os.environ, "AMBROSIA_CRASH_AT": "ic.checkpoint.mid_write"})
        for m in machines[1:]:
            m.start()
        assert founder.process is not None
        wait_for("the founder to crash", lambda: not founder.process.alive(), DEADLINE)
        assert "ic.checkpoint.mid_write" in founder.process.output()
        left = founder.data_dir / "counter_0"
        assert (left / "serverlog1").exists() and not (left / "serverchkpt1").exists()
        founder.start()
        wait_for("a primary", lambda: current_term(registry) is not None, DEADLINE)
        for m in machines[1:]:
            wait_for(f"replica {m.replica} to join", lambda m=m: installed(m), DEADLINE)
        monkeypatch.syspath_prepend(str(COUNTER.parent))
        callers = Callers(registry, secret, 2)
        callers.start()
        try:
            callers.wait_answers(20)
        finally:
            callers.stop()
        counted_once(callers)
    finally:
        for m in machines:
            m.stop()
