"""The worker immortal end to end: ``ambrosia-py run immortals.wallaroo.worker`` over TCP.

Real processes on loopback. The client speaks v3 as the released Python connector does
(``machida/lib/wallaroo/experimental/connectors.py``): HELLO with version "0.0.1" and
the cookie, a NOTIFY per stream with the id the released connector derives (the first
16 hex digits of SHA-256 of the name) and its point of reference, MESSAGEs spending
credits, waiting for ACK refills, EOS; it resumes each stream after the point NOTIFY_ACK
gives. Every byte it sends is built by hand with ``struct`` (``tests/wallaroo_process.py``),
not by our encoder.

While two word streams flow, the worker's service process, its coordinator, or both
are SIGKILLed mid-stream (right after a batch of messages was sent, before its ACK) and
restarted; the client reconnects, says HELLO, re-notifies and resumes (and, to exercise
de-duplication, resends a few messages at or below the point). The word counts in the
application's state must equal exactly-once processing of the text, and ``ambrosia-py
replay --verify`` must find the recorded history deterministic. A wrong cookie and a
socket sending garbage are refused with ERROR while a healthy connection streams on.
Every wait has a deadline. Also: the draft's NACK and migration, and the transport's
splitting of a byte stream by length prefixes.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.testing.processes import wait_for
from immortals.wallaroo import (
    DRAFT_VERSION,
    Ack,
    Dialect,
    Error,
    Frame,
    Hello,
    Message,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    encode,
    end_of_stream,
)
from immortals.wallaroo.codec import split_frames
from immortals.wallaroo.worker_client import request
from tests.wallaroo_process import (
    COOKIE,
    NOTHING_SEEN,
    ROOT,
    Closed,
    V3Client,
    WorkerProcess,
    released_stream_id,
    v3_eos,
    v3_hello,
    v3_message,
    v3_notify,
)
from tests.wallaroo_reader import FrameReader

DEADLINE = 120.0  # seconds for a whole exchange to finish


# --- the transport's splitting (no process needed) ----------------------------------------


@pytest.mark.parametrize("dialect", list(Dialect))
def test_split_frames_in_any_chunking(dialect: Dialect) -> None:
    frames = [Notify(1, "s"), Ok(3), Message(1, 2, b"p" * 50, event_time=0), Error("e")]
    if dialect is Dialect.DRAFT:
        frames[2] = Message(1, 2, b"p" * 50)
    wire = b"".join(encode(f, dialect) for f in frames)
    order = "little" if dialect is Dialect.DRAFT else "big"
    for step in (1, 3, 7, len(wire)):
        buf, got = bytearray(), []
        for at in range(0, len(wire), step):
            buf += wire[at : at + step]
            split, used, oversize = split_frames(buf, order, 1000)
            assert oversize is None
            got += split
            del buf[:used]
        assert buf == b"" and got == [encode(f, dialect)[4:] for f in frames]


def test_split_frames_refuses_a_length_over_the_limit() -> None:
    ok = encode(Ok(3), Dialect.V3)
    buf = bytearray(ok + struct.pack(">I", 65) + b"x" * 10)
    frames, used, oversize = split_frames(buf, "big", 64)
    assert frames == [ok[4:]] and used == len(ok) and oversize == (len(ok), 65)
    assert split_frames(bytearray(struct.pack(">I", 64)), "big", 64) == ([], 0, None)
    assert split_frames(bytearray(b"\x00\x00"), "big", 64) == ([], 0, None)


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(tmp_path / "data", "--max-credits", "100", "--refill-credits", "50")
    w.start()
    try:
        yield w
    finally:
        w.stop()


def text(lines: int, seed: int) -> list[bytes]:
    rng = random.Random(seed)
    words = [f"w{k}" for k in range(40)]
    return [" ".join(rng.choices(words, k=rng.randint(1, 9))).encode() for _ in range(lines)]


def stream_words(
    port: int,
    streams: dict[str, list[bytes]],
    after_send: Callable[[int], None] = lambda sent: None,
    resend: int = 0,
) -> dict[str, Any]:
    """Send every stream's lines (message id = line number, from 1), interleaved, then
    EOS each; reconnect and resume from NOTIFY_ACK's point whenever the connection
    goes. ``after_send(total sent)`` runs after each batch (a kill lands there);
    ``resend`` more messages at or below the point are sent again after a reconnect."""
    deadline = time.monotonic() + DEADLINE
    ids = {name: released_stream_id(name) for name in streams}
    done: set[str] = set()
    known: dict[int, int] = {}  # the last point an ACK gave, across connections
    sent = connections = 0
    while len(done) < len(streams):
        assert time.monotonic() < deadline, f"not finished: {done}"
        try:
            client = V3Client(port)
        except OSError:
            time.sleep(0.05)  # the worker is restarting: retry, bounded by the deadline
            continue
        connections += 1
        try:
            client.handshake()
            nxt = {}
            for name in streams:
                if name in done:
                    continue
                resume = client.notify(name, known.get(ids[name], NOTHING_SEEN))
                nxt[name] = 1 if resume == NOTHING_SEEN else resume + 1
                if connections > 1:
                    nxt[name] = max(1, nxt[name] - resend)
            while nxt:
                assert time.monotonic() < deadline, "not finished"
                client.wait_credits()
                batch = []
                for name in list(nxt):
                    lines, mid = streams[name], nxt[name]
                    if mid <= len(lines):
                        batch.append(v3_message(ids[name], mid, lines[mid - 1]))
                        nxt[name] += 1
                    else:
                        batch.append(v3_eos(ids[name]))
                        del nxt[name]
                    if len(batch) >= client.credits:
                        break
                client.credits -= len(batch)
                client.send(b"".join(batch))
                sent += len(batch)
                after_send(sent)
            while any(client.acked.get(ids[n]) != len(streams[n]) for n in streams):
                assert time.monotonic() < deadline, "final ACKs missing"
                client.next_event()
            done.update(streams)
        except (Closed, OSError):
            pass  # the worker went: reconnect and resume
        finally:
            known.update(client.acked)
            client.close()
    return {"connections": connections, "sent": sent}


def expected_counts(streams: dict[str, list[bytes]]) -> dict[str, int]:
    counts: Counter[str] = Counter()
    for lines in streams.values():
        for line in lines:
            counts.update(line.decode().split())
    return dict(counts)


# --- the tests --------------------------------------------------------------------------


def test_word_count_exactly_once_through_sigkills(worker: WorkerProcess) -> None:
    streams = {"alpha": text(2500, 1), "beta": text(2000, 2)}
    total = sum(len(lines) for lines in streams.values())
    plan = [(total // 5, "service"), (2 * total // 5, "coordinator"), (3 * total // 5, "both")]
    kills: list[str] = []

    def maybe_kill(sent: int) -> None:
        if plan and sent >= plan[0][0]:
            _, which = plan.pop(0)
            worker.kill(which)  # batches sent, their ACKs not yet read
            kills.append(which)
            worker.start()

    result = stream_words(worker.port, streams, maybe_kill, resend=3)
    print(f"connections {result['connections']}, frames sent {result['sent']}")
    assert kills == ["service", "coordinator", "both"]
    assert result["connections"] >= 4

    status = worker.status()
    assert status["app_state"]["messages"] == total
    assert status["app_state"]["counts"] == expected_counts(streams)
    for name, lines in streams.items():
        s = status["streams"][str(released_stream_id(name))]
        assert (s["name"], s["point"], s["state"], s["owner"]) == (name, len(lines), "closed", None)
    assert status["duplicates"] > 0  # the resends were dropped

    worker.stop()
    replay = subprocess.run(
        [
            *(sys.executable, "-m", "ambrosia_py.cli", "replay", "immortals.wallaroo.worker"),
            *("--instance", "worker", "--data-dir", str(worker.data_dir), "--verify"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    assert "deterministic" in replay.stdout


def test_a_restarted_worker_resumes_a_reopened_stream(worker: WorkerProcess) -> None:
    """After EOS and a restart, NOTIFY_ACK gives the stream's final point."""
    lines = text(50, 3)
    stream_words(worker.port, {"gamma": lines})
    worker.kill("both")
    worker.start()
    client = V3Client(worker.port)
    try:
        client.handshake()
        assert client.notify("gamma", NOTHING_SEEN) == 50
    finally:
        client.close()


def _refused(port: int, data: bytes) -> str:
    """Send ``data`` on a fresh connection; the ERROR's reason, once the worker closes."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    client = V3Client.__new__(V3Client)
    client.sock, client.buf, client.credits, client.acked, client.errors = sock, b"", 0, {}, []
    try:
        sock.sendall(data)
        with pytest.raises(Closed):
            while True:
                client.next_event()
        assert client.errors, "closed without an ERROR"
        assert sock.recv(1) == b""  # and closed after it
        return client.errors[0]
    finally:
        sock.close()


def test_bad_input_is_refused_while_a_healthy_connection_streams(worker: WorkerProcess) -> None:
    lines = text(1200, 4)
    healthy = V3Client(worker.port)
    try:
        healthy.handshake()
        sid = released_stream_id("delta")
        assert healthy.notify("delta", NOTHING_SEEN) == NOTHING_SEEN
        nxt = 1

        def send_some(n: int) -> None:
            nonlocal nxt
            for _ in range(n):
                healthy.wait_credits()
                healthy.send(v3_message(sid, nxt, lines[nxt - 1]))
                healthy.credits -= 1
                nxt += 1

        send_some(300)
        assert _refused(worker.port, v3_hello("wrong")) == "Bad cookie"
        send_some(300)
        reason = _refused(worker.port, b"\x00\x00\x00\x05\xffjunk")
        assert reason == "v3 Frame.tag at offset 4: unknown tag 0xff"
        reason = _refused(worker.port, v3_hello(COOKIE) + b"\x7f\xff\xff\xff")  # 2 GiB
        assert "Frame.length" in reason and "over the limit of 4194304" in reason
        reason = _refused(worker.port, v3_hello(COOKIE) + v3_message(99, 1, b"x"))
        assert "stream 99 is not open on this connection: never notified" in reason
        reason = _refused(worker.port, v3_hello(COOKIE) + v3_hello(COOKIE))
        assert "received HELLO in connection state STREAMING" in reason
        send_some(len(lines) - 600)
        healthy.wait_credits()
        healthy.send(v3_eos(sid))
        deadline = time.monotonic() + DEADLINE
        while healthy.acked.get(sid) != len(lines):
            assert time.monotonic() < deadline
            healthy.next_event()
    finally:
        healthy.close()
    status = worker.status()
    assert status["app_state"]["messages"] == len(lines)
    assert status["app_state"]["counts"] == expected_counts({"delta": lines})
    assert status["duplicates"] == 0


def test_a_connector_ignoring_credits_is_refused(worker: WorkerProcess) -> None:
    """Thousands of frames sent at once on 100 credits: refused before the last."""
    sid = released_stream_id("epsilon")
    flood = b"".join(v3_message(sid, i, b"w") for i in range(1, 5001))
    reason = _refused(worker.port, v3_hello(COOKIE) + v3_notify(sid, "epsilon", 0) + flood)
    assert "no credits left" in reason
    status = worker.status()
    assert 99 <= status["app_state"]["messages"] < 5000


def test_operators_move_connectors_with_restart(worker: WorkerProcess) -> None:
    client = V3Client(worker.port)
    try:
        client.handshake()
        sid = released_stream_id("zeta")
        client.notify("zeta", NOTHING_SEEN)
        client.send(b"".join(v3_message(sid, i, b"z") for i in range(1, 6)))
        client.credits -= 5
        deadline = time.monotonic() + DEADLINE
        while client.acked.get(sid) != 5:
            assert time.monotonic() < deadline
            client.next_event()
        # The other worker: in the same data dir, so the two find each other by name.
        peer = WorkerProcess(worker.data_dir, dialect="v3", instance="peer")
        peer.start()
        try:
            move = {"op": "move", "target": peer.address, "instance": "peer"}
            answer = request(worker.control, COOKIE, move)
            assert answer == {"ok": True, "streams": 1, "to": "peer"}
            frames = []
            with contextlib.suppress(Closed):
                while True:
                    frames.append(client.read_frame())
            # The final points, then RESTART naming the other worker, then the close.
            where = peer.address.encode()
            assert frames[-1] == (7, struct.pack(">I", len(where)) + where)
            assert client.sock.recv(1) == b""
            # The stream's point went there: a connector resumes after it.
            wait_for(
                "the stream at the other worker",
                lambda: peer.status()["streams"].get(str(sid), {}).get("point") == 5,
                DEADLINE,
            )
        finally:
            peer.stop()
    finally:
        client.close()
    answer = request(worker.control, COOKIE, {"op": "nack", "stream": "zeta", "point": 2})
    assert answer == {"ok": False, "error": f"stream {sid} moved to peer"}
    answer = request(worker.control, "wrong", {"op": "status"})
    assert answer == {"ok": False, "error": "Bad cookie"}
    answer = request(worker.control, COOKIE, {"op": "nack", "stream": "zeta", "point": "x"})
    assert answer["ok"] is False and answer["error"].startswith("bad nack request")
    answer = request(worker.control, COOKIE, {"op": "move", "target": "nowhere"})
    assert answer == {"ok": False, "error": "'nowhere' is not HOST:PORT"}
    status = worker.status()
    assert status["streams"][str(released_stream_id("zeta"))]["point"] == 5
    assert status["connections"] == {} and status["move"]["done"]
    ctl = [sys.executable, "-m", "immortals.wallaroo.worker_client", "--control", worker.control]
    shown = subprocess.run(
        [*ctl, "--cookie", COOKIE, "status"], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0 and '"name": "zeta"' in shown.stdout, shown.stderr
    refused = subprocess.run(
        [*ctl, "--cookie", COOKIE, "nack", "nosuch", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 1 and "no stream named 'nosuch'" in refused.stdout


# --- the draft dialect: NACK and the addendum's migration -------------------------------


class DraftClient:
    """A draft connection written with our codec (interoperability is v3's business)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.reader = FrameReader(Dialect.DRAFT)

    def send(self, *frames: Frame) -> None:
        self.sock.sendall(b"".join(encode(f, Dialect.DRAFT) for f in frames))

    def expect(self, cls: type[Any]) -> Any:
        """The next frame of class ``cls``, skipping ACKs (Closed if the worker closes)."""
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            frame = self.reader.next_frame()
            if frame is None:
                data = self.sock.recv(65536)
                if not data:
                    raise Closed("connection closed")
                self.reader.feed(data)
            elif isinstance(frame, cls):
                return frame
            elif not isinstance(frame, Ack):
                raise AssertionError(f"expected {cls.__name__}, got {frame!r}")
        raise AssertionError(f"no {cls.__name__} before the deadline")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def draft_worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    w = WorkerProcess(tmp_path / "data", dialect="draft")
    w.start()
    try:
        yield w
    finally:
        w.stop()


def test_draft_nack_and_migration(draft_worker: WorkerProcess) -> None:
    worker = draft_worker
    client = DraftClient(worker.port)
    try:
        client.send(Hello(DRAFT_VERSION, COOKIE.encode(), "e2e", "draft"))
        assert client.expect(Ok) == Ok(1000)
        sid = released_stream_id("eta")
        client.send(Notify(sid, "eta", 0))
        assert client.expect(NotifyAck) == NotifyAck(True, sid, NOTHING_SEEN)
        client.send(*[Message(sid, i, b"w%d" % i) for i in range(1, 11)])
        while client.expect(Ack).acks != ((sid, 10),):
            pass
        # The operator rewinds the stream: NACK, then a NOTIFY resumes after its point.
        answer = request(worker.control, COOKIE, {"op": "nack", "stream": "eta", "point": 7})
        assert answer["ok"], answer
        assert client.expect(Nack) == Nack(11, sid, 7)  # the 11 frames spent
        client.send(Notify(sid, "eta", 7))  # the NACK's point (seed 000)
        assert client.expect(NotifyAck) == NotifyAck(True, sid, 7)
        client.send(*[Message(sid, i, b"w%d" % i) for i in range(8, 13)])
        while client.expect(Ack).acks != ((sid, 12),):
            pass
        # Seed 001: MIGRATE; the connector ends its streams, the worker ACKs them, then
        # MIGRATION_ACK and the worker closes the old connection.
        # The ACK of the EOS comes once the other worker holds the stream (step 6).
        peer = WorkerProcess(worker.data_dir, dialect="draft", instance="peer")
        peer.start()
        try:
            move = {"op": "move", "target": peer.address, "instance": "peer"}
            answer = request(worker.control, COOKIE, move)
            assert answer == {"ok": True, "streams": 1, "to": "peer"}
            assert client.expect(Migrate) == Migrate("127.0.0.1", peer.port)
            client.send(end_of_stream(Dialect.DRAFT, sid, 13))
            while client.expect(Ack).acks != ((sid, 13),):
                pass
            held = peer.status()["streams"][str(sid)]
            assert (held["point"], held["state"]) == (13, "closed")
            client.send(MigrationAck())
            with pytest.raises(Closed):
                client.expect(Error)
            status = worker.status()
            assert status["connections"] == {}
            eta = {"name": "eta", "owner": None, "state": "closed", "point": 13}
            assert status["streams"][str(sid)] == eta
            assert status["app_state"]["messages"] == 15  # 1..10, 8..12 again (the NACK)
            # A connector that comes back is sent on in its handshake (seed 001, Notes);
            # the new worker's OK lists the stream's point (seed 000, C1).
            back = DraftClient(worker.port)
            try:
                back.send(Hello(DRAFT_VERSION, COOKIE.encode(), "e2e", "draft"))
                assert back.expect(Migrate) == Migrate("127.0.0.1", peer.port)
            finally:
                back.close()
            there = DraftClient(peer.port)
            try:
                there.send(Hello(DRAFT_VERSION, COOKIE.encode(), "e2e", "draft"))
                assert there.expect(Ok) == Ok(1000, ((sid, 13),))
            finally:
                there.close()
        finally:
            peer.stop()
    finally:
        client.close()
