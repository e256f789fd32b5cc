"""An incompatible peer (seed 004, *Protocol compatibility*): "we will not actually look at
any bytes sent after the ConnectPacket, but we will keep the connection open so that the
peer does not keep trying to open new connections." Both sides of a link do so: the
dialer holds the connection and does not dial again while it stays open; the acceptor
holds it past the handshake timeout, in a slot not yet authenticated, which a newcomer
may take. Either pings it, and sends it nothing else.

The incompatible ConnectPacket is laid out here byte by byte from the reference
(flow-transport.md, *ConnectPacket*), not with the project's encoder.
"""

from __future__ import annotations

import asyncio
import logging
import select
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeAlias

import pytest

from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.links import config as link_config
from ambrosia_py.coordinator.links import peers as peer_links
from ambrosia_py.coordinator.links.peers import PeerLinks
from ambrosia_py.coordinator.links.protocol import Outbox
from tests.fake_binding import coordinator, incoming_fork
from tests.link_peer import (
    DEADLINE,
    PING_TOKEN,
    REPLAY_FROM,
    Peer,
    Receiver,
    flow_frame,
    hello,
)
from tests.test_coordinator_links import attach_to, first_start, fork_to
from tests.test_link_conn import _pair

# u32 length 40 | u64 version 0x1FDB00B063000000 (flag bit 60 set; 0x63 where ours has
# 0x73: they differ above the low 16 bits) | u16 port 1 | u64 connection id 7 |
# u32 IPv4 127.0.0.1 as a little-endian integer | u16 flags 0 | 16 bytes IPv6, unused
INCOMPATIBLE_PACKET = bytes.fromhex(
    "2800000000000063b000db1f010007000000000000000100007f0000" + "00" * 16
)
assert len(INCOMPATIBLE_PACKET) == 44
OUR_VERSION = 0x1FDB00B073000000  # what a coordinator sends, flag bit 60 set
PING = flow_frame(b"", PING_TOKEN)  # 28 bytes: untagged, as no key was agreed
INCOMPATIBLE_LINE = "is incompatible with ours"
Stream: TypeAlias = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise EOFError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def _nothing_to_accept(listener: socket.socket) -> bool:
    return not select.select([listener], [], [], 0)[0]


def _still_open(sock: socket.socket) -> bool:
    """Neither closed nor reset: nothing to read but, perhaps, pings."""
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        while data := sock.recv(1 << 16):
            assert data == PING * (len(data) // len(PING)), data
        return False  # the end of the stream
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.settimeout(timeout)


# --- the connection: LinkConn.ignore ------------------------------------------------------


def test_an_ignored_peer_has_its_bytes_dropped_unheld_and_is_sent_only_pings() -> None:
    async def main() -> None:
        conn, reader, writer = await _pair()
        garbage = bytes(range(256)) * 4096  # 1 MiB after the packet, never parsed
        writer.write(INCOMPATIBLE_PACKET + garbage)
        packet = await conn.handshake()
        assert packet.protocol_version == 0x1FDB00B063000000
        assert conn.flow.compatible is False
        ours = await reader.readexactly(44)  # the acceptor keeps it, so it answers
        assert struct.unpack_from("<Q", ours, 4)[0] == OUR_VERSION
        pings = 0
        async with asyncio.timeout(DEADLINE):
            while conn.flow.ignored_bytes < len(garbage):
                assert await conn.ignore(0.02)  # still open: a ping, and on
                pings += 1
                assert conn.flow.buffered == 0  # dropped, not held
        assert conn.flow.ignored_bytes == len(garbage)
        assert await reader.readexactly(pings * len(PING)) == PING * pings
        writer.close()
        async with asyncio.timeout(DEADLINE):
            assert not await conn.ignore(DEADLINE)  # closed: at once, not after DEADLINE
        conn.close()

    asyncio.run(main())


# --- the dialing side ---------------------------------------------------------------------


def test_a_dialer_keeps_one_connection_to_an_incompatible_acceptor_and_does_not_redial(
    tmp_path: Path,
) -> None:
    """The coordinator, sending to "server", finds a peer there at another version. It
    keeps that one connection, pinging it at each keep-alive (a third of the idle
    timeout, made short here), and opens no other: checked after each of ten pings,
    which span a second of the coordinator's own time, where it used to redial every 50
    to 500 ms. Once the peer closes it, the coordinator dials again; the incompatibility
    is logged once, not once per connection."""
    receiver = Receiver(tmp_path, "server")  # publishes the listener as "server"'s links
    listener = receiver.listener
    try:
        with coordinator(tmp_path, "client", "--link-idle-timeout", "0.3") as (ic, binding):
            first_start(binding)
            binding.send(attach_to("server") + fork_to("server", 5, b"x"))  # it dials
            for attempt in range(2):
                sock, _ = listener.accept()  # within DEADLINE (the listener's timeout)
                sock.settimeout(DEADLINE)
                theirs = _read_exactly(sock, 44)
                assert struct.unpack_from("<IQ", theirs) == (40, OUR_VERSION)
                sock.sendall(INCOMPATIBLE_PACKET)
                for _ in range(10 if attempt == 0 else 1):
                    assert _read_exactly(sock, len(PING)) == PING  # nothing but pings
                    assert _nothing_to_accept(listener), "a second connection while open"
                sock.close()  # now it may dial again, and does (the loop's second accept)
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
            log = ic.stderr()
    finally:
        receiver.close()
    assert log.count(INCOMPATIBLE_LINE) == 1, log
    assert "its protocol version 0x1fdb00b063000000 is incompatible with ours" in log


def test_a_dialer_holding_an_incompatible_peer_dials_where_the_destination_moved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """At each keep-alive the dialer asks the registry again: a destination that now
    publishes another address is dialed there, and the held connection closed."""

    async def main() -> None:
        # per fake acceptor, its connections (the writer kept: dropped, it would close)
        accepted: dict[str, list[Stream]] = {"old": [], "new": []}
        arrived = {"old": asyncio.Event(), "new": asyncio.Event()}

        def acceptor(
            name: str,
        ) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
            async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await reader.readexactly(44)
                writer.write(INCOMPATIBLE_PACKET)
                accepted[name].append((reader, writer))
                arrived[name].set()

            return serve

        old = await asyncio.start_server(acceptor("old"), "127.0.0.1", 0)
        new = await asyncio.start_server(acceptor("new"), "127.0.0.1", 0)
        where = {"server": ("127.0.0.1", old.sockets[0].getsockname()[1])}

        async def lookup(name: str) -> tuple[str, int] | None:
            return where.get(name)

        async def no_room() -> None:
            raise AssertionError("not used here")

        settings = link_config.LinkSettings(idle_timeout_s=0.3)
        links = PeerLinks(
            "me", Intake("me"), lookup, lambda: None, no_room, lambda: True, 1,
            settings=settings, data_dir=tmp_path,
        )  # fmt: skip
        links.intake.outboxes["server"] = Outbox()
        task = asyncio.create_task(links._send_loop("server"))
        try:
            async with asyncio.timeout(DEADLINE):
                await arrived["old"].wait()
                held = accepted["old"][0][0]
                assert await held.readexactly(len(PING)) == PING  # held, and pinged
                where["server"] = ("127.0.0.1", new.sockets[0].getsockname()[1])
                await arrived["new"].wait()
                rest = await held.read()  # to the end: closed by the dialer
                assert rest == PING * (len(rest) // len(PING))
            assert len(accepted["old"]) == 1 and len(accepted["new"]) == 1
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            old.close()
            new.close()

    monkeypatch.setattr(peer_links, "BACKOFF_MIN_S", 0.001)
    with caplog.at_level(logging.INFO, logger="ambrosia_py.coordinator"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert sum(INCOMPATIBLE_LINE in line for line in lines) == 1, lines  # one destination
    assert any("no longer publishes" in line for line in lines), lines


# --- the accepting side -------------------------------------------------------------------


def test_an_acceptor_keeps_an_incompatible_dialer_past_the_handshake_timeout_until_evicted(
    tmp_path: Path,
) -> None:
    """The link port holds an incompatible dialer past the handshake timeout (1 s here)
    and acts on nothing it sends. Its slot is one not yet authenticated: with two slots,
    once a peer holding the secret has the other, the next newcomer evicts it."""
    good = incoming_fork(5, b"ok")
    extra = ("--link-handshake-timeout", "1", "--link-max-connections", "2")
    with coordinator(tmp_path, "server", *extra) as (ic, binding):
        first_start(binding)
        stranger = Peer(tmp_path, "server")
        stranger.sock.sendall(INCOMPATIBLE_PACKET)
        ours = stranger.read(44)  # it answers with its own packet: it keeps the connection
        assert struct.unpack_from("<IQ", ours) == (40, OUR_VERSION)
        # A hello and a call, then 100 kB: none of it is looked at.
        stranger.sock.sendall(
            flow_frame(hello("client", "server")) + flow_frame(good) + bytes(100_000)
        )
        # The coordinator's handshake timeout, seen on a connection opened after the
        # stranger's: a silent one is closed for it.
        silent = Peer(tmp_path, "server")
        assert silent.closed_by_peer()
        silent.close()
        # A peer holding the secret takes the other slot, and is established: the round
        # trip to its ReplayFrom is also time for a close of the stranger to arrive.
        honest = Peer(tmp_path, "server")
        honest.open()
        assert honest.control() == (REPLAY_FROM, 0, 0)
        assert _still_open(stranger.sock), "the incompatible peer was closed"
        # A newcomer needs a slot: the stranger's is the only one not authenticated.
        newcomer = Peer(tmp_path, "server")
        newcomer.open("other", "server")
        assert newcomer.control() == (REPLAY_FROM, 0, 0)
        assert stranger.closed_by_peer()
        stranger.close()
        # Nothing the stranger sent was acted on: the first record is the honest call.
        honest.send(good)
        rec = binding.record()
        assert (rec.seq, rec.body) == (1, good)
        honest.close()
        newcomer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert log.count("an incompatible peer (protocol version 0x1fdb00b063000000)") == 1, log
    assert "keeping its connection open, unused" in log
    assert "no handshake within 1 s" in log  # the silent connection's
    assert "connection that has not proved itself goes" in log  # the eviction's reason
