"""Seed 000's and seed 001's rules on the worker's side, one test each, against bytes
laid out by hand (``tests/wallaroo_seed_bytes.py``), never by our encoder, so a test fails
where our codec and the seed disagree. Bytes for the worker go through the edge's
splitter (``split_frames``), so the u32 length prefix is checked too. The table in
``docs/protocols.md`` (*Seeds 000 and 001*) names the seed line each test checks."""

from __future__ import annotations

import struct
from typing import Any

from immortals.wallaroo import Dialect
from immortals.wallaroo.codec import split_frames
from immortals.wallaroo.worker_core import WorkerConfig, WorkerCore
from tests.wallaroo_seed_bytes import (
    DRAFT,
    EOS,
    EPHEMERAL,
    EVENT_TIME,
    MIGRATION_ACK,
    NOTHING_SEEN,
    UNSTABLE,
    VERSION,
    ack,
    boundary,
    error,
    frame,
    hello,
    message,
    migrate,
    nack,
    notify,
    notify_ack,
    ok,
    reason_of,
    short,
    split,
)

# --- the worker's core, fed bytes as its edge splits them ------------------------------------


class Worker:
    def __init__(self, **config: Any) -> None:
        defaults: dict[str, Any] = {"cookie": b"c", "max_credits": 10, "refill_credits": 5}
        config = defaults | config
        self.config = WorkerConfig(dialect=DRAFT, app="tests.wallaroo_apps:record", **config)
        self.core = WorkerCore()
        self.core.start("i1", self.config)
        self.closed: set[str] = set()
        self.n = 0

    def open(self, greet: bool = True) -> str:
        self.n += 1
        conn = f"i1.{self.n}"
        self.core.opened(conn, f"127.0.0.1:{self.n}")
        if greet:
            assert self.send(conn, hello()) == [ok(10)]
        return conn

    def send(self, conn: str, *wire: bytes) -> list[bytes]:
        """The frames the worker writes back for one read of ``wire``."""
        buf = bytearray(b"".join(wire))
        frames, used, oversize = split_frames(buf, "little", self.config.max_frame_bytes)
        assert used == len(buf) and oversize is None
        return self.replies(self.core.frames(conn, frames))

    def replies(self, replies: Any) -> list[bytes]:
        out = []
        for s in replies.sends:
            out += split(s.wire)
            if s.close:
                self.closed.add(s.conn)
        return out

    @property
    def payloads(self) -> list[bytes]:
        return list(self.core.app_state.get("payloads", []))


# --- seed 000, *Handshake* -------------------------------------------------------------------


def test_hello_is_answered_with_ok_and_the_initial_credits() -> None:
    """*Handshake*: "the worker should send either an ok frame or an error frame"; OK
    carries the initial credit count (u32) and the points of reference (none yet)."""
    w = Worker(max_credits=300, refill_credits=5)
    conn = w.open(greet=False)
    assert w.send(conn, hello()) == [ok(300)]
    assert conn not in w.closed


def test_ok_lists_each_streams_point_of_reference() -> None:
    """C1: OK's (stream id, point of reference) pairs, in the remaining bytes."""
    w = Worker()
    a = w.open()
    w.send(a, notify(7, b"s"), message(7, 41, b"x"), boundary(7, 42, EOS))
    w.send(a, notify(8, b"t"))  # nothing seen on it: no point to list
    b = w.open(greet=False)
    assert w.send(b, hello()) == [ok(10, (7, 42))]


def test_a_version_that_is_not_exactly_ours_is_refused() -> None:
    """A1: "Exact matching will be enforced": ERROR with a short reason, then a close."""
    w = Worker()
    conn = w.open(greet=False)
    other = (int.from_bytes(VERSION, "little") + 1).to_bytes(16, "little")
    (reply,) = w.send(conn, hello(version=other))
    assert reason_of(reply).startswith("Unknown protocol version: 0x")
    assert conn in w.closed


def test_a_wrong_cookie_is_refused_and_an_empty_one_must_meet_an_empty_one() -> None:
    """A2 and C0: "Both sides are required to set this to an empty value. If the worker
    does not expect a cookie but the connector gives one ... fail loudly"."""
    w = Worker()
    conn = w.open(greet=False)
    assert w.send(conn, hello(b"wrong")) == [error(b"Bad cookie")] and conn in w.closed
    w = Worker(cookie=b"")
    assert w.send(w.open(greet=False), hello(b"")) == [ok(10)]
    assert w.send(w.open(greet=False), hello(b"x")) == [error(b"Bad cookie")]
    w = Worker(cookie=b"c")
    assert w.send(w.open(greet=False), hello(b"")) == [error(b"Bad cookie")]


def test_a_hello_with_a_wrong_version_is_refused_whatever_follows_it() -> None:
    """*Wire Format*: the worker "should be careful to check the version and cookie value
    placed in fixed locations at the start before continuing the decoding", so that a
    future framing is refused, not misread. A HELLO of another version whose later
    fields do not decode as ours is refused with ERROR and closed (its reason names the
    decoding, not the version: see the table)."""
    w = Worker()
    other = (int.from_bytes(VERSION, "little") + 1).to_bytes(16, "little")
    future = frame(b"H" + other + short(b"c") + short(b"p") + short(b"i") + b"more")
    conn = w.open(greet=False)
    (reply,) = w.send(conn, future)
    assert reason_of(reply) and conn in w.closed


def test_the_connection_state_machine_on_the_worker() -> None:
    """*Protocol State Machine*: CONNECTED admits HELLO (or ERROR) only, HANDSHAKE no
    second HELLO, and a worker never receives what only a worker sends (OK)."""
    w = Worker()
    first = w.open(greet=False)
    (reply,) = w.send(first, notify(1, b"s"))
    assert "received NOTIFY in connection state CONNECTED" in reason_of(reply)
    assert first in w.closed
    again = w.open()
    (reply,) = w.send(again, hello())
    assert "received HELLO in connection state STREAMING" in reason_of(reply)
    third = w.open()
    (reply,) = w.send(third, ok(5))
    assert "received OK in connection state STREAMING" in reason_of(reply)


# --- seed 000, *Overview* and *Streaming*: credits, NOTIFY, MESSAGE ---------------------------


def test_every_frame_costs_a_credit_notify_included() -> None:
    """*Overview*: "Stream notifications do consume one credit", messages flow "so long
    as the credit count remains above zero", and ACKs replenish them; *Acks and Nacks*:
    "all frames take one credit". A frame with no credit left is an ERROR, after an ACK
    of what the read moved."""
    w = Worker(max_credits=3, refill_credits=1)
    conn = w.open(greet=False)
    assert w.send(conn, hello()) == [ok(3)]
    assert w.send(conn, notify(1, b"s")) == [notify_ack(True, 1, NOTHING_SEEN)]  # 2 left
    assert w.send(conn, message(1, 1, b"a")) == [ack(2, (1, 1))]  # 1 left: topped up to 3
    reply = w.send(conn, *(message(1, i, b"b") for i in (2, 3, 4, 5)))
    assert reply[0] == ack(0, (1, 4))  # three taken, the fourth had no credit
    assert reason_of(reply[1]).endswith("no credits left") and conn in w.closed
    assert w.payloads == [b"a", b"b", b"b", b"b"]


def test_a_message_for_a_stream_never_notified_is_an_error_and_a_close() -> None:
    """*Streaming*: "Sending a message with a stream id that has not been properly
    described using a notification is an error and Wallaroo should signal such and close
    the connection"."""
    w = Worker()
    conn = w.open()
    (reply,) = w.send(conn, message(9, 1, b"x"))
    assert "stream 9 is not open on this connection: never notified" in reason_of(reply)
    assert conn in w.closed and w.payloads == []


def test_a_stream_id_used_for_two_names_is_not_an_error() -> None:
    """*Streaming*: "The generation of an id should be unique. Failure to do so is not
    an error"."""
    w = Worker()
    conn = w.open()
    assert w.send(conn, notify(1, b"a"), message(1, 1, b"x")) == [
        notify_ack(True, 1, NOTHING_SEEN),
        ack(0, (1, 1)),
    ]
    assert w.send(conn, notify(1, b"b", 1), message(1, 2, b"y")) == [
        notify_ack(True, 1, 1),
        ack(0, (1, 2)),
    ]
    assert w.payloads == [b"x", b"y"] and conn not in w.closed
    assert w.core.status()["streams"]["1"]["name"] == "b"  # "keep note of these mappings"


def test_eos_closes_a_stream_and_only_a_notify_reopens_it() -> None:
    """A6, *Streaming* ("Messages sent for a closed stream should require a notification
    to set that stream back to an open state"), D0 (a boundary flagged EOS ends a stream
    with no message left), *End of Stream* (the worker treats the end "strictly"). A
    MESSAGE flagged EOS with a payload is applied, then the stream closes."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), message(1, 1, b"a"))
    assert w.send(conn, boundary(1, 2, EOS)) == [ack(0, (1, 2))]
    assert w.send(conn, notify(1, b"s", 2)) == [notify_ack(True, 1, 2)]
    assert w.send(conn, message(1, 3, b"c"), message(1, 4, b"d", EOS)) == [ack(6, (1, 4))]
    (reply,) = w.send(conn, message(1, 5, b"e"))
    assert "closed by EOS; a NOTIFY reopens it" in reason_of(reply) and conn in w.closed
    assert w.payloads == [b"a", b"c", b"d"]


def test_a_boundary_is_a_point_of_reference_unless_unstable() -> None:
    """*Streaming*: boundaries "carry no message payload" and "still require a message id
    which may be used as a point of reference ... if the UNSTABLE_REFERENCE flag is set
    to 0"."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"))
    assert w.send(conn, boundary(1, 3)) == [ack(0, (1, 3))]
    assert w.send(conn, boundary(1, 9, UNSTABLE)) == []  # no point moved: nothing to ACK
    assert w.payloads == [] and w.core.applied == 0
    assert w.core.status()["streams"]["1"]["point"] == 3


def test_an_event_time_is_read_and_the_payload_is_what_follows_it() -> None:
    """*Streaming* and D1: an optional event time (u64, flag EVENT_TIME) before the
    payload; the worker "may not make use of this at the moment"."""
    w = Worker()
    conn = w.open()
    timed = frame(b"M" + struct.pack("<QHQQ", 1, EVENT_TIME, 1, 1_600_000_000) + b"p")
    assert w.send(conn, notify(1, b"s"), timed) == [
        notify_ack(True, 1, NOTHING_SEEN),
        ack(0, (1, 1)),
    ]
    assert w.payloads == [b"p"]


def test_ephemeral_and_unstable_messages_carry_no_identity() -> None:
    """*Ephemeral Messaging*: the id "should not be treated as a unique identifier";
    *Points of Reference*: an unreferenced message is no point to resume from. Both are
    applied as they come and move no point (so no ACK names them)."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), message(1, 5, b"x"))
    assert w.send(conn, message(1, 1, b"e", EPHEMERAL), message(1, 1, b"e", EPHEMERAL)) == []
    assert w.send(conn, message(1, 2, b"u", UNSTABLE)) == [ack(5)]  # a refill only
    assert w.payloads == [b"x", b"e", b"e", b"u"]
    assert w.core.status()["streams"]["1"]["point"] == 5


def test_an_ack_names_the_last_message_of_each_stream_in_a_read() -> None:
    """*Acks and Nacks*: ACKs "provide a list of message ids for each stream"; its NOTE:
    "it may be enough to ... ack only the last transmitted in the set for each stream".
    The ACK's layout: u32 credits, then (u64 stream id, u64 message id) to the end."""
    w = Worker(max_credits=20)
    conn = w.open(greet=False)
    assert w.send(conn, hello()) == [ok(20)]
    w.send(conn, notify(1, b"s"), notify(2, b"t"))
    wire = [message(1, 1, b"a"), message(2, 7, b"b"), message(1, 2, b"c")]
    assert w.send(conn, *wire) == [ack(0, (1, 2), (2, 7))]


def test_messages_behind_a_refused_notify_are_ignored() -> None:
    """*Overview*: "Once a stream notification has been sent, the open stream can have any
    number of messages", so a connector of seed 000 sends right behind its NOTIFY. When
    our worker refuses the NOTIFY (another connection holds the stream), what followed
    it is ignored, not an error; once a NOTIFY is accepted, its messages count."""
    w = Worker()
    a, b = w.open(), w.open()
    w.send(a, notify(1, b"s"), message(1, 5, b"a"))
    wire = [notify(1, b"s", 5), message(1, 6, b"b"), boundary(1, 6, EOS)]
    assert w.send(b, *wire) == [notify_ack(False, 1, 5)]
    assert b not in w.closed and w.payloads == [b"a"]
    w.core.closed(a)
    assert w.send(b, notify(1, b"s", 5), message(1, 6, b"b")) == [
        notify_ack(True, 1, 5),
        ack(5, (1, 6)),
    ]
    assert w.payloads == [b"a", b"b"]


# --- seed 000, *Acks and Nacks* and *Stream State Machine* ------------------------------------


def test_a_nack_resets_a_stream_until_the_notify_at_its_point() -> None:
    """*Acks and Nacks*: a NACK gives credits, not progress; "all message frames [are]
    ignored for that stream until a new notify message ... with a specific point of
    reference to continue from". The NACK's layout: u32 credits, u64 stream, u64 point."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), *(message(1, i, b"%d" % i) for i in (1, 2, 3)))
    assert w.replies(w.core.nack(1, 2)) == [nack(4, 1, 2)]  # the 4 frames spent
    assert w.send(conn, message(1, 4, b"4")) == []  # ignored
    assert w.send(conn, notify(1, b"s", 2)) == [notify_ack(True, 1, 2)]
    assert w.send(conn, message(1, 3, b"3")) == [ack(0, (1, 3))]
    assert w.payloads == [b"1", b"2", b"3", b"3"]


def test_a_nack_to_no_point_carries_zero() -> None:
    """``nack(Credits, StreamId, undefined)`` writes ``point_of_reference(0)``."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), message(1, 1, b"x"))
    assert w.replies(w.core.nack(1, None)) == [nack(2, 1, 0)]
    assert w.send(conn, notify(1, b"s", 0)) == [notify_ack(True, 1, NOTHING_SEEN)]


def test_nacks_stack_and_each_needs_its_notify() -> None:
    """*Stream State Machine*: NACKs "MUST be treated as if there was a stack of NACKs.
    Each NACK will require a NOTIFY"."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), *(message(1, i, b"%d" % i) for i in (1, 2, 3)))
    w.replies(w.core.nack(1, 2))
    w.replies(w.core.nack(1, 1))
    assert w.send(conn, notify(1, b"s", 2)) == [notify_ack(True, 1, 1)]
    assert w.send(conn, message(1, 2, b"2")) == []  # one NACK left on the stack: ignored
    assert w.send(conn, notify(1, b"s", 1)) == [notify_ack(True, 1, 1)]
    assert w.send(conn, message(1, 2, b"2")) == [ack(0, (1, 2))]
    assert w.payloads == [b"1", b"2", b"3", b"2"]


def test_an_error_from_the_connector_closes_and_what_follows_is_discarded() -> None:
    """*Handshake*: a connector that cannot continue "should send an error frame so the
    problem may be logged within Wallaroo"; *Protocol State Machine*: "Any data received
    after the error frame should be discarded"."""
    w = Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"))
    assert w.send(conn, error(b"cannot resume"), message(1, 1, b"x")) == []
    assert conn in w.closed and w.payloads == []
    assert w.send(conn, message(1, 2, b"y")) == [] and w.payloads == []


def test_what_follows_a_bad_frame_is_discarded() -> None:
    """*Protocol State Machine*: an ERROR ends the connection; nothing after it counts."""
    w = Worker()
    conn = w.open()
    reply = w.send(conn, frame(b"\x63junk"), notify(1, b"s"))
    assert len(reply) == 1 and "unknown tag 0x63" in reason_of(reply[0])
    assert conn in w.closed and w.core.status()["streams"] == {}


def test_a_length_over_the_limit_is_refused() -> None:
    """B1: "The length needs to have a max size set in Wallaroo ... a few megabytes with
    a configuration option"; the edge refuses it at its four bytes."""
    w = Worker(max_frame_bytes=64)
    conn = w.open()
    buf = bytearray(message(1, 1, b"y" * 100))
    frames, used, oversize = split_frames(buf, "little", 64)
    assert (frames, used, oversize) == ([], 0, (0, 119))
    (reply,) = w.replies(w.core.too_large(conn, len(hello()), 119))  # as the edge reports
    assert "frame of 119 bytes over the limit of 64" in reason_of(reply) and conn in w.closed


# --- seed 001: the worker's side of a migration ---------------------------------------------


def test_a_worker_migrates_its_connector_in_the_addendums_order() -> None:
    """Seed 001, *Migration Protocol*: MIGRATE (step 1, tag 8: u32 host length, host,
    u16 port); the connector's EOS; the stream's state to the new worker (steps 4-5),
    then its ACK (step 6); MIGRATION_ACK (tag 9) and the old worker closes (step 10). A
    NOTIFY met on the way is refused; a connector that says HELLO to the old worker later
    is sent on with MIGRATE in the handshake (*Notes*, and MIGRATE in HANDSHAKE)."""
    w, new = Worker(), Worker()
    conn = w.open()
    w.send(conn, notify(1, b"s"), message(1, 1, b"a"))
    w.core.begin_move("10.0.0.2", 7200, "b")
    new.core.expect("a", [1])
    assert w.replies(w.core.expecting()) == [migrate(b"10.0.0.2", 7200)]
    replies = w.core.frames(conn, [boundary(1, 2, EOS)[4:], notify(2, b"t")[4:]])
    assert w.replies(replies) == [notify_ack(False, 2, NOTHING_SEEN)]  # no ACK of (1, 2) yet
    ((peer, method, (batch, streams)),) = [(c.peer, c.method, c.args) for c in replies.calls]
    assert (peer, method, streams) == ("b", "adopt", [(1, "s", 2, True)])
    new.core.adopt("a", batch, streams)
    assert w.replies(w.core.adopted(batch)) == [ack(0, (1, 2))]  # step 6, once handed
    assert w.send(conn, MIGRATION_ACK) == [] and conn in w.closed  # step 10
    late = w.open(greet=False)
    assert w.send(late, hello()) == [migrate(b"10.0.0.2", 7200)]
    there = new.open(greet=False)  # step 11: the stream resumes where it was handed
    assert new.send(there, hello()) == [ok(10, (1, 2))]
    assert new.send(there, notify(1, b"s", 2)) == [notify_ack(True, 1, 2)]


def test_v3_a_moved_worker_answers_hello_with_ok_then_restart() -> None:
    """The reference's way to move a connector (RESTART "host:port", then a close), which
    v3 has only while streaming: a connector saying HELLO to a worker that moved gets OK,
    then RESTART. Bytes of the reference's v3: big-endian, tags 0 HELLO, 1 OK, 7 RESTART."""
    core = WorkerCore()
    core.start(
        "i1", WorkerConfig(cookie=b"c", dialect=Dialect.V3, max_credits=10, refill_credits=5)
    )
    core.begin_move("10.0.0.2", 7200, "b")
    core.expecting()
    core.opened("i1.1", "127.0.0.1:1")
    big = struct.pack(">H", 5) + b"0.0.1" + struct.pack(">H", 1) + b"c"
    v3_hello = b"\x00" + big + struct.pack(">H", 1) + b"p" + struct.pack(">H", 1) + b"i"
    (send,) = core.frames("i1.1", [v3_hello]).sends
    where = b"10.0.0.2:7200"
    restart = struct.pack(">IBI", 5 + len(where), 7, len(where)) + where
    assert send.wire == struct.pack(">IBI", 5, 1, 10) + restart and send.close
