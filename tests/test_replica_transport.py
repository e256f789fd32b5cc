"""``coordinator/replicas/transport.py``: the replicated log's messages between replicas,
over real sockets on 127.0.0.1 (plain and TLS) and through a fault-injecting proxy (a
receiver process killed and started again: ``test_replica_transport_restart.py``).

Raw peers here build their bytes from the layout in ``docs/security.md`` (*The
replication channel, byte by byte*) with ``hashlib`` and ``hmac``, not with project
code, and the expected bytes of the sans-IO ends come from the same layout.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import socket
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from ambrosia_py import eventloop
from ambrosia_py.coordinator.links.config import LinkSettings
from ambrosia_py.coordinator.registry.interface import Endpoint
from ambrosia_py.coordinator.replicas import ReplicaAuthError, ReplicaTransport
from ambrosia_py.coordinator.replicas.transport import WRITE_BATCH_BYTES, WRITE_HIGH_WATER
from ambrosia_py.coordinator.replicas.transport_auth import Accepting, Dialing
from ambrosia_py.coordinator.replication import (
    Ack,
    Append,
    CheckpointChunk,
    Heartbeat,
    History,
    Message,
    NewTerm,
    OutboxTrim,
    Position,
    Refuse,
    Resend,
    Sync,
    TakenChunk,
    encode_frame,
)
from ambrosia_py.coordinator.replication import Group as ReplicaGroup
from ambrosia_py.wire import IncomingRpc, RpcType, encode_message
from ambrosia_py.wire.records import Watermark, encode_disk_record
from tests.certs import mutual_tls, needs_openssl
from tests.fault_proxy import FaultPlan, FaultProxy, Faults

G3 = ReplicaGroup.of({0, 1, 2})

DEADLINE = 30.0
INSTANCE = "bank"
SECRET = bytes(range(32))
LOGGER = "ambrosia_py.coordinator.replicas"


# --- the layout, written out (docs/security.md) ------------------------------------------


def _hmac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _challenge(nonce: bytes, dialer: int, acceptor: int, instance: str = INSTANCE) -> bytes:
    """CHALLENGE without its length byte (81 bytes)."""
    digest = hashlib.sha256(instance.encode()).digest()
    return b"AMBREPL1\x01" + nonce + digest + struct.pack("<II", dialer, acceptor)


def _tagged(key: bytes, counter: int, frame: bytes) -> bytes:
    return frame + _hmac(key, struct.pack("<Q", counter), frame)[:16]


def _confirm(transcript: bytes, label: bytes = b"dialer", secret: bytes = SECRET) -> bytes:
    return (
        bytes([41]) + b"AMBREPL1\x03" + _hmac(secret, b"ambrosia-replica-v1 " + label, transcript)
    )


def _frame(transcript: bytes, counter: int) -> bytes:
    key = _hmac(SECRET, b"ambrosia-replica-v1 key dialer->acceptor", transcript)
    return _tagged(key, counter, encode_frame(NewTerm(4, G3)))


async def _raw_dial(
    port: int, dialer: int, acceptor: int, secret: bytes = SECRET
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """A dialer written from the layout: the handshake, under ``secret``; returns the
    connection and the key of its frames."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    challenge = _challenge(os.urandom(32), dialer, acceptor)
    writer.write(bytes([81]) + challenge)
    response = await reader.readexactly(74)
    assert response[:10] == bytes([73]) + b"AMBREPL1\x02"
    transcript = challenge + response[10:42]
    writer.write(_confirm(transcript, secret=secret))
    return reader, writer, _hmac(secret, b"ambrosia-replica-v1 key dialer->acceptor", transcript)


async def _closed_by_peer(reader: asyncio.StreamReader) -> None:
    """Return once the peer closed the connection (FIN or reset), within the deadline."""
    async with asyncio.timeout(DEADLINE):
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass


# --- the sans-IO ends ------------------------------------------------------------------------


def test_the_handshake_and_a_frame_are_the_layouts_bytes() -> None:
    nd, na = b"\x11" * 32, b"\x22" * 32
    dialer = Dialing(SECRET, INSTANCE, 2, 5, nonce=nd)
    acceptor = Accepting(SECRET, INSTANCE, 5, nonce=na)
    challenge = _challenge(nd, 2, 5)
    assert dialer.start() == bytes([81]) + challenge
    assert acceptor.receive_data(bytes([81]) + challenge) == []
    transcript = challenge + na
    response = bytes([73]) + b"AMBREPL1\x02" + na
    response += _hmac(SECRET, b"ambrosia-replica-v1 acceptor", transcript)
    assert acceptor.data_to_send() == response
    dialer.receive_data(response)
    confirm = _confirm(transcript)
    assert dialer.data_to_send() == confirm and dialer.authenticated
    key = _hmac(SECRET, b"ambrosia-replica-v1 key dialer->acceptor", transcript)
    frames = [encode_frame(Heartbeat(3, 10, 9)), encode_frame(Ack(3, 8, 10))]
    assert [dialer.seal(f) for f in frames] == [
        _tagged(key, n, f)[-16:] for n, f in enumerate(frames)
    ]
    stream = confirm + b"".join(_tagged(key, n, f) for n, f in enumerate(frames))
    got = [m for byte in range(len(stream)) for m in acceptor.receive_data(stream[byte : byte + 1])]
    assert got == [Heartbeat(3, 10, 9), Ack(3, 8, 10)] and acceptor.peer == 2


@pytest.mark.parametrize(
    ("after", "error", "offset"),
    [  # what the dialer sends after a good CHALLENGE (T, the transcript); where it fails:
        # the CONFIRM's proof at 82 + 10, the first frame at 82 + 42, the second 27 on
        (lambda t: _confirm(t)[:10] + _hmac(SECRET, b"ambrosia-link-v1 dialer", t), "proof", 92),
        (lambda t: _confirm(t, b"acceptor"), "proof does not match", 92),  # reflected
        (lambda t: _confirm(t, secret=b"another secret, 32 bytes long..."), "proof does", 92),
        (lambda t: _confirm(t) + _frame(t, 0) * 2, "frame 1 on the replica connection", 151),
        (lambda t: _confirm(t) + _frame(t, 1), "frame 0 on the replica connection fails", 124),
    ],
)
def test_a_proof_or_frame_not_of_this_connection_is_refused(
    after: Callable[[bytes], bytes], error: str, offset: int
) -> None:
    acceptor = Accepting(SECRET, INSTANCE, 5, nonce=b"\x22" * 32)
    challenge = _challenge(b"\x11" * 32, 2, 5)
    acceptor.receive_data(bytes([81]) + challenge)
    with pytest.raises(ReplicaAuthError, match=error) as info:
        acceptor.receive_data(after(challenge + b"\x22" * 32))
    assert info.value.offset == offset
    with pytest.raises(ReplicaAuthError):  # and nothing more is taken
        acceptor.receive_data(b"x")


@pytest.mark.parametrize(
    ("challenge", "error"),
    [
        (bytes([81]) + _challenge(b"\x11" * 32, 5, 5), "claims replica number 5"),
        (
            bytes([81]) + _challenge(b"\x11" * 32, 2, 6),
            "dialed replica 6 of 'bank', but this is replica 5",
        ),
        (bytes([81]) + b"AMBAUTH1" + bytes(73), "got b.AMBAUTH1"),  # a link's CHALLENGE
    ],
)
def test_a_challenge_for_someone_else_is_refused_before_any_answer(
    challenge: bytes, error: str
) -> None:
    acceptor = Accepting(SECRET, INSTANCE, 5)
    with pytest.raises(ReplicaAuthError, match=error):
        acceptor.receive_data(challenge)
    assert acceptor.data_to_send() == b"" and acceptor.peer is None


# --- real sockets -----------------------------------------------------------------------------


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    return path


async def _until(what: str, condition: Callable[[], bool]) -> None:
    """Wait until ``condition`` holds, looking every few milliseconds, within the deadline."""
    try:
        async with asyncio.timeout(DEADLINE):
            while not condition():
                await asyncio.sleep(0.005)
    except TimeoutError:
        raise AssertionError(f"no {what} within {DEADLINE} s") from None


def _said(caplog: pytest.LogCaptureFixture, *texts: str) -> bool:
    """Whether one logged line holds every one of ``texts``."""
    return any(all(t in r.getMessage() for t in texts) for r in caplog.records)


class Group:
    """Transports of one instance's replicas in this loop, where each listens, and what
    each was handed: (sender, message) in order."""

    def __init__(self, settings: LinkSettings) -> None:
        self.settings = settings
        self.book: dict[int, Endpoint] = {}
        self.transports: dict[int, ReplicaTransport] = {}
        self.inboxes: dict[int, list[tuple[int, Message]]] = {}

    def of(self, replica: int, sender: int) -> list[Message]:
        return [m for s, m in self.inboxes[replica] if s == sender]

    async def address_of(self, replica: int) -> Endpoint | None:
        return self.book.get(replica)

    async def add(
        self,
        replica: int,
        instance: str = INSTANCE,
        settings: LinkSettings | None = None,
        **kw: int,
    ) -> ReplicaTransport:
        inbox = self.inboxes[replica] = []
        t = self.transports[replica] = ReplicaTransport(
            instance,
            replica,
            settings or self.settings,
            lambda sender, message: inbox.append((sender, message)),
            self.address_of,
            **kw,
        )
        self.book.setdefault(replica, Endpoint("127.0.0.1", await t.listen("127.0.0.1", 0)))
        return t

    async def __aenter__(self) -> Group:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(t.close() for t in self.transports.values()))


@pytest.fixture
async def group(secret_file: Path) -> AsyncIterator[Group]:
    async with Group(LinkSettings(secret_file=secret_file)) as g:
        yield g


def _record(seq: int, size: int = 5) -> bytes:
    args = bytes([seq % 251]) * size
    body = encode_message(IncomingRpc(3, RpcType.ASYNC_AWAIT, args, "client", seq))
    return encode_disk_record(1, seq, body, (Watermark("client", seq, seq),))


def _every_kind(sender: int) -> list[Message]:
    history = History.of([(1, 0), (sender + 2, 7)])
    return [
        NewTerm(sender + 2, G3),
        Position(sender + 2, 9, history, G3),
        Sync(sender + 2, history, log_end=9),
        Append(sender + 2, 7, 7, tuple(_record(seq) for seq in range(7, 10))),
        Heartbeat(sender + 2, 10, 9),
        Ack(sender + 2, 9, 10),
        Resend(sender + 2, 8),
        Refuse(sender + 3),
        CheckpointChunk(sender + 2, 7, 10, 4, b"abcdef"),
    ]


async def _exchange(group: Group) -> None:
    """Every replica sends every other each kind of message: all arrive, in order,
    from the right sender."""
    for sender, t in group.transports.items():
        for to in group.transports:
            if to != sender:
                for message in _every_kind(sender):
                    t.send(to, message)
    expected = 9 * (len(group.transports) - 1)
    for to, inbox in group.inboxes.items():
        await _until("every message", lambda i=inbox: len(i) >= expected)  # type: ignore[misc]
        for sender in group.transports:
            assert group.of(to, sender) == ([] if sender == to else _every_kind(sender))
        assert len(inbox) == expected


async def _three_replicas(secret_file: Path) -> None:
    async with Group(LinkSettings(secret_file=secret_file)) as group:
        for replica in (0, 1, 2):
            await group.add(replica)
        await _exchange(group)
        assert all(t.connected(to) for r, t in group.transports.items() for to in {0, 1, 2} - {r})
        big = Append(4, 100, 90, tuple(_record(seq, 1 << 20) for seq in range(100, 103)))
        chunk = CheckpointChunk(4, 100, 9 << 20, 0, os.urandom(8 << 20))
        burst = [Heartbeat(4, 200 + i, 200) for i in range(10_000)]
        for message in [big, chunk, *burst]:
            group.transports[0].send(1, message)
        await _until("the burst", lambda: len(group.of(1, 0)) >= 9 + 10_002)
        assert group.of(1, 0)[9:] == [big, chunk, *burst]
        assert all(t.dropped_frames == 0 for t in group.transports.values())


@pytest.mark.parametrize("loop", eventloop.LOOPS)
def test_three_replicas_exchange_every_kind_then_large_frames_and_a_burst(
    loop: str, secret_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    monkeypatch.setenv(eventloop.LOOP_ENV, loop)
    eventloop.run(_three_replicas(secret_file))


async def test_refused_peers_get_nothing_through_while_an_honest_one_is_served(
    group: Group, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    receiver = await group.add(0)
    honest = await group.add(1)
    other = tmp_path / "other-secret"
    other.write_bytes(b"another secret, 32 bytes long..!")
    other.chmod(0o600)
    impostor = await group.add(2, settings=LinkSettings(secret_file=other))
    stranger = await group.add(3, instance="shop")
    mistaken = await group.add(4)
    group.book[6] = group.book[0]  # replica 4 thinks replica 6 listens where 0 does
    port = group.book[0].port
    raw = await _raw_dial(port, 5, 0, secret=b"another secret, 32 bytes long..!")
    for t, to in ((impostor, 0), (stranger, 0), (mistaken, 6)):
        t.send(to, Heartbeat(9, 1, 1))
    honest.send(0, Heartbeat(2, 5, 5))
    await _until("the honest message", lambda: len(group.inboxes[0]) >= 1)
    await _closed_by_peer(raw[0])
    lines = (
        f"to replica 0 of 'bank' at 127.0.0.1:{port}: the acceptor's proof does not match",
        "the dialer's proof does not match: it does not hold this cluster's secret",
        "the peer dialed another instance",
        "the peer dialed replica 6 of 'bank', but this is replica 0",
    )
    await _until("the refusals", lambda: all(_said(caplog, line) for line in lines))
    refusals = [r.getMessage() for r in caplog.records if "dialed" in r.getMessage()]
    assert all(m.startswith("replica connection from 127.0.0.1:") for m in refusals)
    assert group.inboxes[0] == [(1, Heartbeat(2, 5, 5))]
    assert not impostor.connected(0) and not stranger.connected(0) and receiver.admission.open <= 2
    raw[1].close()


async def test_stalled_overlong_and_undecodable_peers_are_closed_with_a_line(
    secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with Group(LinkSettings(secret_file=secret_file, handshake_timeout_s=0.5)) as group:
        await group.add(0, max_frame_bytes=4096)
        honest = await group.add(1)
        port = group.book[0].port
        stalled = await asyncio.open_connection("127.0.0.1", port)
        stalled[1].write(bytes([81]) + _challenge(os.urandom(32), 2, 0)[:40])
        unframed = await asyncio.open_connection("127.0.0.1", port)
        unframed[1].write(b"\xff\xff")
        overlong = await _raw_dial(port, 3, 0)
        overlong[1].write(b"\x90\x4e")  # a frame of 10,000 bytes
        garbled = await _raw_dial(port, 4, 0)
        garbled[1].write(_tagged(garbled[2], 0, bytes([3, 2, 5, 1])))  # version 2
        honest.send(0, Heartbeat(2, 5, 5))
        for reader, writer, *_ in (stalled, unframed, overlong, garbled):
            await _closed_by_peer(reader)
            writer.close()
        await _until("the honest message", lambda: len(group.inboxes[0]) >= 1)
        for (_, writer, *_), why in (
            (stalled, "no replication handshake within 0.5 s"),
            (unframed, "a handshake CHALLENGE of over 127 bytes, not 81"),
            (overlong, "frame 0: 10000 bytes, over the limit of 4096"),
            (garbled, "frame version 2, only 1 is known"),
        ):
            address = f"127.0.0.1:{writer.get_extra_info('sockname')[1]}"
            assert _said(caplog, "replica connection from", address, "closed: " + why), why
        assert _said(caplog, "from replica 4 at 127.0.0.1:")  # the proved number, named
        assert group.inboxes[0] == [(1, Heartbeat(2, 5, 5))]


@pytest.mark.parametrize(
    ("flip_at", "refusal", "chunk_kept"),
    [
        # One bit of the first frame after the handshake (82 + 42 bytes), in its data: the
        # receiver refuses the frame; the chunk is lost with the connection.
        ((124 + 32, 124 + 1024), ("from replica 2 at 127.0.0.1:", "fails its tag"), False),
        # One bit of the dialer's number (bytes 74..77 of the CHALLENGE's frame): the
        # acceptor proves itself over another transcript; the dialer refuses it and dials
        # again with the chunk still queued.
        ((74, 75), ("to replica 5 of 'bank'", "the acceptor's proof does not match"), True),
    ],
)
async def test_tampered_bytes_are_refused_and_later_messages_flow_after_the_redial(
    group: Group,
    caplog: pytest.LogCaptureFixture,
    flip_at: tuple[int, int],
    refusal: tuple[str, str],
    chunk_kept: bool,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await group.add(5)
    sender = await group.add(2)
    plan = FaultPlan(forward=Faults(flip_at=flip_at), faulty_connections=1)
    with FaultProxy(("127.0.0.1", group.book[5].port), plan, seed=3) as proxy:
        group.book[5] = Endpoint("127.0.0.1", proxy.port)
        chunk = CheckpointChunk(1, 0, 2000, 0, bytes(2000))
        sender.send(5, chunk)
        await _until("the refusal", lambda: _said(caplog, *refusal))
        # The first connection's end noticed (or the second one up already).
        await _until("the end", lambda: not sender.connected(5) or len(proxy.records()) > 1)
        beats = [Heartbeat(1, i, 0) for i in range(50)]
        for beat in beats:
            sender.send(5, beat)
        await _until("the later messages", lambda: Heartbeat(1, 49, 0) in group.of(5, 2))
        assert proxy.counts()["flip"] == 1 and len(proxy.records()) == 2
    # Nothing tampered arrived, nothing twice, in order, from the proved sender.
    assert group.inboxes[5] == [(2, m) for m in ([chunk] if chunk_kept else []) + beats]


# --- bounds ----------------------------------------------------------------------------------


def _filler(seq: int) -> OutboxTrim:
    """A frame of one size for seqs 128..16383 (a name of 1000 bytes)."""
    return OutboxTrim(1, (("x" * 1000, seq),))


def _big_trim() -> OutboxTrim:
    """A frame of about 1 MiB."""
    return OutboxTrim(1, tuple((f"{k:04d}" + "x" * 1020, 1) for k in range(1024)))


async def test_a_queue_to_an_unreachable_replica_is_dropped_counted_and_bounded(
    group: Group, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    await group.add(0)
    reachable = group.book[0]
    with socket.socket() as nothing:  # bound, not listening: every dial is refused
        nothing.bind(("127.0.0.1", 0))
        group.book[0] = Endpoint("127.0.0.1", nothing.getsockname()[1])
        sender = await group.add(1, max_queue_bytes=64 << 10)
        frame_size = len(encode_frame(_filler(1000)))
        for i in range(1000):
            sender.send(0, _filler(1000 + i))  # one size
            assert sender.queued_bytes(0) <= 64 << 10
            if i % 100 == 0:
                await asyncio.sleep(0)  # the dialing coroutine runs, and fails
        queued = sender.queued_bytes(0) // frame_size
        assert sender.dropped_frames == 1000 - queued and queued > 0
        assert sender.dropped_bytes == (1000 - queued) * frame_size
        assert sum("passed the limit of 65536 bytes" in r.getMessage() for r in caplog.records) == 1
        assert _said(caplog, "cannot replicate to replica 0 of 'bank' at 127.0.0.1:")
    group.book[0] = reachable  # asked again at the next dial
    sender.send(0, NewTerm(7, G3))
    await _until("the message after", lambda: (1, NewTerm(7, G3)) in group.inboxes[0])
    kept = [_filler(1000 + i) for i in range(1000 - queued, 1000)]
    assert group.of(0, 1) == [*kept, NewTerm(7, G3)]
    await _until("the end of the drops said", lambda: _said(caplog, "takes frames again"))
    sender.forget(0)  # a replica that left: its connection and queue go
    assert not sender.connected(0) and sender.queued_bytes(0) == 0


async def test_a_checkpoint_larger_than_the_queue_bound_arrives_whole(group: Group) -> None:
    """All the chunks of a checkpoint are sent at once, 16 times the queue's bound: they
    wait as messages and are queued as it drains, so none is dropped. A chunk of another
    transfer replaces what is left of the one before."""
    await group.add(0)
    sender = await group.add(1, max_queue_bytes=256 << 10)
    data = os.urandom(4 << 20)
    size = 64 << 10
    chunks = [
        TakenChunk(3, 50, len(data), offset, data[offset : offset + size])
        for offset in range(0, len(data), size)
    ]
    for chunk in chunks:
        sender.send(0, chunk)
        assert sender.queued_bytes(0) <= 256 << 10
    assert sender.paced_chunks(0) > 0  # most of them wait
    await _until("every chunk", lambda: len(group.inboxes[0]) >= len(chunks))
    assert group.of(0, 1) == chunks and sender.dropped_frames == 0
    # Unreachable now: a transfer waits, and a new one replaces it.
    with socket.socket() as nothing:
        nothing.bind(("127.0.0.1", 0))
        group.book[0] = Endpoint("127.0.0.1", nothing.getsockname()[1])
        await group.transports[0].close()
        for chunk in chunks:
            sender.send(0, chunk)
        waiting = sender.paced_chunks(0)
        assert waiting > 0
        newer = [CheckpointChunk(4, 60, 3, 0, b"abc")]
        sender.send(0, newer[0])
        assert sender.paced_chunks(0) == 1  # the older transfer's rest is gone, abc waits
        assert sender.queued_bytes(0) <= 256 << 10


async def test_a_peer_that_reads_nothing_holds_no_more_than_the_bounds(group: Group) -> None:
    """An acceptor that proves itself, then reads nothing: what the sender holds for it
    (queue, transport buffer, the kernel's buffers) stays bounded; the rest is dropped.
    Bounded per connection: should one end and the sender dial again (a timeout on a
    machine slow enough), what it wrote to the one that ended is gone with it, and the
    assertion says how many there were."""
    proved = asyncio.Event()
    connections = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        challenge = (await reader.readexactly(82))[1:]
        nonce = os.urandom(32)
        proof = _hmac(SECRET, b"ambrosia-replica-v1 acceptor", challenge + nonce)
        writer.write(bytes([73]) + b"AMBREPL1\x02" + nonce + proof)
        await reader.readexactly(42)
        proved.set()
        await asyncio.Event().wait()  # reads nothing more

    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # no autotuning
    sock.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(accept, sock=sock)
    group.book[0] = Endpoint("127.0.0.1", sock.getsockname()[1])
    limit, total = 4 << 20, 0
    sender = await group.add(1, max_queue_bytes=limit)
    big = _big_trim()
    for i in range(64):
        sender.send(0, big)
        total += len(encode_frame(big))
        assert sender.queued_bytes(0) <= limit
        await asyncio.sleep(0)  # the writing coroutine takes its turn
        if i == 0:
            await asyncio.wait_for(proved.wait(), DEADLINE)
    wmem = int(Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()[2])
    held = total - sender.dropped_bytes - sender.queued_bytes(0)  # handed to the transport
    assert sender.dropped_bytes > 0
    per_connection = WRITE_HIGH_WATER + WRITE_BATCH_BYTES + (1 << 20) + wmem + (2 << 20)
    assert held <= connections * per_connection, (
        f"{held} bytes handed to {connections} connection(s); dropped "
        f"{sender.dropped_bytes}, queued {sender.queued_bytes(0)}, the kernel's send "
        f"buffer at most {wmem}"
    )
    server.close()


async def test_a_newcomer_evicts_a_silent_connection_when_every_slot_is_taken(
    secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    async with Group(LinkSettings(secret_file=secret_file, max_connections=2)) as group:
        await group.add(0)
        sender = await group.add(1)
        silent = [await asyncio.open_connection("127.0.0.1", group.book[0].port) for _ in range(2)]
        await _until("both admitted", lambda: group.transports[0].admission.open == 2)
        sender.send(0, NewTerm(3, G3))
        await _until("the message", lambda: group.inboxes[0] == [(1, NewTerm(3, G3))])
        await _closed_by_peer(silent[0][0])  # the oldest went
        assert _said(caplog, "closed: all 2 connection slots are taken")
        for _, writer in silent:
            writer.close()


@needs_openssl
async def test_the_same_exchange_over_mutual_tls(
    tmp_path: Path, secret_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    options = mutual_tls(tmp_path, ("replica",))["replica"]
    cert, key, ca = (Path(options[i]) for i in (1, 3, 5))
    settings = LinkSettings(secret_file=secret_file, tls_cert=cert, tls_key=key, tls_ca=ca)
    async with Group(settings) as group:
        for replica in (0, 1, 2):
            await group.add(replica)
        await _exchange(group)
        # A holder of the secret without TLS gets nowhere: TLS refuses it first.
        await group.add(3, settings=LinkSettings(secret_file=secret_file))
        group.transports[3].send(0, NewTerm(9, G3))
        await _until("the refusal", lambda: _said(caplog, "replica connection from", "TLS failed"))
        assert not group.transports[3].connected(0)
        assert all(sender != 3 for sender, _ in group.inboxes[0])


async def test_flush_writes_what_is_queued_before_the_loop_turns(group: Group) -> None:
    """A primary ships a record, then syncs it on the event loop, which then blocks: the
    frame must be written before that, not in the loop's next turn."""
    a = await group.add(0)
    await group.add(1)
    a.send(1, Heartbeat(1, 0, 0))
    await _until("connected", lambda: a.connected(1) and a.queued_bytes(1) == 0)
    a.send(1, Heartbeat(1, 5, 5))
    assert a.queued_bytes(1) > 0  # queued: it would leave in the next turn
    a.flush()
    assert a.queued_bytes(1) == 0  # written now, no turn of the loop in between
    await _until("both heartbeats", lambda: len(group.of(1, 0)) == 2)
    assert group.of(1, 0) == [Heartbeat(1, 0, 0), Heartbeat(1, 5, 5)]
