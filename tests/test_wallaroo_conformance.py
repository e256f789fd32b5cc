"""Three rules of the seeds, tested against bytes written from the seeds' own text.

Every frame these tests send or read is packed by hand with ``struct`` from seed 000's
layouts (draft: little-endian, ASCII tags) or the reference's (v3: big-endian, numeric
tags), never by our encoder, so a test fails when our codec and the seed disagree
instead of agreeing with itself. The one gap the seed leaves, where a MESSAGE carries
its stream id, is filled as ``docs/wallaroo.md`` says: first, as in NOTIFY.

1. *No order among message ids* (seed 000, *Streaming*: "Wallaroo does not make any
   assumptions around monotonicity of message ids"): a draft worker fed ids 10 then 5 on
   one stream applies both; the v3 worker drops the 5, as the released one did
   (reference). What the draft worker still refuses to apply twice is a replay after a
   reconnect: a NOTIFY that resumes elsewhere than the worker's point is NACKed to it.
2. *A stream starts with its NOTIFY* (seed 000, *Overview*: "Once a stream notification
   has been sent, the open stream can have any number of messages for that stream
   sent"): a worker written from seed 000 alone, which has no NOTIFY_ACK, gets every
   message of the real draft connector process, in order, then its EOS.
3. *A frame that came before a failure is handled* (reference: the released worker sends
   RESTART and closes): fake v3 workers that write RESTART and reset the connection at
   once (SO_LINGER 0) while the connector is busy writing move the real connector
   process between them again and again; it never dials the one that sent it away.

Real processes where more than one is involved; every wait has a deadline.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import pytest

from ambrosia_py.testing import ServiceProcess
from ambrosia_py.testing import wait_for as _wait_for
from immortals.wallaroo import Dialect
from immortals.wallaroo.sources import generate
from tests.wallaroo_harness import Worker

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
COOKIE = "conformance"
DEADLINE = 120.0
NOTHING_SEEN = 2**64 - 1  # reference: NOTIFY_ACK's point for a stream never seen
_LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


def wait_for(what: str, condition: Callable[[], bool], context: Callable[[], str]) -> None:
    _wait_for(what, condition, DEADLINE, context)


# --- seed 000's frames (draft), by hand ---------------------------------------------------


def short(data: bytes) -> bytes:
    """Seed 000's ``short_bytes``: a u16 little-endian length, then the bytes."""
    return struct.pack("<H", len(data)) + data


def draft_notify(stream_id: int, name: bytes, point: int) -> bytes:
    """``notify(StreamId, StreamName, PointOfRef)`` without the length prefix."""
    return b"N" + struct.pack("<Q", stream_id) + short(name) + struct.pack("<Q", point)


def draft_message(stream_id: int, message_id: int, payload: bytes) -> bytes:
    """``message(Message, MessageId, 0)``, the stream id first (docs/wallaroo.md)."""
    return b"M" + struct.pack("<QHQ", stream_id, 0, message_id) + payload


def draft_ack(credits: int, *acks: tuple[int, int]) -> bytes:
    """``ack(Credits, MessageAcks)``, length prefix included."""
    body = b"A" + struct.pack("<I", credits) + b"".join(struct.pack("<QQ", *a) for a in acks)
    return struct.pack("<I", len(body)) + body


def draft_nack(credits: int, stream_id: int, point: int) -> bytes:
    body = b"!" + struct.pack("<IQQ", credits, stream_id, point)
    return struct.pack("<I", len(body)) + body


def draft_notify_ack(success: bool, stream_id: int, point: int) -> bytes:
    """The addendum's NOTIFY_ACK with v3's body (tag 4, little-endian in the draft)."""
    body = b"\x04" + struct.pack("<BQQ", success, stream_id, point)
    return struct.pack("<I", len(body)) + body


# --- v3's frames (reference), by hand -------------------------------------------------------


def v3_frame(tag: int, body: bytes) -> bytes:
    return struct.pack(">IB", 1 + len(body), tag) + body


def v3_notify(stream_id: int, name: bytes, point: int) -> bytes:
    return bytes([3]) + struct.pack(">QH", stream_id, len(name)) + name + struct.pack(">Q", point)


def v3_message(stream_id: int, message_id: int, payload: bytes) -> bytes:
    """Stream id, message id, event time (i64), an empty key, the payload."""
    return bytes([5]) + struct.pack(">QQqH", stream_id, message_id, 0, 0) + payload


# --- rule 1: message ids carry no order (the worker's core) ---------------------------------


def sends(worker: Worker, conn: str, raw: list[bytes]) -> bytes:
    """The bytes the worker writes back to ``conn`` for one read of ``raw`` frames."""
    replies = worker.core.frames(conn, raw)
    assert not any(s.close for s in replies.sends), replies
    return b"".join(s.wire for s in replies.sends)


def test_draft_applies_a_lower_message_id_after_a_higher_one() -> None:
    w = Worker(Dialect.DRAFT)
    c = w.connect()
    wire = sends(w, c.name, [draft_notify(1, b"s", 0), draft_message(1, 10, b"ten")])
    assert wire == draft_notify_ack(True, 1, NOTHING_SEEN) + draft_ack(0, (1, 10))
    assert sends(w, c.name, [draft_message(1, 5, b"five")]) == draft_ack(0, (1, 5))
    assert w.payloads == [b"ten", b"five"]
    assert w.core.duplicates == 0 and w.stream(1).point == 5  # the last one applied


def test_v3_drops_an_id_at_or_below_the_last_as_the_released_worker_did() -> None:
    w = Worker(Dialect.V3)
    c = w.connect()
    sends(w, c.name, [v3_notify(1, b"s", NOTHING_SEEN), v3_message(1, 10, b"ten")])
    assert sends(w, c.name, [v3_message(1, 5, b"five")]) == b""  # nothing moved, no refill
    assert w.payloads == [b"ten"] and w.core.duplicates == 1 and w.stream(1).point == 10


def test_draft_replay_after_a_reconnect_is_nacked_to_the_workers_point() -> None:
    """A connector that resumes elsewhere than the worker's point is told where to resume
    (seed 000, *Acks and Nacks*); what it sent meanwhile is ignored, so nothing it had
    already sent is applied twice, whatever order its ids are in."""
    w = Worker(Dialect.DRAFT)
    a = w.connect()
    sends(
        w,
        a.name,
        [draft_notify(1, b"s", 0), draft_message(1, 30, b"a"), draft_message(1, 20, b"b")],
    )
    w.core.closed(a.name)
    b = w.connect()
    replay = [draft_notify(1, b"s", 0), draft_message(1, 30, b"a"), draft_message(1, 20, b"b")]
    assert sends(w, b.name, replay) == draft_notify_ack(True, 1, 20) + draft_nack(0, 1, 20)
    resume = [draft_notify(1, b"s", 20), draft_message(1, 40, b"c")]
    assert sends(w, b.name, resume) == draft_notify_ack(True, 1, 20) + draft_ack(5, (1, 40))
    assert w.payloads == [b"a", b"b", b"c"]


# --- rule 2: the draft connector against a worker of seed 000 alone --------------------------


class Wire:
    """Frames off a blocking socket: a u32 length (of what follows it), then the frame."""

    def __init__(self, sock: socket.socket, order: Literal["<", ">"]) -> None:
        self.sock, self.order, self.buf = sock, order, b""

    def frame(self) -> bytes:
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack(self.order + "I", self.buf[:4])
                if len(self.buf) >= 4 + size:
                    frame, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
                    return frame
            data = self.sock.recv(1 << 16)
            if not data:
                raise ConnectionError("the connector closed the connection")
            self.buf += data


def accept(listener: socket.socket) -> socket.socket:
    listener.settimeout(DEADLINE)
    sock, _ = listener.accept()
    sock.settimeout(DEADLINE)
    return sock


class SeedWorker(threading.Thread):
    """A worker from seed 000's text alone: OK answers HELLO with credits and no points;
    NOTIFY opens a stream (there is no NOTIFY_ACK in the seed); each MESSAGE is recorded;
    ACKs give back the credits spent, with the last message id, "almost like a regular
    heartbeat" (seed 000, *Acks and Nacks*)."""

    CREDITS = 20

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.notified: list[tuple[int, bytes, int]] = []
        self.messages: list[tuple[int, int, int, bytes]] = []  # stream, id, flags, payload
        self.ended = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with accept(self.listener) as sock:
                self.serve(sock, Wire(sock, "<"))
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.ended.set()

    def serve(self, sock: socket.socket, wire: Wire) -> None:
        hello = wire.frame()
        assert hello[:1] == b"H", hello
        at = 1 + 16  # the version: 128 bits (footnotes A1, B0)
        (n,) = struct.unpack_from("<H", hello, at)
        assert hello[at + 2 : at + 2 + n] == COOKIE.encode(), hello
        ok = b"O" + struct.pack("<I", self.CREDITS)  # ok(InitialCredits, []): no points
        sock.sendall(struct.pack("<I", len(ok)) + ok)
        spent = 0
        while not self.ended.is_set():
            frame = wire.frame()
            spent += 1  # "all frames take one credit"
            if frame[:1] == b"N":
                (sid, n) = struct.unpack_from("<QH", frame, 1)
                (point,) = struct.unpack_from("<Q", frame, 11 + n)
                self.notified.append((sid, frame[11 : 11 + n], point))
            elif frame[:1] == b"M":
                sid, flags, mid = struct.unpack_from("<QHQ", frame, 1)
                self.messages.append((sid, mid, flags, frame[19:]))
                if flags & 4:  # EOS
                    sock.sendall(draft_ack(spent, (sid, mid)))
                    self.ended.set()
                    return
            else:
                raise AssertionError(f"a connector sent {frame[:1]!r}")
            if spent >= self.CREDITS // 2:
                last = self.messages[-1][:2] if self.messages else None
                sock.sendall(draft_ack(spent, *([last] if last else [])))
                spent = 0


class Service(ServiceProcess):
    def __init__(self, data_dir: Path, *args: str) -> None:
        super().__init__("immortals.wallaroo.connector", "conn", data_dir, args, cwd=ROOT, env=ENV)


@pytest.fixture
def connector(tmp_path: Path) -> Iterator[Callable[..., Service]]:
    started: list[Service] = []

    def start(worker: str, dialect: str, source: str) -> Service:
        c = Service(
            tmp_path / "connector",
            *("--worker", worker, "--cookie", COOKIE, "--dialect", dialect),
            *("--source", source, "--backoff-max", "0.2"),
        )
        started.append(c)
        c.start()
        return c

    try:
        yield start
    finally:
        for c in started:
            c.stop()


def test_the_draft_connector_streams_to_a_worker_of_seed_000_alone(
    connector: Callable[..., Service],
) -> None:
    worker = SeedWorker()
    worker.start()
    n, source = 300, "gen://300?seed=5"
    with worker.listener:  # closed pass or fail
        conn = connector(worker.address, "draft", source)
        wait_for(
            "every message and the EOS at the seed's worker",
            worker.ended.is_set,
            lambda: f"{len(worker.messages)} messages, {worker.notified}\n{conn.tail()}",
        )
    assert worker.error is None, worker.error
    ((sid, name, point),) = worker.notified
    assert (name, point) == (source.encode(), 0)  # nothing to resume from: zero (seed 000)
    *messages, eos = worker.messages
    assert messages == [(sid, k, 0, generate(5, k)) for k in range(1, n + 1)]
    assert eos == (sid, n, 2 | 4, b"")  # a boundary flagged EOS at the last id (D0)


# --- rule 3: a RESTART right before a reset is followed ----------------------------------


class Mover(threading.Thread):
    """Two fake v3 workers. Each answers HELLO with OK and NOTIFY with NOTIFY_ACK, reads
    the connector's messages until it has ``enough`` bytes, then writes RESTART naming the
    other and closes with a reset: the connector is still writing, so its socket fails
    with the RESTART unread. The next connection must come to the other worker."""

    def __init__(self, moves: int, enough: int = 256 * 1024, credits: int = 20_000) -> None:
        super().__init__(daemon=True)
        self.listeners = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
        self.addresses = [f"127.0.0.1:{s.getsockname()[1]}" for s in self.listeners]
        self.moves, self.enough, self.credits = moves, enough, credits
        self.done = 0
        self.finished = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for move in range(self.moves):
                self.serve(move)
                self.done += 1
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.finished.set()

    def serve(self, move: int) -> None:
        here, there = move % 2, (move + 1) % 2
        ready, _, _ = select.select(self.listeners, [], [], DEADLINE)
        assert ready, f"move {move}: no connection"
        if self.listeners[here] not in ready:
            raise AssertionError(
                f"move {move}: the connector dialled {self.addresses[there]}, the worker "
                f"that sent it to {self.addresses[here]}: it lost the RESTART"
            )
        sock = accept(self.listeners[here])
        wire = Wire(sock, ">")
        assert wire.frame()[:1] == b"\x00"  # HELLO
        sock.sendall(v3_frame(1, struct.pack(">I", self.credits)))  # OK
        notify = wire.frame()
        assert notify[:1] == b"\x03", notify
        (sid,) = struct.unpack_from(">Q", notify, 1)
        sock.sendall(v3_frame(4, struct.pack(">BQQ", 1, sid, NOTHING_SEEN)))  # NOTIFY_ACK
        got = 0
        while got < self.enough:
            data = sock.recv(1 << 16)
            assert data, f"move {move}: the connector closed"
            got += len(data)
        address = self.addresses[there].encode()
        sock.sendall(v3_frame(7, struct.pack(">I", len(address)) + address))  # RESTART
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RESET)
        sock.close()


def test_a_v3_restart_followed_by_a_reset_still_moves_the_connector(
    connector: Callable[..., Service],
) -> None:
    mover = Mover(moves=8)
    mover.start()
    with mover.listeners[0], mover.listeners[1]:  # closed pass or fail
        conn = connector(mover.addresses[0], "v3", "gen://100000000?seed=2&size=100")
        wait_for(
            "the connector to follow every RESTART",
            mover.finished.is_set,
            lambda: f"moves done {mover.done}\n{conn.tail()}",
        )
    assert mover.error is None, f"{mover.error}\n{conn.tail()}"
    assert mover.done == 8
    wait_for(
        "the connector to log the last RESTART",
        lambda: conn.tail(1_000_000).count("sent RESTART to") == 8,
        conn.tail,
    )
