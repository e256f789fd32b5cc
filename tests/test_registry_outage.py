"""etcd killed and restarted under instances that find each other through it by name.

Two :mod:`tests.relay_service` instances, each in its own data dir (as on two machines),
linked by name through etcd (no ``--link-to``, no fixed link port), under a stream of
calls from a client that found ``a`` by name. First, with etcd up, the calls cost etcd
no request at all (counted by etcd's own request metrics). Then etcd is SIGKILLed:
calls keep flowing, ``b`` rolls its log and writes a checkpoint the registry cannot
record, and ``b`` is SIGKILLed too with that checkpoint unrecorded. etcd restarts on its
data dir; ``b`` recovers from the checkpoint the registry recorded before it (replaying
the logs kept since) and ``a`` moves to a copy of its data dir elsewhere. At the end every
call ran once, every note and ack arrived once, the registry records each instance's
newest checkpoint, and both publish their addresses again.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import urllib.request
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.interface import Endpoint, RegistryUnavailable
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing.processes import wait_for
from tests.etcd_server import EtcdServer, etcd_server
from tests.relay_service import Relay
from tests.test_registry_by_name import DEADLINE, RELAY, Relays, assert_exactly_once, cli

__all__ = ["etcd_server"]

TRIGGER_ENV = "AMBROSIA_LOG_TRIGGER_MB"
PACE_S = 0.003  # between two calls
_STARTED = re.compile(
    r'^grpc_server_started_total\{grpc_method="(\w+)",grpc_service="etcdserverpb\.KV",'
    r'grpc_type="unary"\} (\d+)$'
)


def kv_requests(server: EtcdServer) -> dict[str, int]:
    """etcd's count of the key-value requests it was sent, by method (Range, Txn, ...)."""
    with urllib.request.urlopen(f"{server.url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    return {m[1]: int(m[2]) for line in text.splitlines() if (m := _STARTED.match(line))}


class Caller:
    """A client of ``a`` found by name, calling ``send(b, i)`` for i = 0, 1, ... in a
    thread until :meth:`stop`, a few hundred a second at most (paced, so that a run of
    some seconds stays a few thousand calls); each call has a key, so one retried across
    a lost connection gets its first run's answer."""

    def __init__(self, relays: Relays) -> None:
        self.relays = relays
        self.answers: list[int] = []
        self.failure: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._calls)
        self._thread.start()

    def _calls(self) -> None:
        try:
            with self.relays.client("a") as client:
                while not self._stop.wait(PACE_S):
                    i = len(self.answers)
                    self.answers.append(client.call(Relay.send, "b", i, key=f"send-{i}"))
        except BaseException as exc:  # raised in the test's thread
            self.failure.append(exc)

    def wait_for_more(self, count: int, what: str) -> None:
        """Wait until ``count`` more calls are answered than now."""
        target = len(self.answers) + count

        def answered() -> bool:
            assert not self.failure, self.failure
            return len(self.answers) >= target

        wait_for(f"{count} more calls answered ({what})", answered, DEADLINE)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(DEADLINE * 2)
        assert not self._thread.is_alive(), "the caller never returned"
        assert not self.failure, self.failure
        return len(self.answers)


def checkpoints(data_dir: Path, name: str) -> list[int]:
    return InstanceFiles(data_dir, name, 0).checkpoint_numbers()


def links_to(svc: ServiceProcess, peer: str) -> int:
    """How many times ``svc``'s coordinator opened its link to ``peer``."""
    return svc.output().count(f"link to {peer!r} open")


def coordinator_lines(log: Path, name: str, text: str) -> list[str]:
    """The lines of ``name``'s coordinator (not its run process) in ``log`` with ``text``."""
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if f"ic[{name}]" in line and text in line]


def test_calls_flow_through_an_etcd_outage_and_nothing_is_lost_or_doubled(
    etcd_server: EtcdServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    etcd = etcd_server  # killed and started again on its data dir
    relays = Relays(tmp_path, f"{etcd.spec}?lease_ttl=1&timeout=1", f"outage{os.getpid()}")
    caller: Caller | None = None
    try:
        relays.start("a", tmp_path / "a")
        relays.start("b", tmp_path / "b")
        caller = Caller(relays)
        caller.wait_for_more(20, "links open both ways")
        # No etcd request on a call's path: lookups happen when a link (re)connects.
        before, first = kv_requests(etcd), len(caller.answers)
        caller.wait_for_more(200, "counting etcd's requests")
        after, calls = kv_requests(etcd), len(caller.answers) - first
        assert after == before, f"etcd requests during {calls} calls: {before} -> {after}"

        # b again, rolling its log (and checkpointing) every few KB.
        relays.running[1].stop()
        monkeypatch.setenv(TRIGGER_ENV, "0.01")
        relays.start("b", tmp_path / "b")
        b = relays.running[-1]
        # a found b's new address before etcd goes: nobody can learn of a move meanwhile.
        wait_for("a's link to the new b", lambda: links_to(relays.running[0], "b") == 2)
        caller.wait_for_more(20, "b back")
        recorded = relays.reader.get("b")
        assert recorded is not None and recorded.last_checkpoint is not None

        etcd.kill()
        newest = max(checkpoints(tmp_path / "b", "b"))
        for svc in (relays.running[0], b):  # each finds out (its lease's keep-alive)
            svc.wait_for_log("the registry in etcd is unreachable", DEADLINE)
        caller.wait_for_more(20, "etcd down")

        def b_checkpointed_alone() -> bool:
            b.check_alive()
            return max(checkpoints(tmp_path / "b", "b")) > newest

        wait_for("b's checkpoint during the outage", b_checkpointed_alone, DEADLINE)
        unrecorded = max(checkpoints(tmp_path / "b", "b"))
        # Killed before etcd could record it: b must recover from the one before.
        b.kill("both")
        caller.wait_for_more(20, "etcd and b down")

        etcd.start()  # the same data dir and ports
        relays.running[0].wait_for_log("the registry in etcd answers again", DEADLINE)
        relays.start("b", tmp_path / "b")
        recovered = relays.running[-1].output()
        match = re.search(r"recovering from checkpoint (\d+)", recovered)
        assert match is not None and int(match[1]) < unrecorded, recovered[-2000:]
        caller.wait_for_more(20, "b recovered")
        # a's link to b (lost during the outage) delivers again, a never restarted.
        answered = len(caller.answers)
        with relays.client("b") as client_b:

            def noted() -> bool:
                return len(client_b.call(Relay.state)["notes"].get("a", [])) >= answered

            wait_for("b's notes of the calls a answered", noted, DEADLINE)

        # a moves: SIGKILLed, started from a copy of its data dir, on other ports.
        relays.running[0].kill("both")
        moved = tmp_path / "elsewhere" / "a"
        shutil.copytree(tmp_path / "a", moved, symlinks=True)
        ports = [str(free_port()), str(free_port())]
        relays.start("a", moved, "--ingress", ports[0], "--link-port", ports[1])
        caller.wait_for_more(20, "a moved")
        n = caller.stop()
        caller = None
    finally:
        if caller is not None:
            caller.stop()
    try:
        assert_exactly_once(relays, n)
        for name, data_dir in (("a", moved), ("b", tmp_path / "b")):

            def newest_recorded(name: str = name, data_dir: Path = data_dir) -> bool:
                info = relays.reader.get(name)
                newest = max(checkpoints(data_dir, name))
                return info is not None and info.last_checkpoint == newest

            wait_for(f"{name}'s newest checkpoint recorded", newest_recorded, DEADLINE)
            live = relays.reader.addresses(name)
            assert live.link is not None and live.ingress is not None, (name, live)
        moved_link = relays.reader.addresses("a").link
        assert moved_link is not None and moved_link.port == int(ports[1])
        # The coordinators that lived through the outage said it once, and its end once.
        a_log = relays.running[0].log
        assert len(coordinator_lines(a_log, "a", "the registry in etcd is unreachable")) == 1
        assert len(coordinator_lines(a_log, "a", "the registry in etcd answers again")) == 1
        assert len(coordinator_lines(b.log, "b", "the registry in etcd is unreachable")) == 1
    finally:
        relays.stop()


def test_a_start_with_no_etcd_endpoint_answering_is_refused_in_one_line(tmp_path: Path) -> None:
    endpoints = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    spec = f"etcd://{','.join(endpoints)}?timeout=0.5"
    data = tmp_path / "data"
    result = cli("run", RELAY, "--instance", "x", "--data-dir", str(data), "--registry", spec)
    assert result.returncode == 2, result
    (line,) = result.stderr.splitlines()
    assert line.startswith("ambrosia-py: no etcd endpoint answers (")
    assert all(f"http://{endpoint}: " in line for endpoint in endpoints), line
    assert line.endswith("nothing was changed"), line
    assert not list(data.glob("x_*")), "started anyway"


def test_an_address_published_while_etcd_is_down_is_put_once_it_answers(
    etcd_server: EtcdServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The registry of a coordinator that recovered during an outage: its link address is
    held and put when etcd is back; a peer's link address is the one it read last; the
    outage is said once, and its end once."""
    caplog.set_level(logging.INFO, "ambrosia_py.coordinator")
    cluster = f"held{os.getpid()}"
    owner = open_registry(f"{etcd_server.spec}?lease_ttl=1&timeout=1", tmp_path, cluster)
    reader = open_registry(etcd_server.spec, tmp_path, cluster)
    try:
        for name in ("svc", "peer"):
            owner.register(name)
        reader.set_link_address("peer", "127.0.0.1", 4600)
        assert owner.link_address("peer") == ("127.0.0.1", 4600)
        etcd_server.kill()
        owner.set_link_address("svc", "127.0.0.1", 4500)  # held: no error
        assert owner.link_address("peer") == ("127.0.0.1", 4600)  # as read before
        with pytest.raises(RegistryUnavailable):
            owner.get("svc")  # what must be read now says so
        etcd_server.start()

        def published() -> bool:
            return reader.addresses("svc").link == Endpoint("127.0.0.1", 4500)

        wait_for("the held address in etcd", published, DEADLINE)
    finally:
        owner.close()
        reader.close()
    said = [r.getMessage() for r in caplog.records]
    assert len([m for m in said if "the registry in etcd is unreachable" in m]) == 1, said
    assert len([m for m in said if "the registry in etcd answers again" in m]) == 1, said
