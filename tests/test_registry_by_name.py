"""Instances on different machines find each other by name through the registry: real
``ambrosia-py run`` processes with separate data dirs (as on separate machines), no
``--link-to`` and no fixed link port, a real etcd (and a shared SQLite file).

Each instance is :mod:`tests.relay_service`: a client's ``send`` to one instance is noted
by its peer and acknowledged back, so both coordinators dial each other by name, and
the final states show any call, note or ack lost or delivered twice.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ambrosia_py.cli import main
from ambrosia_py.client import AuthenticationError, Client
from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing.processes import wait_for
from tests.etcd_server import EtcdServer, etcd_server
from tests.relay_service import Relay

__all__ = ["etcd_server"]

RELAY = str(Path(__file__).resolve().with_name("relay_service.py"))
REPO = Path(__file__).resolve().parent.parent
DEADLINE = 60.0
_clusters = itertools.count()


def write_secret(path: Path, secret: bytes) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, secret)
    os.close(fd)
    return path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``ambrosia-py ARGS`` as a process of its own, to its end."""
    command = [sys.executable, "-m", "ambrosia_py.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=DEADLINE, cwd=REPO)


class Relays:
    """Relay instances of one registry, each with its own data dir and secret file."""

    def __init__(self, root: Path, registry: str, cluster: str = "ambrosia") -> None:
        self.root = root
        self.registry = registry
        self.cluster = cluster
        self.secret = os.urandom(32)
        self.running: list[ServiceProcess] = []
        self.reader = open_registry(registry, root / "reader", cluster)

    def secret_file(self, name: str, secret: bytes | None = None) -> Path:
        path = self.root / f"{name}.secret"
        return path if path.exists() else write_secret(path, secret or self.secret)

    def start(self, name: str, data_dir: Path, *args: str, secret: bytes | None = None) -> str:
        """Start ``name`` in ``data_dir``; return its ingress address once it serves."""
        where = ["--registry", self.registry, "--cluster", self.cluster]
        secret_file = str(self.secret_file(name, secret))
        log = self.root / f"{name}-{len(self.running)}.log"
        svc = ServiceProcess(
            RELAY,
            name,
            data_dir,
            [*where, "--secret-file", secret_file, "--ingress", "0", *args],
            log=log,
            cwd=REPO,
        )
        self.running.append(svc)
        svc.start()
        svc.wait_for_log("ingress listening on", DEADLINE)
        line = next(x for x in svc.output().splitlines() if "ingress listening on" in x)
        ingress = line.rsplit(" ", 1)[1]

        def published() -> bool:
            svc.check_alive()
            live = self.reader.addresses(name)
            shown = None if live.ingress is None else f"{live.ingress.host}:{live.ingress.port}"
            return live.link is not None and shown == ingress

        wait_for(f"{name}'s link and ingress addresses in the registry", published, DEADLINE)
        return ingress

    def client(self, name: str, secret_file: Path | None = None) -> Client:
        return Client.connect(
            instance=name,
            registry=self.registry,
            cluster=self.cluster,
            secret_file=secret_file or self.secret_file(name),
            timeout=DEADLINE,
            first_contact_timeout=DEADLINE,
        )

    def listed(self) -> dict[str, list[str]]:
        """``ambrosia-py instances`` for the registry: per instance, its row's cells."""
        where = ["--registry", self.registry, "--cluster", self.cluster]
        nowhere = str(self.root / "nowhere")
        result = CliRunner().invoke(main, ["instances", "--data-dir", nowhere, *where])
        assert result.exit_code == 0, result.output
        rows = [line.split("│")[1:-1] for line in result.output.splitlines() if "│" in line]
        return {cells[0].strip(): [c.strip() for c in cells] for cells in rows}

    def stop(self) -> None:
        for svc in self.running:
            svc.stop()
        self.reader.close()


def assert_exactly_once(relays: Relays, n: int) -> None:
    """Once ``a`` has ``n`` acks: it took sends 0..n-1 once each, in order; ``b`` noted
    each once; ``a`` got each ack once."""
    with relays.client("a") as client_a, relays.client("b") as client_b:
        wait_for(f"{n} acks at a", lambda: len(client_a.call(Relay.state)["acks"]) >= n)
        a, b = client_a.call(Relay.state), client_b.call(Relay.state)
    assert a["sent"] == list(range(n)), a["sent"]
    assert b["notes"] == {"a": list(range(n))}, b["notes"]
    assert sorted(a["acks"]) == list(range(n)) and len(a["acks"]) == n, a["acks"]


@pytest.fixture
def etcd_relays(etcd_server: EtcdServer, tmp_path: Path) -> Iterator[Relays]:
    cluster = f"c{os.getpid()}-{next(_clusters)}"
    relays = Relays(tmp_path, f"{etcd_server.spec}?lease_ttl=1", cluster)
    try:
        yield relays
    finally:
        relays.stop()


def test_instances_find_each_other_in_etcd_and_follow_a_move(
    etcd_relays: Relays, tmp_path: Path
) -> None:
    """a and b link by name; a client calls a by name. a is SIGKILLed mid-stream and
    started again from a copy of its data dir in another directory, on other ports: b
    dials it there, the client finds it there, and nothing is lost or doubled."""
    relays, n = etcd_relays, 60
    old_ingress = relays.start("a", tmp_path / "a")
    relays.start("b", tmp_path / "b")
    listed = relays.listed()
    assert listed["a"][7:9] == ["yes", socket.gethostname()] and listed["a"][10] == old_ingress
    assert listed["a"][9].startswith("127.0.0.1:") and listed["b"][9].startswith("127.0.0.1:")
    assert listed["b"][7] == "yes"
    answers: list[int] = []
    failure: list[BaseException] = []

    def calls() -> None:
        try:
            with relays.client("a") as client:
                for i in range(n):
                    answers.append(client.call(Relay.send, "b", i, key=f"send-{i}"))
        except BaseException as exc:  # raised in the test's thread below
            failure.append(exc)

    caller = threading.Thread(target=calls)
    caller.start()
    try:
        wait_for("a third of the calls answered", lambda: len(answers) >= n // 3 or bool(failure))
        relays.running[0].kill("both")
        old_link = listed["a"][9]
        moved = tmp_path / "elsewhere" / "a"
        shutil.copytree(tmp_path / "a", moved, symlinks=True)
        ports = [str(p) for p in (free_port(), free_port())]
        assert f"127.0.0.1:{ports[0]}" != old_ingress and f"127.0.0.1:{ports[1]}" != old_link
        new_ingress = relays.start("a", moved, "--ingress", ports[0], "--link-port", ports[1])
    finally:
        caller.join(DEADLINE * 2)
    assert not failure, failure
    assert answers == list(range(1, n + 1))  # a retried key gets its first run's answer
    assert_exactly_once(relays, n)
    listed = relays.listed()
    assert listed["a"][7] == "yes" and listed["a"][9:] == [f"127.0.0.1:{ports[1]}", new_ingress]
    # A wrong cluster secret with a correct entry in etcd gets nowhere.
    wrong = write_secret(tmp_path / "wrong.secret", os.urandom(32))
    with relays.client("a", wrong) as client, pytest.raises(AuthenticationError):
        client.call(Relay.state)
    # Stopped cleanly, b's addresses go at once (its lease is revoked).
    relays.running[1].stop()
    assert relays.listed()["b"][7:] == ["no", "-", "-", "-"]


def test_history_in_etcd_and_no_files_here_is_refused(etcd_relays: Relays, tmp_path: Path) -> None:
    """An instance etcd has history of, started with a data dir without its files, is
    refused in one line: never started afresh. One with files etcd does not know too.
    A coordinator with the wrong secret finds its peer in etcd and gets nowhere."""
    relays = etcd_relays
    relays.start("b", tmp_path / "b")
    relays.start("m", tmp_path / "m", secret=os.urandom(32))
    with relays.client("m") as client:
        client.call(Relay.send, "b", 0, key="from-m")
    m = relays.running[1]
    m.wait_for_log("link to 'b' at 127.0.0.1:", DEADLINE)  # found, dialed, refused
    m.stop()
    with relays.client("b") as client:
        assert client.call(Relay.state)["notes"] == {}
    empty = tmp_path / "empty"
    where = ["--registry", relays.registry, "--cluster", relays.cluster]
    secret = str(relays.secret_file("m"))
    refused = cli(
        *("run", RELAY, "--instance", "m", "--data-dir", str(empty), "--secret-file", secret),
        *where,
    )
    assert refused.returncode == 2, refused.stderr
    (line,) = [x for x in refused.stderr.splitlines() if x.startswith("ambrosia-py: ")]
    assert "instance 'm' has history in the registry etcd" in line
    assert f"no logs or checkpoints in {empty / 'm_0'}" in line
    assert not list(empty.glob("m_*/server*")), "started afresh"
    (tmp_path / "stray_0").mkdir()
    (tmp_path / "stray_0" / "serverlog1").write_bytes(b"")
    unknown = cli("coordinator", "--instance", "stray", "--data-dir", str(tmp_path), *where)
    assert unknown.returncode == 2
    assert "instance 'stray' is not in the registry etcd" in unknown.stderr
    assert f"--registry {relays.registry}" in unknown.stderr  # how to rebuild it


def test_a_shared_sqlite_file_links_two_data_dirs_by_name(tmp_path: Path) -> None:
    relays = Relays(tmp_path, str(tmp_path / "shared" / "registry.sqlite3"))
    try:
        relays.start("a", tmp_path / "a")
        relays.start("b", tmp_path / "b")
        with relays.client("a") as client:
            answers = [client.call(Relay.send, "b", i, key=f"k{i}") for i in range(10)]
        assert answers == list(range(1, 11))
        assert_exactly_once(relays, 10)
        listed = relays.listed()
        assert listed["a"][7].startswith("yes") and listed["b"][7].startswith("yes")
        assert not (tmp_path / "a" / "registry.sqlite3").exists()
    finally:
        relays.stop()
