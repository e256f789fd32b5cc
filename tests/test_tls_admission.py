"""Connections held before their TLS handshake count against the connection cap.

A flood of connections that open TCP and never start TLS, each opened again as soon as
it is closed, against the ingress and the link port in TLS, on both loops: an honest
client's call and a peer's link and call get through while the flood goes on, and the
server holds at most its 128 connections (its sockets, counted in /proc) and barely
grows. Before, the loop ran each TLS handshake before the server saw the connection:
the flood's connections were in no table, each held until the TLS handshake timeout.

In-process, on both loops: connections evicted in their TLS handshake, before it (they
sent nothing), or before their task ran are closed at once, their tasks ended and their
sockets released.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import eventloop
from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client, tls_context
from ambrosia_py.coordinator.links.config import LinkSettings, tls_contexts
from ambrosia_py.serving import Admission, ConnectionLimits, Incoming, Listener
from ambrosia_py.serving.accept import ACCEPT_BATCH
from ambrosia_py.testing.processes import wait_for
from tests.certs import mutual_tls, needs_openssl
from tests.fake_binding import coordinator, incoming_fork
from tests.flooder import Flood, flooding
from tests.ingress_process import DEADLINE, RunProcess, free_port
from tests.link_peer import COMMIT, REPLAY_FROM, Peer
from tests.test_flood_admission import FIVE_ADDRESSES, _can_bind, _first_start, _link_address
from tests.test_flood_admission import _rss_kib as rss_kib

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counter.py"
# 60 from each of five addresses: past the 32 pending per address and the 128 in all.
FLOOD = 300
MAX_CONNECTIONS = 128  # both servers' default
# Evicted in their TLS handshake, the connections of two accept batches close two loop
# turns later (serving/accept.py).
MAX_SOCKETS = MAX_CONNECTIONS + 2 * ACCEPT_BATCH
GOING_ON = 1000  # flood connections made after the honest call was answered, at least
# Measured: under 1 MiB (before: 14 MiB on uvloop, 72 MiB on asyncio's loop).
RSS_GROWTH_KIB = 8 * 1024

needs_five_addresses = pytest.mark.skipif(
    not _can_bind(FIVE_ADDRESSES[-1]), reason="no 127.0.0.0/8 beyond 127.0.0.1 here"
)


def sockets(pid: int) -> int:
    """How many of ``pid``'s descriptors are sockets."""
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
        except FileNotFoundError:  # closed meanwhile
            continue
    return count


class Watch:
    """A server process under the flood: how many sockets it holds past those it held
    before (the connections it accepted), sampled while the flood goes on, and its
    resident memory from before the flood."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.sockets_before = sockets(pid)  # listening, to its coordinator or binding, ...
        self.rss_before = rss_kib(pid)
        self.most = 0
        self.samples = 0

    def flood_goes_on(self, attack: Flood, since: int) -> None:
        """The flood keeps connecting after ``since`` connections (when the honest call
        was answered); the server's sockets are counted meanwhile."""

        def going() -> bool:
            self.most = max(self.most, sockets(self.pid) - self.sockets_before)
            self.samples += 1
            return attack.made > since + GOING_ON and self.samples >= 20

        wait_for("the flood to go on", going, DEADLINE)
        self.made = attack.made
        self.rss = rss_kib(self.pid)

    def check(self, what: str, took: float) -> None:
        grown = self.rss - self.rss_before
        print(
            f"\n{what}: honest {took * 1000:.0f} ms; flood {self.made} connections; at most "
            f"{self.most} accepted sockets in {self.samples} samples; RSS "
            f"{self.rss_before} -> {self.rss} KiB"
        )
        assert self.most <= MAX_SOCKETS
        assert grown < RSS_GROWTH_KIB, f"grew by {grown} KiB"


def _on(loop: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the server processes on ``loop``."""
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)


@needs_openssl
@needs_five_addresses
@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_an_honest_tls_client_is_answered_through_a_flood_that_never_starts_tls(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(loop, monkeypatch)
    counter: Any = load_service(str(EXAMPLE))
    certs = tmp_path / "certs"
    certs.mkdir()
    options = mutual_tls(certs, ("service", "client"))
    good = tls_context(certs / "client.pem", certs / "client.key", certs / "ca.pem")
    data = tmp_path / "data"
    port = free_port()
    address = f"127.0.0.1:{port}"
    svc = RunProcess(EXAMPLE, data, port, *options["service"])
    try:
        with Client(address, data_dir=data, tls=good, timeout=DEADLINE) as client:
            assert client.call(counter.add, 1, key="before") == 1
        assert svc.proc is not None
        watch = Watch(svc.proc.pid)
        with flooding(("127.0.0.1", port), FLOOD, FIVE_ADDRESSES) as attack:
            began = time.monotonic()
            with Client(address, data_dir=data, tls=good, timeout=DEADLINE) as client:
                assert client.call(counter.add, 2, key="during") == 3
            took = time.monotonic() - began
            watch.flood_goes_on(attack, since=attack.made)
        watch.check(f"ingress in TLS, {loop}", took)
    finally:
        svc.stop()


def _tls_link_up(data_dir: Path, address: tuple[str, int], tls: ssl.SSLContext) -> Peer:
    """A peer with the secret and a certificate, its link open; it connects again when
    closed in either handshake, as a coordinator's dialer does."""
    deadline = time.monotonic() + DEADLINE
    while True:
        peer: Peer | None = None
        try:
            peer = Peer(data_dir, "server", address=address, tls=tls)
            peer.open("client", "server")
            assert peer.control() == (REPLAY_FROM, 0, 0)
            return peer
        except (EOFError, OSError):  # ssl.SSLError too
            if peer is not None:
                peer.close()
            assert time.monotonic() < deadline, "the peer never got its link up"


@needs_openssl
@needs_five_addresses
@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_a_tls_peer_gets_its_link_and_call_through_a_flood_that_never_starts_tls(
    tmp_path: Path, loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(loop, monkeypatch)
    certs = tmp_path / "certs"
    certs.mkdir()
    options = mutual_tls(certs, ("server", "client"))
    tls = tls_context(certs / "client.pem", certs / "client.key", certs / "ca.pem")
    call = incoming_fork(5, b"through the flood")
    with coordinator(tmp_path, "server", *options["server"]) as (ic, binding):
        _first_start(binding)
        address = _link_address(tmp_path)
        watch = Watch(ic.proc.pid)
        with flooding(address, FLOOD, FIVE_ADDRESSES) as attack:
            began = time.monotonic()
            peer = _tls_link_up(tmp_path, address, tls)
            peer.send(call)
            assert binding.record().body == call
            assert peer.control() == (COMMIT, 1, 1)
            took = time.monotonic() - began
            watch.flood_goes_on(attack, since=attack.made)
            peer.close()
        watch.check(f"links in TLS, {loop}", took)


# --- in-process: eviction in the TLS handshake, on both loops ---------------------------------


async def _closed_by_server(sock: socket.socket) -> None:
    """Return once the server has closed ``sock``'s connection (a reset or a FIN)."""
    sock.setblocking(False)
    while True:
        try:
            if sock.recv(1) == b"":
                return
        except BlockingIOError:
            await asyncio.sleep(0.001)  # polling a socket, within the caller's deadline
        except ConnectionResetError:
            return


async def _until(condition: Callable[[], bool]) -> None:
    while not condition():
        await asyncio.sleep(0.001)  # polling, within the caller's deadline


async def _evicted_in_every_phase(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    """A table of two: one connection stuck in its TLS handshake (it sent the start of
    a ClientHello), one that sent nothing. Two TLS clients evict them in turn, each
    closed at once (long before any timeout), its task ended, its socket released."""
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    admission = Admission(ConnectionLimits(max_connections=2, handshake_timeout_s=DEADLINE))
    incoming: list[Incoming] = []
    tasks: list[asyncio.Task[None]] = []

    async def serve(conn: Incoming) -> None:
        # A timeout far past the test's deadline: only an eviction closes these in time.
        transport, _ = await conn.connect(asyncio.Protocol, contexts[0], 10 * DEADLINE)
        transport.write(b"welcome")

    def accepted(conn: Incoming) -> None:
        if admission.admit(conn.source, lambda _: conn.drop()) is not None:
            incoming.append(conn)
            tasks.append(conn.start(serve(conn)))

    async def welcomed() -> asyncio.StreamWriter:
        reader, writer = await asyncio.open_connection(*listener.address, ssl=contexts[1])
        assert await reader.readexactly(7) == b"welcome"
        return writer

    listener = await Listener.open("127.0.0.1", 0, accepted, logging.getLogger(__name__))
    try:
        async with asyncio.timeout(DEADLINE):
            stuck = socket.create_connection(listener.address)
            stuck.sendall(b"\x16\x03\x01")  # a TLS record's first bytes, and no more
            await _until(lambda: len(incoming) == 1 and incoming[0]._handed)
            silent = socket.create_connection(listener.address)
            await _until(lambda: len(incoming) == 2)
            first = await welcomed()  # evicts the one in its TLS handshake
            await _closed_by_server(stuck)
            await asyncio.wait([tasks[0]])
            await _until(lambda: incoming[0].sock.fileno() == -1)  # the loop closed it
            second = await welcomed()  # evicts the one that sent nothing
            await _closed_by_server(silent)
            await asyncio.wait([tasks[1]])
        assert tasks[0].cancelled() and tasks[1].cancelled()
        assert incoming[1].sock.fileno() == -1 and admission.evicted == 2
        # Dropped before its task ran: the socket is still ours to close, and is.
        near, far = socket.socketpair()
        early = Incoming(near, ("127.0.0.1", 1), loop.time())
        task = early.start(serve(early))
        early.drop()
        await asyncio.wait([task])
        assert task.cancelled() and near.fileno() == -1 and far.recv(1) == b""
        for sock in (stuck, silent, far):
            sock.close()
        for writer in (first, second):
            writer.close()
    finally:
        listener.close()
    assert not errors, errors


@needs_openssl
@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_a_connection_evicted_before_or_in_its_tls_handshake_is_closed_at_once(
    loop: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _on(loop, monkeypatch)
    options = mutual_tls(tmp_path, ("a",))["a"]
    contexts = tls_contexts(LinkSettings(tls_cert=Path(options[1]), tls_key=Path(options[3])))
    assert contexts is not None
    eventloop.run(_evicted_in_every_phase(contexts))
