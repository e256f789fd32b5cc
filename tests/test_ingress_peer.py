"""One ingress connection on the event loop (ingress/peer.py), against a host that
records what it is handed, over real sockets on 127.0.0.1: the proof's deadline, reading
paused while ``max_in_flight`` calls wait and resumed by an answer, and bad input
closing the connection with a line naming the frame and offset."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from ambrosia_py import eventloop
from ambrosia_py.ingress import (
    Call,
    ClientConnection,
    ConnectionState,
    Outcome,
    OutcomeKind,
    Reply,
    ServerConnection,
    ServiceInfo,
)
from ambrosia_py.ingress.peer import Peer
from ambrosia_py.serving import Admission, ConnectionLimits, Incoming, Listener

DEADLINE = 30.0
SECRET = os.urandom(32)
INFO = ServiceInfo("peer-test", "Nothing", 1 << 20)


class Host:
    """A server that answers nothing by itself: it keeps each call waiting."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.lines: list[str] = []
        self.peers: list[Peer] = []
        self.gone: list[Peer] = []
        self.admission = Admission(ConnectionLimits())

    def new_connection(self) -> ServerConnection:
        return ServerConnection(SECRET, INFO)

    def opened(self, peer: Peer) -> None:
        self.peers.append(peer)

    def proved(self, peer: Peer) -> None:
        self.admission.establish(peer.slot)

    def take(self, peer: Peer, calls: list[Call]) -> list[Call]:
        for call in calls:
            self.calls.append(call)
            peer.waiting.add((call.key, call.method_id, call.request_id))
        return []

    def ended(self, peer: Peer) -> None:
        self.admission.release(peer.slot)
        self.gone.append(peer)

    def refuse(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        self.lines.append(message % args)


async def until(condition: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)  # polling a condition, bounded by the deadline


async def serve(host: Host, limits: ConnectionLimits, max_in_flight: int) -> Listener:
    """A listener whose every connection is a :class:`Peer` of ``host``."""
    loop = asyncio.get_running_loop()

    def accepted(incoming: Incoming) -> None:
        slot = host.admission.admit(incoming.source, lambda why: incoming.drop())
        assert slot is not None
        peer = Peer(host, incoming, slot, limits, max_in_flight=max_in_flight, loop=loop)

        async def connect() -> None:
            await incoming.connect(lambda: peer, None, DEADLINE)

        incoming.start(connect())

    return await Listener.open("127.0.0.1", 0, accepted, logging.getLogger("test"))


class RawClient:
    """A client through its own sans-IO end, on asyncio streams."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = ClientConnection(SECRET)
        self.replies: list[Reply] = []

    @classmethod
    async def connect(cls, address: tuple[str, int]) -> RawClient:
        return cls(*await asyncio.open_connection(*address))

    async def welcome(self) -> None:
        while self.conn.state is not ConnectionState.OPEN:
            self.conn.receive_data(await self.reader.read(4096))
            self.writer.write(self.conn.data_to_send())

    async def call(self, request_id: int) -> None:
        self.conn.call(request_id, b"key-%d" % request_id, 7, b"args")
        self.writer.write(self.conn.data_to_send())
        await self.writer.drain()

    async def read_reply(self) -> Reply:
        while not self.replies:
            data = await self.reader.read(4096)
            assert data, "closed before the reply"
            self.replies += [e for e in self.conn.receive_data(data) if isinstance(e, Reply)]
        return self.replies.pop(0)


T = TypeVar("T")


def run(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return eventloop.run(main())


def test_a_client_that_does_not_prove_the_secret_in_time_is_closed_and_its_slot_freed() -> None:
    host = Host()
    limits = ConnectionLimits(handshake_timeout_s=0.2)

    async def main() -> bytes:
        listener = await serve(host, limits, 8)
        try:
            reader, writer = await asyncio.open_connection(*listener.address)
            got = b""
            while data := await asyncio.wait_for(reader.read(4096), DEADLINE):
                got += data
            writer.close()
            await until(lambda: host.gone, "the connection to end")
            return got
        finally:
            listener.close()

    got = run(main)
    assert len(got) == 45 and got[5:13] == b"AMBINGR1"  # HELLO, then the close
    assert host.lines == [
        f"closing the ingress connection from {host.peers[0].peer}: no proof of the secret "
        "within 0.2 s"
    ]
    assert host.admission.open == 0 and host.gone == host.peers


def test_reading_pauses_while_max_in_flight_calls_wait_and_an_answer_resumes_it() -> None:
    host = Host()

    async def main() -> list[int]:
        listener = await serve(host, ConnectionLimits(), 2)
        try:
            client = await RawClient.connect(listener.address)
            await client.welcome()
            await client.call(0)
            await until(lambda: len(host.calls) == 1, "call 0")
            await client.call(1)
            await until(lambda: len(host.calls) == 2, "call 1")
            (peer,) = host.peers
            transport = peer._transport
            assert transport is not None
            await until(lambda: not transport.is_reading(), "reading to pause")
            await client.call(2)  # sent, not read while two wait
            assert len(host.calls) == 2
            peer.send(0, Outcome(OutcomeKind.VALUE, b"zero"))
            peer.answered(b"key-0", 7, 0)
            reply = await asyncio.wait_for(client.read_reply(), DEADLINE)
            assert reply.request_id == 0 and reply.answer == Outcome(OutcomeKind.VALUE, b"zero")
            await until(lambda: len(host.calls) == 3, "the third call, once one was answered")
            assert not transport.is_reading()  # two wait again
            client.writer.close()
            return [call.request_id for call in host.calls]
        finally:
            listener.close()

    assert run(main) == [0, 1, 2]


def test_a_frame_with_a_wrong_tag_closes_the_connection_naming_frame_and_offset() -> None:
    host = Host()

    async def main() -> bytes:
        listener = await serve(host, ConnectionLimits(), 8)
        try:
            client = await RawClient.connect(listener.address)
            await client.welcome()
            client.conn.call(0, b"k", 7, b"args")
            frame = bytearray(client.conn.data_to_send())
            frame[-1] ^= 1  # the tag's last byte
            client.writer.write(bytes(frame))
            rest = await asyncio.wait_for(client.reader.read(), DEADLINE)
            await until(lambda: host.gone, "the connection to end")
            return rest
        finally:
            listener.close()

    assert run(main) == b""  # nothing more after WELCOME
    assert host.calls == []
    (line,) = host.lines
    # The client's second frame: after its AUTH (u32 length, kind, magic, nonce, proof).
    assert "fails its tag" in line and line.endswith(f"(frame 1, offset {4 + 1 + 8 + 32 + 32})")
