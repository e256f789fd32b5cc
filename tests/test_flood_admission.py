"""Connection floods against the ingress and the link port, as an attacker without the
secret runs them: connections that send nothing, each opened again as soon as it is
closed. An honest client (or a peer holding the secret) gets in and its call through
while the flood goes on; the refusal log stays a few lines per source and interval
however many connections the flood makes; a client that reads no answers stops being
read and is closed; an established connection is never evicted for one that proved
nothing, and with every slot established a newcomer is refused.

The rules come from ``ambrosia_py/serving`` (``Admission``, ``RefusalLog``) as both
servers use them, with their defaults: 128 connections, 32 pending per address, the
first 5 refusals per address in full and then one summary line per 10 s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client
from ambrosia_py.client.calls import encode_call, method_spec
from ambrosia_py.coordinator.registry.store import Registry
from ambrosia_py.ingress import ClientConnection, ConnectionState, IngressServer, IngressSettings
from ambrosia_py.testing import ImmortalRunner, RunningImmortal, ServiceProcess
from ambrosia_py.testing.processes import wait_for
from tests.fake_binding import checkpoint, coordinator, frame, incoming_fork
from tests.flooder import Flood, flooding
from tests.ingress_process import DEADLINE, RunProcess, free_port
from tests.link_peer import COMMIT, REPLAY_FROM, Peer

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counter.py"
ATTACKERS = 130  # the finding: two more than the 128 slots
REFUSED = 10_000  # connections the flood makes, at least, before the log is measured
# The refusal log's rule (serving.RefusalLog, as both servers make it): per source and
# interval, the first 5 lines in full and one summary, each under 300 bytes.
INTERVAL_S = 10.0
PER_SOURCE_AND_INTERVAL = 6 * 300
OTHER_LINES = 2048  # the honest client's or peer's own lines
ONE_ADDRESS = ["127.0.0.1"]  # the honest client's own: the per-source limit is what bites
FIVE_ADDRESSES = [f"127.0.0.{i}" for i in range(2, 7)]  # 26 each: the 128-slot cap bites


def _can_bind(address: str) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((address, 0))
        except OSError:
            return False
    return True


SOURCES = [
    pytest.param(ONE_ADDRESS, id="one-address"),
    pytest.param(
        FIVE_ADDRESSES,
        id="five-addresses",
        marks=pytest.mark.skipif(
            not _can_bind(FIVE_ADDRESSES[-1]), reason="no 127.0.0.0/8 beyond 127.0.0.1 here"
        ),
    ),
]
# What the first lines of a flood say, by which rule made room (serving.Admission).
EVICTED_BECAUSE = {
    "one-address": "32 connections from 127.0.0.1 are waiting to prove themselves already",
    "five-addresses": "all 128 connection slots are taken; the oldest connection that has "
    "not proved itself goes",
}


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


class Measure:
    """What a flood does to a server: its log's growth and resident memory, from before
    the flood, and how many connections the flood made."""

    def __init__(self, log_size: Callable[[], int], pid: int) -> None:
        self._log_size = log_size
        self._pid = pid
        self.log_before = log_size()
        self.rss_before = _rss_kib(pid)
        self.started = time.monotonic()
        self.attack: Flood | None = None
        self.made = 0

    def still_going(self, attack: Flood, since: int) -> None:
        """The flood kept connecting after ``since`` connections (when the honest call
        was answered), and has made thousands of connections in all."""
        self.attack = attack
        wait_for("the flood to go on", lambda: attack.made > since + 1000, DEADLINE)
        wait_for(f"{REFUSED} flood connections", lambda: attack.made >= REFUSED, DEADLINE)
        self.rss = _rss_kib(self._pid)

    def check(self, what: str, sources: list[str], took: float) -> None:
        """The log grew by at most a few lines per source and interval (the refusal
        log's rule), however many connections the flood made; memory barely."""
        assert self.attack is not None
        made = self.attack.made
        elapsed = time.monotonic() - self.started
        grown = self._log_size() - self.log_before
        print(
            f"\n{what}: honest call {took * 1000:.0f} ms; flood {made} connections in "
            f"{elapsed:.1f} s; log +{grown} bytes; RSS {self.rss_before} -> {self.rss} KiB"
        )
        intervals = 1 + int(elapsed // INTERVAL_S)
        assert grown <= PER_SOURCE_AND_INTERVAL * len(sources) * intervals + OTHER_LINES
        assert grown < made  # before: a line (about 120 bytes) per connection
        assert self.rss - self.rss_before < 32 * 1024, f"grew by {self.rss - self.rss_before} KiB"


# --- the ingress ------------------------------------------------------------------------------


@pytest.mark.parametrize("sources", SOURCES)
def test_an_honest_client_gets_its_answer_during_an_ingress_flood(
    tmp_path: Path, sources: list[str], request: pytest.FixtureRequest
) -> None:
    counter: Any = load_service(str(EXAMPLE))
    port = free_port()
    svc = RunProcess(EXAMPLE, tmp_path, port)
    try:
        address = f"127.0.0.1:{port}"
        with Client(address, data_dir=tmp_path, timeout=DEADLINE) as client:
            assert client.call(counter.add, 1, key="before") == 1
        assert svc.proc is not None
        measure = Measure(lambda: svc.log.stat().st_size, svc.proc.pid)
        with flooding(("127.0.0.1", port), ATTACKERS, sources) as attack:
            began = time.monotonic()
            with Client(address, data_dir=tmp_path, timeout=DEADLINE) as client:
                assert client.call(counter.add, 2, key="during") == 3
            took = time.monotonic() - began
            measure.still_going(attack, since=attack.made)
        svc.stop()  # the summary of what was not logged in full is written as it closes
        measure.check(f"ingress flood from {request.node.callspec.id}", sources, took)
        output = svc.output()
        assert EVICTED_BECAUSE[request.node.callspec.id] in output
        assert "more ingress connections refused or closed from 127.0.0." in output
    finally:
        svc.stop()


# --- the link port --------------------------------------------------------------------------


def _first_start(binding: Any) -> None:
    assert binding.record().seq == -1
    binding.send(frame(9, b"init") + checkpoint(b"cp1"))
    assert binding.record().seq == 0


def _link_address(data_dir: Path) -> tuple[str, int]:
    deadline = time.monotonic() + DEADLINE
    with Registry(data_dir) as registry:
        while (address := registry.link_address("server")) is None:
            assert time.monotonic() < deadline, "the coordinator never published a link"
            time.sleep(0.01)  # polling the registry, with a deadline
    return address


def _link_up(data_dir: Path, address: tuple[str, int], sender: str = "client") -> Peer:
    """A peer holding the secret, its link open (the ReplayFrom read). It connects again
    when closed during the handshake, as a coordinator's dialer does."""
    deadline = time.monotonic() + DEADLINE
    while True:
        peer: Peer | None = None
        try:
            peer = Peer(data_dir, "server", address=address)
            peer.open(sender, "server")
            assert peer.control() == (REPLAY_FROM, 0, 0)
            return peer
        except (EOFError, OSError):
            if peer is not None:
                peer.close()
            assert time.monotonic() < deadline, "the peer never got its link up"


@pytest.mark.parametrize("sources", SOURCES)
def test_a_peer_with_the_secret_gets_its_link_and_call_through_a_link_flood(
    tmp_path: Path, sources: list[str], request: pytest.FixtureRequest
) -> None:
    call = incoming_fork(5, b"through the flood")
    with coordinator(tmp_path, "server") as (ic, binding):
        _first_start(binding)
        address = _link_address(tmp_path)
        measure = Measure(lambda: os.fstat(ic.log.fileno()).st_size, ic.proc.pid)
        with flooding(address, ATTACKERS, sources) as attack:
            began = time.monotonic()
            peer = _link_up(tmp_path, address)
            peer.send(call)
            assert binding.record().body == call
            assert peer.control() == (COMMIT, 1, 1)
            took = time.monotonic() - began
            measure.still_going(attack, since=attack.made)
            peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0  # the summary is written as it closes
        measure.check(f"link flood from {request.node.callspec.id}", sources, took)
        log = ic.stderr()
    assert EVICTED_BECAUSE[request.node.callspec.id] in log
    assert "more link connections refused or closed from 127.0.0." in log


def test_authenticated_links_are_never_evicted_and_a_newcomer_is_refused(tmp_path: Path) -> None:
    with coordinator(tmp_path, "server", "--link-max-connections", "2") as (ic, binding):
        _first_start(binding)
        address = _link_address(tmp_path)
        first = _link_up(tmp_path, address, "c1")
        second = _link_up(tmp_path, address, "c2")
        # Every slot is established: a newcomer is closed at once, and evicts nobody.
        for _ in range(3):
            newcomer = Peer(tmp_path, "server", address=address)
            assert newcomer.read_all() == b""
            newcomer.close()
        for n, peer in enumerate((first, second)):
            call = incoming_fork(5, b"still here %d" % n)
            peer.send(call)
            assert binding.record().body == call
            assert peer.control() == (COMMIT, 1, 1)  # each sender's first message
        # A slot freed is a slot for the next one.
        first.close()
        third = _link_up(tmp_path, address, "c3")
        third.close()
        second.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    # (More if the third came before the first's close was seen: it connects again.)
    assert log.count("refused: all 2 link connections are authenticated") >= 3


# --- the ingress in this process: the table's rules, and a client that reads nothing ----------


class Blob(Immortal):
    @rpc
    def blob(self, size: int) -> bytes:
        return b"b" * size


def _serve(running: RunningImmortal, secret: bytes, **settings: Any) -> IngressServer:
    server = IngressServer(secret, IngressSettings(**settings))

    async def start() -> None:
        await server.bind()
        server.attach(running.dispatcher)

    asyncio.run_coroutine_threadsafe(start(), running.loop).result(DEADLINE)
    return server


def _secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def _welcomed(address: tuple[str, int], secret: bytes) -> tuple[socket.socket, ClientConnection]:
    """A raw client, through the handshake."""
    sock = socket.create_connection(address, timeout=DEADLINE)
    conn = ClientConnection(secret)
    while conn.state is not ConnectionState.OPEN:
        data = sock.recv(4096)
        assert data, "closed during the handshake"
        conn.receive_data(data)
        sock.sendall(conn.data_to_send())
    return sock, conn


def _reset_or_closed(sock: socket.socket) -> bytes:
    """Everything until the server closed the connection."""
    got = b""
    try:
        while data := sock.recv(1 << 16):
            got += data
    except ConnectionResetError:
        pass
    return got


def _refused_at_once(address: tuple[str, int]) -> bytes:
    """What a new connection gets before the server closes it (the reset may come
    before ``connect`` returns)."""
    try:
        sock = socket.create_connection(address, timeout=DEADLINE)
    except ConnectionResetError:
        return b""
    with sock:
        return _reset_or_closed(sock)


def test_the_ingress_evicts_a_pending_connection_never_an_established_one(
    ambrosia: ImmortalRunner, tmp_path: Path
) -> None:
    secret = _secret(tmp_path)
    running = ambrosia.start(Blob)
    server = _serve(running, secret.read_bytes(), max_connections=2)
    address = server.address
    try:
        silent = socket.create_connection(address, timeout=DEADLINE)
        assert silent.recv(4096)  # its HELLO: it holds a slot, pending
        with Client(address, secret_file=secret, timeout=DEADLINE) as first:
            assert first.call(Blob.blob, 1) == b"b"
            # The table is full (silent, first); the next client evicts silent.
            with Client(address, secret_file=secret, timeout=DEADLINE) as second:
                assert second.call(Blob.blob, 2) == b"bb"
                assert _reset_or_closed(silent) == b""
                # Both established: a newcomer is refused before its HELLO.
                assert _refused_at_once(address) == b""
                assert first.call(Blob.blob, 3) == b"bbb"
                assert second.call(Blob.blob, 4) == b"bbbb"
        silent.close()
        assert server.admission.evicted == 1
    finally:
        running.loop.call_soon_threadsafe(server.close)


def test_a_client_that_reads_no_answers_is_not_read_and_then_closed(
    ambrosia: ImmortalRunner, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Calls for a stored outcome are answered at once, each with a copy of it: a client
    that sends many and reads none would have the server hold every copy. Past the
    output bound the server answers no more of them, and reads nothing more, and a
    client that stays over the bound is closed after the stall time."""
    caplog.set_level(logging.WARNING, logger="ambrosia_py.ingress")
    secret = _secret(tmp_path)
    running = ambrosia.start(Blob)
    bound = 256 * 1024
    server = _serve(running, secret.read_bytes(), max_buffered_output=bound, output_stall_s=0.5)
    big = 1024 * 1024
    try:
        with Client(server.address, secret_file=secret, timeout=DEADLINE) as client:
            assert len(client.call(Blob.blob, big, key="big")) == big  # stored under "big"
        sock, conn = _welcomed(server.address, secret.read_bytes())
        spec, label = method_spec(Blob.blob)
        args = encode_call(spec, label, (big,), {})
        calls = 200  # 200 MiB of answers, had they all been queued
        for request_id in range(calls):
            conn.call(request_id, b"big", spec.id, args)
        sock.sendall(conn.data_to_send())
        wait_for("the server to close the client", lambda: server.admission.open == 0, DEADLINE)
        sock.close()
    finally:
        running.loop.call_soon_threadsafe(server.close)
    stalled = [r.getMessage() for r in caplog.records if "unread for 0.5 s" in r.getMessage()]
    assert len(stalled) == 1 and f"(the bound is {bound})" in stalled[0]
    # What the server held when it gave up: the answers over the bound, at most one more
    # than it (the rest of the 200 MiB were never queued).
    held = int(stalled[0].split("the peer left ")[1].split(" bytes")[0])
    print(f"\nheld {held} bytes of {calls} answers of {big} bytes when closed")
    assert bound < held <= bound + big + 64


def test_connections_to_an_attached_binding_port_log_a_few_lines(tmp_path: Path) -> None:
    """After the binding attached, every other connection to its port is refused; a
    local process that reconnects without end gets a few lines logged, not one each."""
    receive = free_port()
    example = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")
    svc = ServiceProcess(example, "counter", tmp_path / "data", ["--receive-port", str(receive)])
    with svc.running():
        svc.wait_for_log("binding attached")
        tries = 400
        for _ in range(tries):
            with socket.create_connection(("127.0.0.1", receive), timeout=DEADLINE) as sock:
                assert sock.recv(1) == b""  # closed at once, nothing sent
        lines = svc.output().count("refusing a second binding connection")
        svc.check_alive()
    assert 1 <= lines < tries // 10, lines
