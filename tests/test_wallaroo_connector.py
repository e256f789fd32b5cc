"""The connector's sans-IO core, frame by frame in both dialects.

Each test drives :class:`ConnectorCore` as the immortal does (connection events, the
frames of one read from a worker, the source readers' reports) and reads its actions
back: writes decoded with the codec, dials, closes and the readers' orders. The rules
are the seeds' and the reference's (see ``connector_core``'s docstring). The sources
are tested in ``test_wallaroo_connector_sources.py``.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
from hypothesis import given
from hypothesis import strategies as st

from immortals.wallaroo import (
    DRAFT_VERSION,
    NOTHING_SEEN,
    V3_VERSION,
    Ack,
    Dialect,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
    encode,
)
from immortals.wallaroo.connector_actions import (
    Actions,
    Close,
    Commit,
    ConnectorConfig,
    Dial,
    Go,
    Halt,
    MessageEncoder,
    RetryLater,
    Stop,
    Write,
    granted,
)
from immortals.wallaroo.connector_core import ConnectorCore
from immortals.wallaroo.sources import SourceError
from tests.wallaroo_harness import ID1, ID2, OTHER, S1, S2, WORKER, Connector, kinds, nothing


@pytest.fixture(params=[Dialect.DRAFT, Dialect.V3], ids=lambda d: d.value)
def dialect(request: pytest.FixtureRequest) -> Iterator[Dialect]:
    yield request.param


def test_public_names_are_exported() -> None:
    import immortals.wallaroo as wallaroo

    names = {"WallarooConnector", "ConnectorConfig", "ConnectorCore", "MessageEncoder"}
    names |= {"Source", "SourceError", "UnknownStreamError", "open_source", "stream_names"}
    assert names <= set(wallaroo.__all__)
    assert wallaroo.ConnectorCore is ConnectorCore and wallaroo.SourceError is SourceError


# --- handshake --------------------------------------------------------------------------


def test_start_dials_the_worker(dialect: Dialect) -> None:
    c = Connector(dialect)
    assert c.core.target == WORKER
    assert c.start("i2") == [Dial(2, WORKER, 0)]


def test_hello_on_connect(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn, actions = c.connect(1)
    version = DRAFT_VERSION if dialect is Dialect.DRAFT else V3_VERSION
    assert c.written(actions) == [Hello(version, b"c", "ambrosia-py", "conn")]
    assert isinstance(actions[0], Write) and not actions[0].charged  # before OK: no credits
    assert c.core.active == conn


def test_ok_notifies_every_stream(dialect: Dialect) -> None:
    c = Connector(dialect, (S1, S2))
    _, actions = c.streaming(credits=7)
    assert c.written(actions) == [
        Notify(ID1, S1, nothing(dialect)),
        Notify(ID2, S2, nothing(dialect)),
    ]
    assert isinstance(actions[0], Write) and actions[0].charged


def test_a_v3_stream_starts_when_its_notify_ack_comes() -> None:
    c = Connector(Dialect.V3, (S1, S2))
    conn, _ = c.streaming()
    assert c.receive(conn, NotifyAck(True, ID1, NOTHING_SEEN)) == [
        Go(conn, ID1, S1, c.gen(ID1), None)
    ]
    assert c.receive(conn, NotifyAck(True, ID2, 41)) == [Go(conn, ID2, S2, c.gen(ID2), 41)]
    assert c.core.streams[ID2].acked == 41


# --- acknowledgements and rewinds ---------------------------------------------------------


def test_ack_grants_and_records_points(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open()
    assert c.receive(conn, Ack(5, [(ID1, 30)])) == [Commit(S1, 30)]
    assert c.receive(conn, Ack(0, [(ID1, 30)])) == []
    assert c.core.streams[ID1].acked == 30


def test_a_v3_ack_below_the_last_rewinds_the_reader() -> None:
    c = Connector(Dialect.V3)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 60)]))
    assert c.receive(conn, Ack(0, [(ID1, 45)])) == [Go(conn, ID1, S1, c.gen(ID1), 45)]
    assert c.core.streams[ID1].acked == 45
    assert any("rewound" in p for p in c.problems)
    # NOTHING_SEEN: back to the source's origin
    assert c.receive(conn, Ack(0, [(ID1, NOTHING_SEEN)])) == [Go(conn, ID1, S1, c.gen(ID1), None)]


def test_a_nack_stops_the_stream_and_a_notify_answers_it() -> None:
    c = Connector(Dialect.DRAFT)
    conn = c.open(10)
    actions = c.receive(conn, Nack(4, ID1, 7))
    assert kinds(actions) == ["Stop", "Go"]  # it resumes with the NOTIFY
    assert actions[0] == Stop(conn, ID1)
    # The NOTIFY leaves with the reader, once the source could read from 7 (seed 000,
    # D5: a connector that cannot resume there sends an error instead, not a NOTIFY).
    lead = encode(Notify(ID1, S1, 7), Dialect.DRAFT)
    assert actions[1] == Go(conn, ID1, S1, c.gen(ID1), 7, lead)
    assert c.receive(conn, NotifyAck(True, ID1, 7)) == []


def test_nacks_stack_and_each_needs_its_notify() -> None:
    c = Connector(Dialect.DRAFT)
    conn = c.open(10)
    first = c.receive(conn, Nack(0, ID1, 7))
    second = c.receive(conn, Nack(0, ID1, 3))
    leads = [a.lead for a in first + second if isinstance(a, Go)]
    notifies = [Notify(ID1, S1, 7), Notify(ID1, S1, 3)]
    assert leads == [encode(n, Dialect.DRAFT) for n in notifies]
    # The last NOTIFY's point wins; the edge sends the first NOTIFY when it stops its
    # reader, so that each NACK on the stack has its NOTIFY (seed 000).
    assert second == [Stop(conn, ID1), Go(conn, ID1, S1, c.gen(ID1), 3, leads[1])]
    assert c.receive(conn, NotifyAck(True, ID1, 7), NotifyAck(True, ID1, 3)) == []


def test_a_nack_of_a_closed_stream_reopens_it() -> None:
    c = Connector(Dialect.DRAFT)
    conn = c.open(0)
    c.keep(c.core.halted(conn, ID1, c.gen(ID1), 100, True))
    actions = c.receive(conn, Nack(0, ID1, 50))
    lead = encode(Notify(ID1, S1, 50), Dialect.DRAFT)
    assert actions == [Go(conn, ID1, S1, c.gen(ID1), 50, lead)]


# --- end of stream ------------------------------------------------------------------------


def test_the_end_of_the_source_sends_eos(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open()
    actions = c.keep(c.core.halted(conn, ID1, c.gen(ID1), 100, True))
    eos: Frame = Message(ID1, 100, None, MessageFlags.EOS)  # seed 000, D0: a boundary
    if dialect is Dialect.V3:
        eos = EosMessage(ID1)
    assert c.written(actions) == [eos]
    assert c.core.streams[ID1].end == 100 and not c.core.streams[ID1].finished
    c.receive(conn, Ack(0, [(ID1, 100)]))
    assert c.core.status()["streams"][S1]["finished"]


def test_a_finished_stream_is_introduced_again_once_to_be_sure_it_closed(
    dialect: Dialect,
) -> None:
    c = Connector(dialect, (S1, S2))
    conn = c.open()
    c.keep(c.core.halted(conn, ID1, c.gen(ID1), 100, True))
    # This ACK may be the last MESSAGE's, sent before the worker read the EOS: if the
    # worker crashed then, its stream was never closed.
    c.receive(conn, Ack(0, [(ID1, 100)]))
    assert c.core.status()["streams"][S1]["finished"]
    c.keep(c.core.closed(conn))
    conn2, _ = c.connect(c.core.dials)
    notifies = c.written(c.receive(conn2, Ok(10)))
    assert notifies == [Notify(ID1, S1, 100), Notify(ID2, S2, nothing(dialect))]
    if dialect is Dialect.V3:
        c.receive(conn2, NotifyAck(True, ID1, 100), NotifyAck(True, ID2, NOTHING_SEEN))
    # Its reader starts at the end: it sends no MESSAGE, only the EOS.
    eos = c.written(c.keep(c.core.halted(conn2, ID1, c.gen(ID1), 100, True)))
    assert eos == [
        Message(ID1, 100, None, MessageFlags.EOS) if dialect is Dialect.DRAFT else EosMessage(ID1)
    ]
    c.receive(conn2, Ack(0, [(ID1, 100)]))  # so this ACK can only be the EOS's
    c.keep(c.core.closed(conn2))
    conn3, _ = c.connect(c.core.dials)
    assert c.written(c.receive(conn3, Ok(10))) == [Notify(ID2, S2, nothing(dialect))]
    # After a restart too: what the worker acknowledged is state.
    c.start("i2")
    conn4, _ = c.connect(c.core.dials)
    assert c.written(c.receive(conn4, Ok(10))) == [Notify(ID2, S2, nothing(dialect))]


def test_an_ack_before_a_restart_does_not_prove_a_close() -> None:
    c = Connector(Dialect.V3)
    conn = c.open()
    c.keep(c.core.halted(conn, ID1, c.gen(ID1), 100, True))
    c.receive(conn, Ack(0, [(ID1, 100)]))
    c.keep(c.core.closed(conn))
    conn2, _ = c.connect(c.core.dials)
    c.receive(conn2, Ok(10), NotifyAck(True, ID1, 100))
    c.keep(c.core.halted(conn2, ID1, c.gen(ID1), 100, True))
    # A worker moving its connectors ACKs every stream's point, then RESTARTs: that ACK
    # is no proof that it read the EOS.
    c.receive(conn2, Ack(0, [(ID1, 100)]), Restart(OTHER))
    conn3, _ = c.connect(c.core.dials, OTHER)
    assert c.written(c.receive(conn3, Ok(10))) == [Notify(ID1, S1, 100)]


def test_stale_reports_are_ignored(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open(10)
    before = c.gen(ID1)
    if dialect is Dialect.V3:
        c.receive(conn, Ack(0, [(ID1, 20), (ID1, 15)]))  # a rewind: a new reader
    else:
        c.receive(conn, Nack(0, ID1, 5))
    assert c.gen(ID1) > before
    assert c.core.halted(conn, ID1, before, 99, True) == Actions()
    assert c.core.failed(conn, ID1, before, "gone") == Actions()
    assert c.core.halted("c.99", ID1, c.gen(ID1), 99, True) == Actions()


# --- connections: loss, back-off, resume --------------------------------------------------


def test_a_lost_connection_is_redialled_and_streams_resume_from_their_points(
    dialect: Dialect,
) -> None:
    c = Connector(dialect)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 70)]))
    assert c.keep(c.core.closed(conn)) == [Dial(2, WORKER, 0)]  # it had streamed: at once
    conn2, _ = c.connect(2)
    actions = c.receive(conn2, Ok(10))
    assert c.written(actions) == [Notify(ID1, S1, 70)]
    if dialect is Dialect.V3:  # from where NOTIFY_ACK says
        assert actions == actions[:1]
        assert c.receive(conn2, NotifyAck(True, ID1, 72)) == [Go(conn2, ID1, S1, c.gen(ID1), 72)]
    else:  # from the NOTIFY's point, at once
        assert actions[1:] == [Go(conn2, ID1, S1, c.gen(ID1), 70)]


def test_a_refused_cookie_backs_off(dialect: Dialect) -> None:
    c = Connector(dialect)
    for attempt in (1, 2, 3):
        conn, _ = c.connect(c.core.dials)
        actions = c.receive(conn, Error("Bad cookie"))
        assert actions == [Close(conn), Dial(attempt + 1, WORKER, attempt)]
    assert any("Bad cookie" in p for p in c.problems)
    conn, _ = c.streaming()  # a session that reaches OK resets the count
    assert c.core.failures == 0


def test_a_restarted_connector_resumes_from_its_state(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 70)]))
    c.core = pickle.loads(pickle.dumps(c.core))  # a checkpoint
    assert c.start("i2") == [Dial(2, WORKER, 0)]
    assert c.core.conns == {}
    conn2, _ = c.connect(2)
    assert c.written(c.receive(conn2, Ok(10))) == [Notify(ID1, S1, 70)]


def test_a_refused_notify_is_retried_after_a_back_off(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn, _ = c.streaming()
    # The draft's reader started with the NOTIFY: the refusal stops it.
    stop = [Stop(conn, ID1)] if dialect is Dialect.DRAFT else []
    assert c.receive(conn, NotifyAck(False, ID1, 9)) == [*stop, RetryLater(conn, ID1, 0)]
    assert c.core.streams[ID1].acked == 9 and not c.core.streams[ID1].running
    assert c.written(c.keep(c.core.retry(conn, ID1))) == [Notify(ID1, S1, 9)]
    assert c.receive(conn, NotifyAck(False, ID1, 9)) == [*stop, RetryLater(conn, ID1, 1)]
    c.keep(c.core.retry(conn, ID1))
    assert c.core.retry(conn, ID1) == Actions()  # one NOTIFY is out already
    assert c.core.retry("c.99", ID1) == Actions()


def test_a_source_that_cannot_resume_halts_its_stream(dialect: Dialect) -> None:
    c = Connector(dialect, (S1, S2))
    conn = c.open(500)
    actions = c.keep(c.core.failed(conn, ID1, c.gen(ID1), "it has 100 records"))
    assert c.written(actions) == [Error(f"stream '{S1}': it has 100 records")]
    assert kinds(actions) == ["Write", "Close", "Dial"]
    conn2, _ = c.connect(c.core.dials)
    assert c.written(c.receive(conn2, Ok(10))) == [Notify(ID2, S2, 500)]
    c.start("i2")  # a restart is the operator's repair (seed 000, D5)
    conn3, _ = c.connect(c.core.dials)
    assert len(c.written(c.receive(conn3, Ok(10)))) == 2


# --- bad input from the worker --------------------------------------------------------------


@pytest.mark.parametrize(
    "frame",
    [
        Hello(DRAFT_VERSION, b"", "p", "i"),
        Notify(ID1, S1, 0),
        Ok(3),  # a second OK
        NotifyAck(True, ID1, 5),  # no NOTIFY awaits it
    ],
    ids=["hello", "notify", "second-ok", "notify-ack"],
)
def test_frames_not_valid_here_are_answered_with_error(frame: Frame) -> None:
    c = Connector(Dialect.DRAFT)
    conn = c.open()
    actions = c.receive(conn, frame)
    (error,) = c.written(actions)
    assert isinstance(error, Error) and "(frame at stream offset" in error.reason
    assert kinds(actions)[-3:] == ["Write", "Close", "Dial"]
    assert conn not in c.core.conns


def test_an_ack_for_a_stream_never_notified(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open()
    (error,) = c.written(c.receive(conn, Ack(1, [(999, 3)])))
    assert isinstance(error, Error)
    assert "stream 999 was never notified by this connector" in error.reason


def test_garbage_and_an_oversize_length(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open()
    (error,) = c.written(c.keep(c.core.frames(conn, [b"\xff junk"])))
    assert isinstance(error, Error) and "unknown tag 0xff" in error.reason
    conn2, _ = c.streaming()
    (error,) = c.written(c.keep(c.core.too_large(conn2, 4, 2**31)))
    assert isinstance(error, Error) and "over the limit" in error.reason


def test_an_error_before_ok_backs_off_and_events_for_unknown_connections(
    dialect: Dialect,
) -> None:
    c = Connector(dialect)
    assert c.core.frames("c.99", [b"x"]) == Actions()
    assert c.core.closed("c.99") == Actions()
    assert c.core.too_large("c.99", 0, 1) == Actions()
    assert c.keep(c.core.connected(42, "c.50", WORKER)) == [Close("c.50")]  # never dialled


# --- RESTART and MIGRATE ---------------------------------------------------------------------


def test_restart_moves_the_connector(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 40)]))
    actions = c.receive(conn, Restart(OTHER))
    assert actions == [Close(conn), Dial(2, OTHER, 0)]
    assert c.core.target == OTHER
    conn2, _ = c.connect(2, OTHER)
    assert c.written(c.receive(conn2, Ok(10))) == [Notify(ID1, S1, 40)]
    c.start("i2")  # the new address is state: a restart goes there too
    assert c.core.target == OTHER


def test_a_restart_naming_no_address_reconnects_where_it_was(dialect: Dialect) -> None:
    c = Connector(dialect)
    conn = c.open()
    assert c.receive(conn, Restart("nowhere")) == [Close(conn), Dial(2, WORKER, 0)]
    assert any("not HOST:PORT" in p for p in c.problems)


def migrating(streams: tuple[str, ...] = (S1,)) -> tuple[Connector, str]:
    c = Connector(Dialect.DRAFT, streams)
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 20)]))
    return c, conn


def test_migration_in_the_addendum_order() -> None:
    c, old = migrating()
    actions = c.receive(old, Migrate("127.0.0.1", 7200))
    assert actions == [Dial(2, OTHER, 0), Halt(old, ID1, S1, c.gen(ID1))]  # steps 2 and 7
    eos = c.keep(c.core.halted(old, ID1, c.gen(ID1), 33, False))  # the reader stopped at 33
    assert c.written(eos) == [Message(ID1, 33, None, MessageFlags.EOS)]  # step 3
    new, hello = c.connect(2, OTHER)
    assert isinstance(c.written(hello)[0], Hello)  # step 8, the old connection still open
    assert c.receive(new, Ok(10)) == []  # no MIGRATION_ACK: no ACK of 33 yet
    actions = c.receive(old, Ack(0, [(ID1, 33)]))  # step 6
    assert c.written(actions, old) == [MigrationAck()]  # step 9, on the old connection
    assert c.written(actions, new) == [Notify(ID1, S1, 33)]  # step 11
    assert actions[-1] == Go(new, ID1, S1, c.gen(ID1), 33)  # streaming with it (draft)
    assert (c.core.target, c.core.active, c.core.migration) == (OTHER, new, None)
    assert c.receive(new, NotifyAck(True, ID1, 33)) == []
    # The old worker closes (step 10); late frames and the close change nothing.
    assert c.receive(old, Ack(5, [(ID1, 33)])) == []
    assert c.keep(c.core.closed(old)) == []


def test_migration_when_the_old_acks_come_first() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    c.keep(c.core.halted(old, ID1, c.gen(ID1), 33, False))
    assert c.receive(old, Ack(3, [(ID1, 33)])) == [Commit(S1, 33)]
    new, _ = c.connect(2, OTHER)
    actions = c.receive(new, Ok(10))
    assert c.written(actions, old) == [MigrationAck()]
    assert c.written(actions, new) == [Notify(ID1, S1, 33)]


def test_migration_settles_a_notify_in_flight_by_its_refusal() -> None:
    """S2's NOTIFY crossed the MIGRATE: its reader, started with it, halts as S1's does
    and ends with EOS, but the old worker (migrating) refused the NOTIFY and ignores what
    followed, so no ACK comes for that EOS. The refusal settles S2 and carries the old
    worker's point, which the new worker is given."""
    c = Connector(Dialect.DRAFT, (S1, S2))
    old, _ = c.streaming()
    c.receive(old, NotifyAck(True, ID1, NOTHING_SEEN))
    assert c.receive(old, Migrate("127.0.0.1", 7200)) == [
        Dial(2, OTHER, 0),
        Halt(old, ID1, S1, c.gen(ID1)),
        Halt(old, ID2, S2, c.gen(ID2)),
    ]
    c.keep(c.core.halted(old, ID1, c.gen(ID1), 10, False))
    c.keep(c.core.halted(old, ID2, c.gen(ID2), 4, False))
    new, _ = c.connect(2, OTHER)
    c.receive(new, Ok(10))
    c.receive(old, Ack(0, [(ID1, 10)]))
    assert c.core.migration is not None  # S2's EOS at 4 is not acknowledged
    actions = c.receive(old, NotifyAck(False, ID2, 17))
    assert c.written(actions, old) == [MigrationAck()]
    assert c.written(actions, new) == [Notify(ID1, S1, 10), Notify(ID2, S2, 17)]


def test_a_migration_is_abandoned_when_the_old_worker_goes_first() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    new, _ = c.connect(2, OTHER)
    actions = c.keep(c.core.closed(old))
    # Back to the old worker, or the new one if the old does not answer (001, *Notes*).
    assert actions == [Close(new), Dial(3, WORKER, 0, (OTHER,))]
    assert (c.core.target, c.core.migration) == (WORKER, None)


def test_after_an_abandoned_migration_the_new_worker_may_answer_first() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    c.keep(c.core.closed(old))
    conn, actions = c.connect(3, OTHER)  # the edge found the old worker gone
    assert [type(f).__name__ for f in c.written(actions)] == ["Hello"]
    assert (c.core.target, c.core.alternate) == (OTHER, WORKER)
    c.receive(conn, Ok(10))
    # Lost again: both are tried, the one that answered last first.
    assert c.keep(c.core.closed(conn)) == [Dial(4, OTHER, 0, (WORKER,))]


def test_a_migration_dial_answered_after_it_was_abandoned_is_closed() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    c.keep(c.core.closed(old))
    assert c.keep(c.core.connected(2, "c.9", OTHER)) == [Close("c.9")]


def test_the_new_worker_failing_is_dialled_again() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    new, _ = c.connect(2, OTHER)
    assert c.receive(new, Error("Bad cookie")) == [Close(new), Dial(3, OTHER, 1)]
    assert c.core.migration is not None and c.core.active == old


def test_a_second_migrate_while_migrating_is_an_error() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    new, _ = c.connect(2, OTHER)
    (error,) = c.written(c.receive(new, Migrate("127.0.0.1", 7300)))
    assert isinstance(error, Error) and "MIGRATE while migrating" in error.reason


def test_a_restart_while_migrating_is_an_error() -> None:
    c, old = migrating()
    c.receive(old, Migrate("127.0.0.1", 7200))
    new, _ = c.connect(2, OTHER)
    c.receive(new, Ok(10))
    (error,) = c.written(c.receive(new, Restart(WORKER)))
    assert isinstance(error, Error) and "RESTART while migrating" in error.reason
    assert c.core.active == old and c.core.target == WORKER


def test_a_migrate_halts_only_running_streams() -> None:
    c, old = migrating((S1, S2))
    c.keep(c.core.halted(old, ID2, c.gen(ID2), 50, True))  # S2 ended before the MIGRATE
    actions = c.receive(old, Migrate("::1", 7200))
    assert actions == [Dial(2, "[::1]:7200", 0), Halt(old, ID1, S1, c.gen(ID1))]


# --- state ------------------------------------------------------------------------------


def test_the_core_pickles_mid_session_and_carries_on(dialect: Dialect) -> None:
    c = Connector(dialect, (S1, S2))
    conn = c.open(10)
    c.receive(conn, Ack(0, [(ID1, 20)]))
    twin = cloudpickle.loads(cloudpickle.dumps(c.core))
    assert twin.status() == c.core.status()
    frames = [encode(Ack(1, [(ID1, 25)]), dialect)[4:]]
    assert twin.frames(conn, frames) == c.core.frames(conn, frames)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="is not HOST:PORT"):
        ConnectorConfig("nowhere", (S1,))
    ConnectorConfig(WORKER, ("a", "b"))
    assert ConnectorCore().connected(1, "c", WORKER) == Actions((Close("c"),))


# --- credits: the edge's --------------------------------------------------------------------


def test_the_edge_takes_credits_from_ok_ack_and_nack(dialect: Dialect) -> None:
    def raw(frame: Frame) -> bytes:
        return encode(frame, dialect)[4:]

    assert granted(raw(Ok(7)), dialect) == 7
    assert granted(raw(Ack(5, [(1, 2)])), dialect) == 5
    assert granted(raw(NotifyAck(True, 1, 2)), dialect) == 0
    assert granted(raw(Error("no")), dialect) == 0
    if dialect is Dialect.DRAFT:
        assert granted(raw(Nack(3, 1, 0)), dialect) == 3
    assert granted(raw(Ok(7))[:3], dialect) == 0  # malformed: the core will say so
    assert granted(b"", dialect) == granted(b"\xfe", dialect) == 0


# --- the message encoder ------------------------------------------------------------------


@given(
    st.sampled_from(list(Dialect)),
    st.integers(0, 2**64 - 1),
    st.integers(0, 2**64 - 1),
    st.binary(max_size=300),
)
def test_the_message_encoder_writes_what_the_codec_writes(
    dialect: Dialect, sid: int, mid: int, payload: bytes
) -> None:
    expected: Any
    if dialect is Dialect.V3:
        expected = Message(sid, mid, payload or None, event_time=0)  # v3: empty = boundary
    else:
        expected = Message(sid, mid, payload)
    assert MessageEncoder(dialect, sid, 4096)(mid, payload) == encode(expected, dialect)


def test_the_message_encoder_refuses_what_is_over_the_limit(dialect: Dialect) -> None:
    with pytest.raises(ValueError, match="over the limit of 100"):
        MessageEncoder(dialect, 1, 100)(1, b"x" * 100)
