"""Seed 000's and seed 001's rules on the connector's side, one test each, against bytes
laid out by hand (``tests/wallaroo_seed_bytes.py``), never by our encoder. Unit tests of
the sans-IO core, but for the last, which runs the connector's edge and core in this
process against a worker of seed 000's text on a loopback socket. The table in
``docs/protocols.md`` (*Seeds 000 and 001*) names the seed line each test checks."""

from __future__ import annotations

import asyncio
import hashlib
import struct
from typing import Any

from immortals.wallaroo.connector_actions import (
    Action,
    Close,
    Commit,
    ConnectorConfig,
    Dial,
    Go,
    Halt,
    Stop,
    Write,
    granted,
)
from immortals.wallaroo.connector_core import ConnectorCore
from immortals.wallaroo.connector_transport import ConnectorEdge
from immortals.wallaroo.sources import generate, open_source
from tests.wallaroo_seed_bytes import (
    BOUNDARY,
    DRAFT,
    EOS,
    MIGRATION_ACK,
    VERSION,
    ack,
    boundary,
    error,
    frame,
    migrate,
    nack,
    notify,
    ok,
    reason_of,
    short,
)

# --- the connector's core ----------------------------------------------------------------------

WORKER, OTHER = "127.0.0.1:7100", "127.0.0.1:7200"
S1, S2 = b"gen://100?seed=1", b"gen://50?seed=2"
ID1, ID2 = (int(hashlib.sha256(s).hexdigest()[:16], 16) for s in (S1, S2))  # reference


class Connector:
    def __init__(self, *streams: bytes) -> None:
        names = tuple(s.decode() for s in streams or (S1,))
        config = ConnectorConfig(WORKER, names, cookie=b"c", dialect=DRAFT, instance_name="i")
        self.core = ConnectorCore()
        assert self.core.start("i1", config).actions == (Dial(1, WORKER, 0),)

    def connect(self, dial: int, conn: str, address: str = WORKER) -> list[Action]:
        return list(self.core.connected(dial, conn, address).actions)

    def receive(self, conn: str, *wire: bytes) -> list[Action]:
        return list(self.core.frames(conn, [f[4:] for f in wire]).actions)

    def open(self, conn: str = "c.1") -> list[Action]:
        self.connect(self.core.dials, conn)
        return self.receive(conn, ok(10))

    def gen(self, sid: int = ID1) -> int:
        return self.core.streams[sid].generation


def writes(actions: list[Action], conn: str | None = None) -> list[bytes]:
    """The frames ``actions`` write (on ``conn`` only, if given), in order."""
    out: list[bytes] = []
    for a in actions:
        if isinstance(a, Write) and conn in (None, a.conn):
            out += a.frames
    return out


def test_the_connector_says_hello_first() -> None:
    """*Handshake*: "Upon connection, the connector must send a hello frame": version
    (A1, B0), cookie, program name, instance name, each name a ``short_bytes``. It costs
    no credit (none are granted before OK)."""
    c = Connector()
    (w,) = c.connect(1, "c.1")
    assert isinstance(w, Write) and not w.charged
    assert w.frames == (frame(b"H" + VERSION + short(b"c") + short(b"ambrosia-py") + short(b"i")),)


def test_after_ok_each_stream_is_notified_and_starts_at_once() -> None:
    """*Streaming*: "before it can send messages to wallaroo it needs to notify wallaroo
    of each new logical stream"; a stream with no point to resume from gives "the value
    zero"; *Overview*: once notified, "the open stream can have any number of messages"
    (seed 000 has no NOTIFY_ACK to wait for). NOTIFY costs a credit (charged)."""
    c = Connector(S1, S2)
    actions = c.open()
    assert isinstance(actions[0], Write) and actions[0].charged
    assert writes(actions) == [notify(ID1, S1, 0), notify(ID2, S2, 0)]
    assert actions[1:] == [
        Go("c.1", ID1, S1.decode(), c.gen(ID1), None),
        Go("c.1", ID2, S2.decode(), c.gen(ID2), None),
    ]


def test_the_oks_points_are_where_the_streams_resume() -> None:
    """C1 and its NOTE (the worker's point wins, lower or higher); *Streaming*: "If a
    connector is resuming from Wallaroo's provided point of reference it should provide
    that reference in the notification"."""
    c = Connector(S1, S2)
    c.connect(1, "c.1")
    actions = c.receive("c.1", ok(10, (ID2, 41)))
    assert writes(actions) == [notify(ID1, S1, 0), notify(ID2, S2, 41)]
    assert [a.start for a in actions if isinstance(a, Go)] == [None, 41]


def test_acks_record_the_workers_points() -> None:
    """*Overview*: ACKs carry "stream id * message id pairs that have been properly
    processed", for the connector's bookkeeping; their credits go to the edge."""
    c = Connector()
    c.open()
    assert c.receive("c.1", ack(5, (ID1, 30))) == [Commit(S1.decode(), 30)]
    assert c.core.streams[ID1].acked == 30
    assert granted(ack(5, (ID1, 30))[4:], DRAFT) == 5
    assert granted(ok(7)[4:], DRAFT) == 7
    assert granted(nack(3, ID1, 0)[4:], DRAFT) == 3


def test_the_end_of_a_stream_is_a_boundary_flagged_eos() -> None:
    """D0: a boundary may "denote the end of the stream if there is no message to apply
    that notation to": flags BOUNDARY|EOS, the last message id, no payload."""
    c = Connector()
    c.open()
    actions = list(c.core.halted("c.1", ID1, c.gen(), 100, True).actions)
    assert writes(actions) == [boundary(ID1, 100, EOS)]


def test_a_nack_is_answered_with_a_notify_at_its_point() -> None:
    """*Acks and Nacks*: the stream is reset until "a new notify message is sent ... with
    a specific point of reference to continue from"; the NOTIFY leaves with the reader,
    once the source could read from that point (D5)."""
    c = Connector()
    c.open()
    actions = c.receive("c.1", nack(4, ID1, 7))
    assert actions == [
        Stop("c.1", ID1),
        Go("c.1", ID1, S1.decode(), c.gen(), 7, notify(ID1, S1, 7)),
    ]


def test_stacked_nacks_each_get_their_notify() -> None:
    """*Stream State Machine*: "Each NACK will require a NOTIFY". The second reader's
    NOTIFY replaces the first's reader, whose NOTIFY the edge still sends."""
    c = Connector()
    c.open()
    first = c.receive("c.1", nack(0, ID1, 7))
    second = c.receive("c.1", nack(0, ID1, 3))
    leads = [a.lead for a in first + second if isinstance(a, Go)]
    assert leads == [notify(ID1, S1, 7), notify(ID1, S1, 3)]


def test_an_error_from_the_worker_closes_and_the_connector_backs_off() -> None:
    """*Overview*: "The error will end the connection and the connector will need to
    reopen a socket"; *Protocol State Machine*: "it is recommended that the connecting
    party use backoff during reconnects"."""
    c = Connector()
    for attempt in (1, 2, 3):
        c.connect(c.core.dials, f"c.{attempt}")
        actions = c.receive(f"c.{attempt}", error(b"Bad cookie"))
        assert actions == [Close(f"c.{attempt}"), Dial(attempt + 1, WORKER, attempt)]


def test_a_frame_the_connector_never_receives_is_answered_with_error() -> None:
    """*Protocol State Machine*: NOTIFY goes connector -> worker, OK only in HANDSHAKE;
    either from the worker is answered ERROR (uncharged), a close and a new dial."""
    for bad in (notify(ID1, S1, 0), ok(3)):
        c = Connector()
        c.open()
        actions = c.receive("c.1", bad)
        (err,) = writes(actions)
        assert "(frame at stream offset" in reason_of(err)
        assert [type(a).__name__ for a in actions] == ["Write", "Close", "Dial"]
        assert not actions[0].charged  # type: ignore[union-attr]


def test_a_source_that_cannot_resume_sends_error_and_no_notify() -> None:
    """D5: a connector "unable to resume from the given point of reference ... should not
    notify but instead send an error and exit the session"; "An error here should always
    mean halt": the stream is not introduced again in this incarnation."""
    c = Connector(S1, S2)
    c.open()
    c.receive("c.1", nack(0, ID1, 500))
    actions = list(c.core.failed("c.1", ID1, c.gen(), "it has 100 records").actions)
    assert writes(actions) == [error(b"stream 'gen://100?seed=1': it has 100 records")]
    assert [type(a).__name__ for a in actions] == ["Write", "Close", "Dial"]
    c.connect(c.core.dials, "c.2")
    assert writes(c.receive("c.2", ok(10))) == [notify(ID2, S2, 0)]


def test_a_finished_stream_is_introduced_once_more_at_its_end() -> None:
    """*Streaming*: EOS closes the stream. An ACK of the end that follows the EOS may be
    the last MESSAGE's, sent before a worker that then crashed read the EOS; so the next
    session introduces the finished stream once more at its end, its reader sending only
    the EOS, and an ACK there can only be the EOS's: then it is not introduced again."""
    c = Connector(S1, S2)
    c.open()
    c.core.halted("c.1", ID1, c.gen(), 100, True)
    c.receive("c.1", ack(0, (ID1, 100)))
    c.core.closed("c.1")
    actions = c.open("c.2")
    assert writes(actions) == [notify(ID1, S1, 100), notify(ID2, S2, 0)]
    assert [a.start for a in actions if isinstance(a, Go)] == [100, None]
    eos = writes(list(c.core.halted("c.2", ID1, c.gen(), 100, True).actions))
    assert eos == [boundary(ID1, 100, EOS)]
    c.receive("c.2", ack(0, (ID1, 100)))
    c.core.closed("c.2")
    assert writes(c.open("c.3")) == [notify(ID2, S2, 0)]


# --- seed 001: the connector's side of a migration ------------------------------------------


def test_the_connector_migrates_in_the_addendums_order() -> None:
    """Seed 001, *Migration Protocol*: MIGRATE (step 1); the reader stops (step 2) and
    EOS goes at its last point (step 3); the new address is dialled and greeted while
    the old connection stays open (steps 7, 8; *Notes*: "connect to the new source
    before closing the old one"); once the old worker acknowledged the EOS (step 6),
    MIGRATION_ACK on the old connection (step 9) and NOTIFY on the new one (step 11)."""
    c = Connector()
    c.open()
    c.receive("c.1", ack(0, (ID1, 20)))
    actions = c.receive("c.1", migrate(b"127.0.0.1", 7200))
    assert actions == [Dial(2, OTHER, 0), Halt("c.1", ID1, S1.decode(), c.gen())]
    assert writes(list(c.core.halted("c.1", ID1, c.gen(), 33, False).actions)) == [
        boundary(ID1, 33, EOS)
    ]
    (greet,) = writes(c.connect(2, "c.2", OTHER))
    assert greet[4:5] == b"H" and "c.1" in c.core.conns
    assert c.receive("c.2", ok(10)) == []  # the EOS is not acknowledged yet
    actions = c.receive("c.1", ack(0, (ID1, 33)))
    assert writes(actions, "c.1") == [MIGRATION_ACK]
    assert writes(actions, "c.2") == [notify(ID1, S1, 33)]
    assert c.core.target == OTHER


def test_a_migrate_in_the_handshake_is_followed() -> None:
    """Seed 001, *Protocol State Machine*: "MIGRATE: Worker -> Connector (next state =
    migrating)" in the handshake state, as a worker that moved answers a HELLO. That
    connection never had an OK, so never a credit: its MIGRATION_ACK is not charged one,
    or the edge would hold it for ever (the old worker does not charge it either)."""
    c = Connector()
    c.connect(1, "c.1")
    assert c.receive("c.1", migrate(b"127.0.0.1", 7200)) == [Dial(2, OTHER, 0)]
    c.connect(2, "c.2", OTHER)
    actions = c.receive("c.2", ok(10))
    assert writes(actions, "c.1") == [MIGRATION_ACK]
    (ack,) = [a for a in actions if isinstance(a, Write) and a.conn == "c.1"]
    assert not ack.charged
    assert writes(actions, "c.2") == [notify(ID1, S1, 0)]


def test_after_a_failed_migration_either_worker_may_be_dialled() -> None:
    """Seed 001, *Notes*: after an error or loss of connection during a migration the
    connector "may connect to either, and if no reponse, try the other one"."""
    c = Connector()
    c.open()
    c.receive("c.1", migrate(b"127.0.0.1", 7200))
    c.connect(2, "c.2", OTHER)
    actions = list(c.core.closed("c.1").actions)  # the old worker went first
    assert actions == [Close("c.2"), Dial(3, WORKER, 0, (OTHER,))]
    (greet,) = writes(c.connect(3, "c.3", OTHER))  # the new one answered
    assert greet[4:5] == b"H" and c.core.target == OTHER


# --- seed 000, *Overview*: the connector keeps within its credits ----------------------------


class Glue:
    """The connector immortal's wiring, without its log: the edge's reports go to the
    core, the core's actions to the edge."""

    def __init__(self, core: ConnectorCore) -> None:
        self.core = core
        self.edge: ConnectorEdge | None = None

    def apply(self, actions: Any) -> None:
        assert self.edge is not None
        self.edge.apply(actions)

    def connected(self, dial: int, conn: str, address: str) -> None:
        self.apply(self.core.connected(dial, conn, address))

    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None:
        self.apply(self.core.frames(conn, frames))

    def too_large(self, conn: str, offset: int, size: int) -> None:
        self.apply(self.core.too_large(conn, offset, size))

    def closed(self, conn: str) -> None:
        self.apply(self.core.closed(conn))

    def halted(self, conn: str, stream_id: int, generation: int, point: int, end: bool) -> None:
        self.apply(self.core.halted(conn, stream_id, generation, point, end))

    def failed(self, conn: str, stream_id: int, generation: int, reason: str) -> None:
        self.apply(self.core.failed(conn, stream_id, generation, reason))

    def retry(self, conn: str, stream_id: int) -> None:
        self.apply(self.core.retry(conn, stream_id))


async def _within_credits(credits: int) -> list[tuple[int, int, bytes]]:
    """A worker of seed 000's text: OK with ``credits``; then, whenever the connector has
    spent them all, checks that nothing more comes and ACKs them back. Returns the
    MESSAGEs (id, flags, payload) up to the EOS."""
    got: list[tuple[int, int, bytes]] = []
    done = asyncio.Event()
    failures: list[BaseException] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        async def one() -> bytes:
            (size,) = struct.unpack("<I", await reader.readexactly(4))
            return await reader.readexactly(size)

        assert (await one())[:1] == b"H"
        writer.write(ok(credits))
        while True:
            for _ in range(credits):  # "all frames take one credit"
                f = await one()
                if f[:1] == b"N":
                    continue
                assert f[:1] == b"M", f
                _, flags, mid = struct.unpack_from("<QHQ", f, 1)
                got.append((mid, flags, f[19:]))
                if flags & EOS:
                    return
            try:
                extra = await asyncio.wait_for(reader.readexactly(1), 0.05)
            except TimeoutError:
                pass
            else:
                raise AssertionError(f"a frame sent with no credit left: {extra!r}...")
            writer.write(ack(credits, (ID3, got[-1][0])) if got else ack(credits))

    async def worker(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve(reader, writer)
        except BaseException as exc:  # reported by the test
            failures.append(exc)
        finally:
            done.set()

    server = await asyncio.start_server(worker, "127.0.0.1", 0)
    address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    config = ConnectorConfig(address, (S3.decode(),), cookie=b"c", dialect=DRAFT)
    core = ConnectorCore()
    glue = Glue(core)
    edge = glue.edge = ConnectorEdge(glue, "i1", config, open_source(S3.decode(), "i"))
    try:
        edge.apply(core.start("i1", config))
        async with asyncio.timeout(60):
            await done.wait()
    finally:
        await edge.close()
        server.close()
        await server.wait_closed()
    assert not failures, failures
    return got


S3 = b"gen://30?seed=3"
ID3 = int(hashlib.sha256(S3).hexdigest()[:16], 16)


def test_the_connector_sends_no_frame_without_a_credit() -> None:
    """*Overview*: messages are sent "so long as the credit count remains above zero",
    and the NOTIFY takes one too. A worker granting 4 credits at a time sees at most 4
    frames between its grants, and every message in order, then the EOS."""
    got = asyncio.run(_within_credits(credits=4))
    *messages, eos = got
    assert messages == [(k, 0, generate(3, k)) for k in range(1, 31)]
    assert eos == (30, BOUNDARY | EOS, b"")
