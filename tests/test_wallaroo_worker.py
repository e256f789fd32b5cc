"""The worker's sans-IO core, frame by frame, in both dialects.

Each test drives :class:`WorkerCore` as the immortal does (connection events and the
frames of one read in, the frames to write out) and reads the replies back with the
codec. The rules are the seed's and the reference's (see ``worker_core``'s docstring).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest

from immortals.wallaroo import (
    DRAFT_VERSION,
    NOTHING_SEEN,
    Ack,
    Dialect,
    EosMessage,
    Error,
    Hello,
    Message,
    MessageFlags,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    encode,
)
from immortals.wallaroo.worker_core import (
    NoCreditsError,
    Replies,
    StreamNotOpenError,
    WorkerConfig,
    WorkerCore,
    load_app,
)
from tests.wallaroo_harness import APP, Worker, eos, hello, msg, only_error

DIALECTS = [Dialect.DRAFT, Dialect.V3]


@pytest.fixture(params=DIALECTS, ids=lambda d: d.value)
def dialect(request: pytest.FixtureRequest) -> Iterator[Dialect]:
    yield request.param


def test_public_names_are_exported() -> None:
    import immortals.wallaroo as wallaroo

    names = {"WallarooWorker", "WorkerConfig", "WorkerCore", "NoCreditsError"}
    names.add("StreamNotOpenError")
    assert names <= set(wallaroo.__all__)
    assert wallaroo.WorkerCore is WorkerCore and wallaroo.NoCreditsError is NoCreditsError


# --- handshake --------------------------------------------------------------------------


def test_handshake(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect(handshake=False)
    assert c.send(hello(dialect)) == [Ok(10)]
    assert c.credits == 10 and not c.closed
    assert w.core.connections[c.name].name == "prog/inst"


def test_a_wrong_cookie_is_refused_and_others_keep_streaming(dialect: Dialect) -> None:
    w = Worker(dialect)
    good = w.connect()
    assert good.send(Notify(1, "s"))[0] == NotifyAck(True, 1, NOTHING_SEEN)
    bad = w.connect(handshake=False)
    assert bad.send(hello(dialect, b"wrong")) == [Error("Bad cookie")]
    assert bad.closed and bad.name not in w.core.connections
    assert good.send(msg(dialect, 1, 1)) == [Ack(0, ((1, 1),))]
    assert bad.send(Notify(2, "t")) == []  # after ERROR: discarded
    assert w.payloads == [b"x"]


def test_a_wrong_version_is_refused(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect(handshake=False)
    other = "0.0.2" if dialect is Dialect.V3 else DRAFT_VERSION + 1
    reply = c.send(Hello(other, b"secret", "p", "i"))
    shown = "0.0.2" if dialect is Dialect.V3 else hex(DRAFT_VERSION + 1)
    assert reply == [Error(f"Unknown protocol version: {shown}")] and c.closed


def test_a_connector_of_the_other_dialect_is_refused() -> None:
    w = Worker(Dialect.V3)
    c = w.connect(handshake=False)
    raw = encode(hello(Dialect.DRAFT), Dialect.DRAFT)[4:]  # tag "H": no v3 tag
    assert only_error(c.send_raw([raw])) == "v3 Frame.tag at offset 4: unknown tag 0x48"
    w = Worker(Dialect.DRAFT)
    c = w.connect(handshake=False)
    raw = encode(hello(Dialect.V3), Dialect.V3)[4:]  # tag 0: no draft tag
    assert only_error(c.send_raw([raw])) == "draft Frame.tag at offset 4: unknown tag 0x00"


def test_an_empty_cookie_must_be_empty(dialect: Dialect) -> None:
    w = Worker(dialect, cookie=b"")
    assert w.connect(handshake=False).send(hello(dialect, b"")) == [Ok(10)]
    assert w.connect(handshake=False).send(hello(dialect, b"x")) == [Error("Bad cookie")]


def test_a_second_hello_is_an_error(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    reason = only_error(c.send(hello(dialect)))
    assert reason.startswith("the worker received HELLO in connection state STREAMING")
    assert "frame at stream offset" in reason and c.closed


def test_frames_before_hello_and_frames_only_a_worker_sends(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect(handshake=False)
    assert "received NOTIFY in connection state CONNECTED" in only_error(c.send(Notify(1, "s")))
    c = w.connect()
    reason = only_error(c.send(Ok(5)))
    assert "received OK in connection state STREAMING: OK goes worker -> connector" in reason


def test_the_draft_ok_lists_points_of_reference() -> None:
    w = Worker(Dialect.DRAFT)
    c = w.connect()
    c.send(Notify(7, "s"), msg(Dialect.DRAFT, 7, 41), eos(Dialect.DRAFT, 7, 42))
    c.send(Notify(8, "t"))  # nothing seen yet: no point to list
    assert w.connect(handshake=False).send(hello(Dialect.DRAFT)) == [Ok(10, ((7, 42),))]


# --- credits ----------------------------------------------------------------------------


def test_every_frame_costs_a_credit_and_refills_top_up(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    assert c.send(Notify(1, "s")) == [NotifyAck(True, 1, NOTHING_SEEN)]
    assert c.credits == 9
    assert c.send(msg(dialect, 1, 1), msg(dialect, 1, 2)) == [Ack(0, ((1, 2),))]
    assert c.credits == 7
    # Down to the refill level (5): topped up to 10, with the points moved.
    assert c.send(msg(dialect, 1, 3), msg(dialect, 1, 4)) == [Ack(5, ((1, 4),))]
    assert c.credits == 10


def test_a_refill_comes_even_when_nothing_moved() -> None:
    d = Dialect.V3
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), *[msg(d, 1, i) for i in range(1, 4)])
    assert c.credits == 6
    # Duplicates move no point, yet the credits they cost come back at the refill level.
    assert c.send(msg(d, 1, 1)) == [Ack(5, ())]


def test_a_frame_with_no_credits_left_is_an_error(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    frames = [Notify(1, "s"), *[msg(dialect, 1, i) for i in range(1, 11)]]  # 11 frames
    reply = c.send(*frames)
    # What the read moved before the bad frame is acknowledged first.
    assert reply[:-1] == [NotifyAck(True, 1, NOTHING_SEEN), Ack(0, ((1, 9),))]
    assert "no credits left" in only_error(reply) and c.closed
    assert len(w.payloads) == 9  # the tenth message was not applied
    assert w.stream(1).owner is None


def test_no_credits_error_fields() -> None:
    err = NoCreditsError("v3", "Message", 40)
    assert str(err) == "v3 Message at offset 40: no credits left"
    assert pickle.loads(pickle.dumps(err)).offset == 40


# --- notify and ownership ---------------------------------------------------------------


def test_one_owner_per_stream(dialect: Dialect) -> None:
    w = Worker(dialect)
    a, b = w.connect(), w.connect()
    assert a.send(Notify(1, "s")) == [NotifyAck(True, 1, NOTHING_SEEN)]
    assert a.send(msg(dialect, 1, 5)) == [Ack(0, ((1, 5),))]
    assert b.send(Notify(1, "s")) == [NotifyAck(False, 1, 5)]  # open elsewhere
    if dialect is Dialect.V3:  # the released connector waits for NOTIFY_ACK: no excuse
        reason = only_error(b.send(msg(dialect, 1, 6)))
        assert "stream 1 is not open on this connection: open on another connection" in reason
    else:  # sent before the refusal came (test_draft_messages_of_a_refused_notify_...)
        assert b.send(msg(dialect, 1, 6)) == [] and w.stream(1).point == 5
    # Released by EOS, the stream resumes after its last point on any connection.
    b = w.connect()
    assert a.send(eos(dialect, 1, 6))[-1] == Ack(0, ((1, 6 if dialect is Dialect.DRAFT else 5),))
    point = w.stream(1).point
    assert b.send(Notify(1, "s", point)) == [NotifyAck(True, 1, point)]


def test_a_lost_connection_releases_its_streams(dialect: Dialect) -> None:
    w = Worker(dialect)
    a = w.connect()
    a.send(Notify(1, "s"), msg(dialect, 1, 1), msg(dialect, 1, 2))
    w.core.closed(a.name)
    b = w.connect()
    assert b.send(Notify(1, "s", 2)) == [NotifyAck(True, 1, 2)]
    if dialect is Dialect.V3:  # the released worker drops the resent 2
        assert b.send(msg(dialect, 1, 2), msg(dialect, 1, 3)) == [Ack(0, ((1, 3),))]
        assert w.core.duplicates == 1
    else:  # the draft resumes where its NOTIFY said, and takes what follows
        assert b.send(msg(dialect, 1, 3)) == [Ack(0, ((1, 3),))]
    assert len(w.payloads) == 3


def test_a_new_incarnation_drops_every_connection(dialect: Dialect) -> None:
    w = Worker(dialect)
    a = w.connect()
    a.send(Notify(1, "s"), msg(dialect, 1, 1))
    replies = w.core.start("i2", w.core.config)
    assert replies.problems == ("the last incarnation's connections dropped: 1",)
    assert w.core.connections == {} and w.stream(1).owner is None
    assert a.send(msg(dialect, 1, 2)) == []  # a frame of the old incarnation: discarded


def test_a_reintroduction_by_the_owner(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 3))
    assert c.send(Notify(1, "s", 3)) == [NotifyAck(True, 1, 3)]  # seed 000: always open after


def test_a_renamed_stream_is_reported(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"))
    c.send(Notify(1, "t"))
    assert w.stream(1).name == "t" and "renamed from 's' to 't'" in w.problems[-1]


def test_adopt_points_for_a_stream_never_seen(dialect: Dialect) -> None:
    w = Worker(dialect, adopt_points=True)
    c = w.connect()
    assert c.send(Notify(1, "s", 40)) == [NotifyAck(True, 1, 40)]
    nothing = 0 if dialect is Dialect.DRAFT else NOTHING_SEEN
    assert c.send(Notify(2, "t", nothing)) == [NotifyAck(True, 2, NOTHING_SEEN)]
    c.send(msg(dialect, 1, 41))
    assert w.payloads == [b"x"] and w.stream(1).point == 41
    # Without it, the stream starts from nothing (the draft says so with a NACK to 0).
    reset = [Nack(0, 1, 0)] if dialect is Dialect.DRAFT else []
    fresh = Worker(dialect).connect()
    assert fresh.send(Notify(1, "s", 40)) == [NotifyAck(True, 1, NOTHING_SEEN), *reset]


# --- messages ---------------------------------------------------------------------------


def test_a_message_for_an_unknown_stream(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    reason = only_error(c.send(msg(dialect, 9, 1)))
    at = len(encode(hello(dialect), dialect)) + 5  # the stream id, after length and tag
    assert reason == (
        f"{dialect.value} Message.stream_id at offset {at}: stream 9 is not open on this "
        "connection: never notified"
    )
    assert c.closed


def test_stream_not_open_error_fields() -> None:
    err = StreamNotOpenError("draft", "Message", 12, 9, "never notified")
    assert (err.field, err.stream_id, err.offset) == ("stream_id", 9, 12)
    back = pickle.loads(pickle.dumps(err))
    assert (
        str(back)
        == str(err)
        == (
            "draft Message.stream_id at offset 12: stream 9 is not open on this connection: "
            "never notified"
        )
    )


def test_ephemeral_messages_carry_no_identity() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), msg(d, 1, 5))
    e = Message(1, 1, b"e", MessageFlags.EPHEMERAL)
    u = Message(1, 1, b"u", MessageFlags.UNSTABLE_REFERENCE)
    assert c.send(e, e, u) == [Ack(5, ())]  # applied, and no point moved
    assert w.payloads == [b"x", b"e", b"e", b"u"] and w.stream(1).point == 5


def test_a_boundary_moves_the_point_without_the_application() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    assert c.send(Notify(1, "s"), Message(1, 3, None)) == [
        NotifyAck(True, 1, NOTHING_SEEN),
        Ack(0, ((1, 3),)),
    ]
    assert w.payloads == [] and w.core.applied == 0


def test_an_application_error_skips_the_message(dialect: Dialect) -> None:
    w = Worker(dialect, app="tests.wallaroo_apps:explode")
    c = w.connect()
    assert c.send(Notify(1, "s"), msg(dialect, 1, 1, b"boom"), msg(dialect, 1, 2, b"ok"))[-1] == (
        Ack(0, ((1, 2),))
    )
    assert w.payloads == [b"ok"] and "RuntimeError('boom')" in w.problems[-1]


def test_without_an_application_messages_are_tracked(dialect: Dialect) -> None:
    w = Worker(dialect, app="")
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1))
    assert w.core.applied == 1 and w.core.app_state == {}


def test_load_app() -> None:
    assert load_app("") is None
    assert load_app(APP) is not None
    for spec, match in [
        ("nocolon", "is not module:function"),
        ("no_such_module_xyz:f", "cannot import"),
        ("tests.wallaroo_apps:nope", "has no function 'nope'"),
    ]:
        with pytest.raises(ValueError, match=match):
            load_app(spec)


# --- end of stream ----------------------------------------------------------------------


def test_eos_closes_releases_and_acknowledges(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1))
    final = 2 if dialect is Dialect.DRAFT else 1  # the draft's EOS is a boundary with an id
    assert c.send(eos(dialect, 1, 2)) == [Ack(0, ((1, final),))]
    assert w.stream(1).owner is None and w.stream(1).machine.state.value == "closed"
    reason = only_error(c.send(msg(dialect, 1, 3)))
    assert "closed by EOS; a NOTIFY reopens it" in reason


def test_notify_reopens_a_closed_stream(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1), eos(dialect, 1, 2))
    point = w.stream(1).point
    assert c.send(Notify(1, "s", point)) == [NotifyAck(True, 1, point)]
    assert c.send(msg(dialect, 1, 3))[-1] == Ack(5, ((1, 3),))  # 5 frames: a refill too


def test_a_draft_eos_with_a_payload_is_applied_first() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    assert c.send(Notify(1, "s"), Message(1, 1, b"last", MessageFlags.EOS))[-1] == Ack(0, ((1, 1),))
    assert w.payloads == [b"last"] and w.stream(1).owner is None


def test_an_eos_for_an_unknown_stream(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    assert "never notified" in only_error(c.send(eos(dialect, 4, 1)))


def test_v3_eos_of_an_empty_stream_acknowledges_nothing() -> None:
    w = Worker(Dialect.V3)
    c = w.connect()
    assert c.send(Notify(1, "s"), EosMessage(1)) == [NotifyAck(True, 1, NOTHING_SEEN)]
    assert w.stream(1).owner is None


# --- NACK (draft) and its v3 form -------------------------------------------------------


def test_nack_resets_the_stream_until_a_notify() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), *[msg(d, 1, i, b"%d" % i) for i in range(1, 4)])
    assert c.credits == 6
    out = w.outputs(w.core.nack(1, 2))  # a NACK grants credits too (seed 000)
    assert out == {c.name: [Nack(4, 1, 2)]} and c.credits == 10
    assert c.send(msg(d, 1, 4, b"4")) == []  # reset: ignored until the NOTIFY
    assert c.send(Notify(1, "s", 2)) == [NotifyAck(True, 1, 2)]  # at the NACK's point
    assert c.send(msg(d, 1, 3, b"3"), msg(d, 1, 4, b"4"))[-1] == Ack(0, ((1, 4),))
    assert w.payloads == [b"1", b"2", b"3", b"3", b"4"]


def test_nacks_stack_each_needs_a_notify() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), msg(d, 1, 1), msg(d, 1, 2), msg(d, 1, 3))
    w.outputs(w.core.nack(1, 2))
    w.outputs(w.core.nack(1, 1))
    assert c.send(Notify(1, "s", 2)) == [NotifyAck(True, 1, 1)]
    assert c.send(msg(d, 1, 2)) == []  # still reset: one NACK left
    assert c.send(Notify(1, "s", 1)) == [NotifyAck(True, 1, 1)]
    assert c.send(msg(d, 1, 2))[-1] == Ack(0, ((1, 2),))


def test_nack_to_the_start() -> None:
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), msg(d, 1, 1))
    assert w.outputs(w.core.nack(1, None)) == {c.name: [Nack(2, 1, 0)]}
    assert c.send(Notify(1, "s")) == [NotifyAck(True, 1, NOTHING_SEEN)]


def test_v3_rewinds_through_an_ack() -> None:
    d = Dialect.V3
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), *[msg(d, 1, i) for i in range(1, 5)])
    assert w.outputs(w.core.nack(1, 2)) == {c.name: [Ack(0, ((1, 2),))]}
    assert c.send(msg(d, 1, 3))[-1] == Ack(0, ((1, 3),))  # the stream stays open
    assert len(w.payloads) == 5


def test_nack_of_a_released_stream_sets_where_it_resumes(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1), msg(dialect, 1, 2))
    w.core.closed(c.name)
    assert w.core.nack(1, 1) == Replies()
    assert w.connect().send(Notify(1, "s", 1)) == [NotifyAck(True, 1, 1)]


def test_nack_refusals(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 3))
    with pytest.raises(ValueError, match="no stream 2"):
        w.core.nack(2, 1)
    if dialect is Dialect.V3:  # an ACK ahead would be progress to the released connector
        with pytest.raises(ValueError, match="cannot NACK ahead to 4"):
            w.core.nack(1, 4)
        assert w.stream(1).point == 3
    else:  # ids have no order: a NACK may send the stream to any point
        assert w.outputs(w.core.nack(1, 4)) == {c.name: [Nack(2, 1, 4)]}


# --- bad input --------------------------------------------------------------------------


def test_a_length_over_the_limit(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"))
    out = w.outputs(w.core.too_large(c.name, 30, 5_000_000))
    reason = only_error(out[c.name])
    assert reason == f"{dialect.value} Frame.length at offset 30: frame of 5000000 bytes over " \
        "the limit of 4194304"  # fmt: skip
    assert c.closed and w.stream(1).owner is None
    assert w.core.too_large(c.name, 30, 5_000_000) == Replies()  # gone already


def test_a_frame_over_the_configured_limit(dialect: Dialect) -> None:
    w = Worker(dialect, max_frame_bytes=64)
    c = w.connect()
    c.send(Notify(1, "s"))
    assert "over the limit of 64" in only_error(c.send(msg(dialect, 1, 1, b"y" * 100)))


def test_an_unknown_tag_names_its_stream_offset(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    first = len(encode(hello(dialect), dialect))
    reason = only_error(c.send_raw([b"\x63junk"]))
    assert reason == f"{dialect.value} Frame.tag at offset {first + 4}: unknown tag 0x63"


def test_a_truncated_body(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    raw = encode(Notify(1, "stream"), dialect)[4:-3]
    assert "Notify" in only_error(c.send_raw([raw])) and c.closed


def test_an_error_from_the_connector_closes(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"))
    assert c.send(Error("cannot resume")) == [] and c.closed
    assert "sent ERROR: cannot resume" in w.problems[-1]
    assert w.stream(1).owner is None


def test_a_long_reason_is_cut_visibly(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect(handshake=False)
    name = "n" * 5000
    reason = only_error(c.send(Hello("9", b"", name, name) if dialect is Dialect.V3 else
                               Hello(1, b"", name, name)))  # fmt: skip
    assert reason.startswith("Unknown protocol version")
    w2 = Worker(dialect, max_frame_bytes=1 << 20)
    c2 = w2.connect()
    reason = only_error(c2.send(msg(dialect, 1, 1)))
    assert len(reason) < 2000 or reason.endswith("...")


def test_events_for_unknown_connections_are_ignored(dialect: Dialect) -> None:
    w = Worker(dialect)
    assert w.core.frames("nope", [b"x"]) == Replies()
    assert w.core.closed("nope") == Replies()
    c = w.connect()
    assert w.core.opened(c.name, "again").problems  # opened twice: the first dropped
    assert w.core.connections[c.name].machine.state.value == "connected"


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="refill_credits 10 must be"):
        WorkerConfig(max_credits=10, refill_credits=10)
    with pytest.raises(ValueError, match="max_credits 0 must be"):
        WorkerConfig(max_credits=0, refill_credits=0)
    with pytest.raises(ValueError):
        WorkerConfig(dialect="v4")  # type: ignore[arg-type]


# --- state: pickles, replays, status ----------------------------------------------------


def test_the_state_pickles_and_carries_on_identically(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1, b"a"))
    blob = pickle.dumps(w.core)
    assert len(blob) < 2000
    copy = pickle.loads(blob)
    frames = [encode(msg(dialect, 1, i, b"b"), dialect)[4:] for i in (1, 2, 3)]
    assert copy.frames(c.name, frames) == w.core.frames(c.name, frames)
    taken = [b"a", b"b", b"b"] if dialect is Dialect.V3 else [b"a", b"b", b"b", b"b"]
    assert copy.app_state == w.core.app_state == {"payloads": taken}


def test_status(dialect: Dialect) -> None:
    w = Worker(dialect)
    c = w.connect()
    c.send(Notify(1, "s"), msg(dialect, 1, 1))
    status = w.core.status()
    assert status["streams"] == {"1": {"name": "s", "owner": c.name, "state": "open", "point": 1}}
    assert status["connections"][c.name]["state"] == "streaming"
    assert status["applied"] == 1 and status["dialect"] == dialect.value
