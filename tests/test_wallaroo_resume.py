"""Where a stream resumes, on both sides of the draft, whatever order its ids are in.

Seed 000 assumes no order among message ids ("Wallaroo does not make any assumptions
around monotonicity of message ids", *Streaming*) and has no NOTIFY_ACK: a stream
starts with its NOTIFY (*Overview*). So the draft worker takes every MESSAGE and keeps
replays out by position instead: a NOTIFY whose point is not the worker's is NACKed to
it (*Acks and Nacks*), and what a connector sends behind a NOTIFY the worker refused is
ignored. The draft connector starts each stream with its NOTIFY, from the point the OK
listed for it (*Handshake*, C1), and never waits for a NOTIFY_ACK. v3 keeps the released
rules (reference): NOTIFY_ACK first, ids at or below the point dropped. The cores are
driven frame by frame (``tests/wallaroo_harness.py``); the same rules against bytes
packed by hand, and against real processes, are in ``test_wallaroo_conformance.py``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from immortals.wallaroo import NOTHING_SEEN, Ack, Dialect, Nack, Notify, NotifyAck, Ok
from immortals.wallaroo.connector_actions import Commit, Go
from tests.wallaroo_harness import ID1, ID2, S1, S2, Connector, Worker, eos, hello, kinds, msg

DIALECTS = [Dialect.DRAFT, Dialect.V3]


@pytest.fixture(params=DIALECTS, ids=lambda d: d.value)
def dialect(request: pytest.FixtureRequest) -> Iterator[Dialect]:
    yield request.param


# --- the worker ---------------------------------------------------------------------------


def test_v3_drops_duplicates_and_the_draft_assumes_no_order(dialect: Dialect) -> None:
    """v3: an id at or below the point is dropped (reference). Draft: "Wallaroo does not
    make any assumptions around monotonicity of message ids" (seed 000): every one is
    taken, and the point is the last id taken."""
    w = Worker(dialect, max_credits=100, refill_credits=0)
    c = w.connect(handshake=False)
    assert c.send(hello(dialect)) == [Ok(100)]
    c.send(Notify(1, "s"), *[msg(dialect, 1, i, b"%d" % i) for i in range(1, 6)])
    assert c.send(*[msg(dialect, 1, i, b"%d" % i) for i in range(3, 8)]) == [Ack(0, ((1, 7),))]
    if dialect is Dialect.V3:
        assert w.payloads == [b"%d" % i for i in range(1, 8)]
        assert w.core.duplicates == 3 and w.core.applied == 7
        assert c.send(msg(dialect, 1, 2)) == []  # nothing moved, no refill due: no reply
    else:
        assert w.payloads == [b"%d" % i for i in [1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]
        assert c.send(msg(dialect, 1, 2)) == [Ack(0, ((1, 2),))]
        assert w.core.duplicates == 0 and w.stream(1).point == 2


def test_a_draft_notify_resuming_elsewhere_is_nacked_to_the_workers_point() -> None:
    """Its MESSAGEs follow the NOTIFY at once, so the worker cannot answer "resume after
    3" and wait: it NACKs (seed 000) and ignores them until the NOTIFY at its point. A
    stream never seen is reset to 0, the seed's "undefined": from the start."""
    d = Dialect.DRAFT
    w = Worker(d)
    c = w.connect()
    c.send(Notify(1, "s"), msg(d, 1, 3))
    assert c.send(Notify(1, "s", 1), msg(d, 1, 2)) == [NotifyAck(True, 1, 3), Nack(0, 1, 3)]
    assert c.send(Notify(1, "s", 3), msg(d, 1, 4))[-1] == Ack(6, ((1, 4),))  # and a refill
    assert c.send(Notify(2, "t", 9)) == [NotifyAck(True, 2, NOTHING_SEEN), Nack(0, 2, 0)]
    assert w.payloads == [b"x", b"x"]


def test_draft_messages_of_a_refused_notify_are_ignored() -> None:
    """The draft connector streams right after its NOTIFY, so what it sent before the
    refusal arrived is dropped, not an error; once a NOTIFY is accepted, it counts."""
    d = Dialect.DRAFT
    w = Worker(d)
    a, b = w.connect(), w.connect()
    a.send(Notify(1, "s"), msg(d, 1, 5))
    assert b.send(Notify(1, "s", 5), msg(d, 1, 6), eos(d, 1, 6)) == [NotifyAck(False, 1, 5)]
    assert not b.closed and w.stream(1).owner == a.name and len(w.payloads) == 1
    w.core.closed(a.name)
    assert b.send(Notify(1, "s", 5), msg(d, 1, 6))[-1] == Ack(5, ((1, 6),))  # and a refill
    assert len(w.payloads) == 2


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_exactly_once_whatever_the_resends(data: st.DataObject) -> None:
    """A connector that reconnects at random and resends some of what it had sent: the
    application sees 1..N once, in order. v3: it resumes from NOTIFY_ACK's point and
    resends a few at or below it, which the worker drops. Draft: it resumes from a point
    of its own, perhaps behind, and sends at once (it does not wait for NOTIFY_ACK); the
    worker NACKs it to the worker's point and ignores the replay until that NOTIFY."""
    dialect = data.draw(st.sampled_from(DIALECTS))
    n = 30
    w = Worker(dialect, max_credits=1000, refill_credits=500)
    c = w.connect(handshake=False)
    c.send(hello(dialect))
    (ack,) = c.send(Notify(1, "s"))
    assert isinstance(ack, NotifyAck)
    nxt = 1
    while nxt <= n:
        if data.draw(st.booleans()):  # a reconnect
            w.core.closed(c.name)
            c = w.connect(handshake=False)
            c.send(hello(dialect))
            behind = data.draw(st.integers(0, 3))
            if dialect is Dialect.V3:
                (ack,) = c.send(Notify(1, "s"))
                assert isinstance(ack, NotifyAck) and ack.success
                nxt = 1 if ack.point_of_reference == NOTHING_SEEN else ack.point_of_reference + 1
                nxt = max(nxt - behind, 1)  # some resent anyway
            else:
                point = max(nxt - 1 - behind, 0)
                replay = [msg(dialect, 1, i, b"%d" % i) for i in range(point + 1, nxt)]
                for frame in c.send(Notify(1, "s", point), *replay):
                    if isinstance(frame, Nack):
                        assert frame.point_of_reference == nxt - 1
                        c.send(Notify(1, "s", frame.point_of_reference))
        count = data.draw(st.integers(1, 5))
        c.send(*[msg(dialect, 1, i, b"%d" % i) for i in range(nxt, min(nxt + count, n + 1))])
        nxt += count
    assert w.payloads == [b"%d" % i for i in range(1, n + 1)]


# --- the connector ------------------------------------------------------------------------


def test_a_draft_stream_starts_with_its_notify() -> None:
    """Seed 000 has no NOTIFY_ACK: "once a stream notification has been sent, the open
    stream can have any number of messages" (*Overview*). Ours, when it comes, changes
    nothing; a worker wanting another point NACKs."""
    c = Connector(Dialect.DRAFT, (S1, S2))
    conn, actions = c.connect(1)
    actions = c.receive(conn, Ok(10, [(ID2, 41)]))
    assert kinds(actions) == ["Write", "Go", "Go"]
    assert c.written(actions) == [Notify(ID1, S1, 0), Notify(ID2, S2, 41)]
    assert actions[1:] == [Go(conn, ID1, S1, c.gen(ID1), None), Go(conn, ID2, S2, c.gen(ID2), 41)]
    assert c.receive(conn, NotifyAck(True, ID1, NOTHING_SEEN), NotifyAck(True, ID2, 41)) == []
    assert c.core.streams[ID2].acked == 41


def test_the_draft_ok_points_win_over_the_connectors_own() -> None:
    """The OK's points are the worker's (seed 000, C1): lower, the stream goes back to
    them ("set to Wallaroo's if it is lower"); higher, it jumps forward to them."""
    c = Connector(Dialect.DRAFT, (S1, S2))
    conn = c.open(60)
    c.keep(c.core.closed(conn))
    conn2, _ = c.connect(c.core.dials)
    actions = c.receive(conn2, Ok(10, [(ID1, 12), (ID2, 70)]))
    assert c.written(actions) == [Notify(ID1, S1, 12), Notify(ID2, S2, 70)]
    assert [a.start for a in actions if isinstance(a, Go)] == [12, 70]
    c.keep(c.core.closed(conn2))  # the hints were for that session only
    conn3, _ = c.connect(c.core.dials)
    assert c.written(c.receive(conn3, Ok(10))) == [Notify(ID1, S1, 12), Notify(ID2, S2, 70)]


def test_a_draft_ack_below_the_last_is_progress_not_a_rewind() -> None:
    """Draft ids have no order (seed 000) and a draft worker rewinds with a NACK."""
    c = Connector(Dialect.DRAFT)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 60)]))
    assert c.receive(conn, Ack(0, [(ID1, 45)])) == [Commit(S1, 45)]
    assert c.core.streams[ID1].running
