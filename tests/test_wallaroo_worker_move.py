"""The worker's sans-IO core moving its streams to another worker (``handoff.py``):
MIGRATE in the draft (seed 001), RESTART in v3, each stream's state handed over first,
frame by frame, with the calls between the two workers read back as values."""

from __future__ import annotations

import pytest

from immortals.wallaroo import (
    NOTHING_SEEN,
    Ack,
    Dialect,
    Migrate,
    MigrationAck,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    encode,
)
from immortals.wallaroo.handoff import Call
from tests.wallaroo_harness import Worker, eos, hello, msg, only_error

# --- migration (draft) and RESTART (v3) -------------------------------------------------


def test_a_move_hands_each_stream_over_before_its_eos_is_acked() -> None:
    """Seed 001, steps 1-10, with the old worker's state going to the new one (step 5)
    as calls between the two workers (``handoff.py``)."""
    d = Dialect.DRAFT
    w, new = Worker(d), Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), msg(d, 1, 1))
    moving = w.core.begin_move("10.0.0.2", 7200, "b")
    assert moving.sends == () and moving.calls == (Call("b", "expect", ([1],)),)
    with pytest.raises(ValueError, match=r"moving to 10\.0\.0\.2:7200 already"):
        w.core.begin_move("10.0.0.3", 1, "c")
    # Until the new worker expects the streams, they go on here; a new one is refused.
    assert c.send(msg(d, 1, 2), Notify(2, "t")) == [
        NotifyAck(False, 2, NOTHING_SEEN),
        Ack(0, ((1, 2),)),
    ]
    expect = new.core.expect("a", [1])
    assert expect.calls == (Call("a", "expecting", (1,)),)
    other = new.connect()  # a connector reaching the new worker early is refused
    assert other.send(Notify(1, "s", 2)) == [NotifyAck(False, 1, NOTHING_SEEN)]
    ready = w.core.expecting()
    assert w.outputs(ready) == {c.name: [Migrate("10.0.0.2", 7200)]} and ready.calls == ()
    # The connector's EOS: the stream's state goes first, its ACK waits (steps 4-6).
    replies = w.core.frames(c.name, [encode(eos(d, 1, 3), d)[4:]])
    assert replies.calls == (Call("b", "adopt", (1, [(1, "s", 3, True)])),)
    assert [f for f in w.outputs(replies)[c.name] if isinstance(f, Ack)] == [Ack(5, ())]
    adopted = new.core.adopt("a", 1, [(1, "s", 3, True)])
    assert adopted.calls == (Call("a", "adopted", (1,)),)
    assert (new.stream(1).point, new.stream(1).machine.state.value) == (3, "closed")
    assert new.core.expected == {}
    assert w.outputs(w.core.adopted(1)) == {c.name: [Ack(0, ((1, 3),))]}
    assert w.core.move is not None and w.core.move.done(len(w.core.streams))
    assert c.send(MigrationAck()) == [] and c.closed  # step 10
    assert w.core.connections == {}
    # A connector that comes back to the old worker is sent on (the addendum's note).
    late = w.connect(handshake=False)
    assert late.send(hello(d)) == [Migrate("10.0.0.2", 7200)]
    # At the new one the stream resumes after its point.
    assert other.send(Notify(1, "s", 3)) == [NotifyAck(True, 1, 3)]


def test_a_move_without_a_peer_named_is_refused() -> None:
    w = Worker(Dialect.DRAFT)
    with pytest.raises(ValueError, match="name the worker instance at h:9"):
        w.core.begin_move("h", 9, "")
    assert w.core.move is None


def test_a_v3_move_restarts_connectors_and_hands_every_stream_over() -> None:
    d = Dialect.V3
    w = Worker(d)
    c, _idle = w.connect(), w.connect(handshake=False)
    c.send(Notify(1, "s"), msg(d, 1, 4), Notify(2, "t"))
    assert w.core.begin_move("h", 9, "b").calls == (Call("b", "expect", ([1, 2],)),)
    ready = w.core.expecting()
    out = w.outputs(ready)
    assert out == {c.name: [Ack(0, ((1, 4),)), Restart("h:9")]}  # not the idle one
    assert c.closed and w.stream(1).owner is None and w.stream(2).owner is None
    assert ready.calls == (Call("b", "adopt", (1, [(1, "s", 4, False), (2, "t", None, False)])),)
    late = w.connect(handshake=False)  # v3 has RESTART only after OK
    assert late.send(hello(d)) == [Ok(10), Restart("h:9")] and late.closed


def test_a_migration_ack_outside_migrating_is_an_error() -> None:
    w = Worker(Dialect.DRAFT)
    c = w.connect()
    assert "received MIGRATION_ACK in connection state STREAMING" in only_error(
        c.send(MigrationAck())
    )
