"""The connector protocol's state machines, table by table, against the seeds' text.

The expected side is tests/wallaroo_seed_states.py: the seeds' lines quoted verbatim
with their line numbers and parsed into tables (seed 000 *Protocol State Machine* and
*Stream State Machine*, seed 001's), then the project's departures one by one, each with
its reason and the docs line that documents it; nothing is taken from ``states.py``.
Here: every quote is in its seed, every departure is in the docs and really departs,
then every frame kind in every state, both roles and both directions: valid ones give
the expected next state, every other one raises UnexpectedFrameError naming state, frame
and direction. Then the machines, the NACK stack, and random event sequences against the
expected tables.
"""

from __future__ import annotations

import itertools
import pickle
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import immortals.wallaroo as wallaroo
from immortals.wallaroo import (
    NOTHING_SEEN,
    Ack,
    EosMessage,
    Error,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    ProtocolError,
    Restart,
)
from immortals.wallaroo.states import (
    CONNECTION_TABLE,
    CONNECTION_TRANSITIONS,
    SENDERS,
    STREAM_KINDS,
    STREAM_TABLE,
    STREAM_TRANSITIONS,
    ConnectionMachine,
    ConnectionState,
    Direction,
    FrameKind,
    Role,
    StreamMachine,
    StreamState,
    UnexpectedFrameError,
    connection_step,
    kind_of,
    stream_step,
)
from tests.wallaroo_seed_states import (
    CONNECTION,
    DEPARTURES,
    FROM,
    SEED_000_CONNECTION,
    SEED_000_STREAM,
    SEED_001_CONNECTION,
    SEED_PROSE,
    STREAM,
    Table,
    read_lists,
)

K = FrameKind
CS = ConnectionState
SS = StreamState
C, W = Role.CONNECTOR, Role.WORKER
SEND, RECV = Direction.SEND, Direction.RECEIVE
ROOT = Path(__file__).resolve().parents[1]


def _directions(role: Role, kind: FrameKind) -> set[Direction]:
    """The directions in which ``role`` may meet ``kind`` at all."""
    return {SEND if role in FROM[kind] else RECV} if FROM[kind] != {C, W} else {SEND, RECV}


def _cases(states: list[object]) -> list[tuple[Role, object, FrameKind, Direction]]:
    return list(itertools.product(Role, states, FrameKind, Direction))  # type: ignore[arg-type]


def _expected(table: Table, role: Role, state: object, kind: FrameKind, d: Direction) -> object:
    return table[state].get(kind) if d in _directions(role, kind) else None


# --- the quotes and the departures themselves ----------------------------------------------


def _seed(number: str) -> list[str]:
    found = sorted((ROOT.parent / "shared" / "seeds").glob(f"{number}_*.txt"))
    if not found:
        pytest.skip(f"seed {number} is not beside the repository")
    return found[0].read_text().splitlines()


def test_every_quote_is_its_seed_s_line() -> None:
    quoted = [("000", n, t) for n, t in SEED_000_CONNECTION + SEED_000_STREAM]
    quoted += [("001", n, t) for n, t in SEED_001_CONNECTION] + SEED_PROSE
    seeds = {number: _seed(number) for number in ("000", "001")}
    for number, line, text in quoted:
        assert text in seeds[number][line - 1].strip(), (number, line, text)


def test_every_departure_is_documented_and_departs() -> None:
    docs = " ".join(
        " ".join((ROOT / "docs" / name).read_text().split())
        for name in ("wallaroo.md", "protocols.md")
    )
    keys = [(d.machine, d.state, d.kind) for d in DEPARTURES]
    assert len(keys) == len(set(keys))
    for d in DEPARTURES:
        assert " ".join(d.doc.split()) in docs, d.doc
        assert d.ours is not d.seed and d.why, d


def test_the_addendum_restates_seed_000_s_connection_lists() -> None:
    """What 001's lists change against 000's: MIGRATE, NOTIFY_ACK, RESTART and MIGRATING
    added, and NACK gone from streaming (which the draft keeps: see DEPARTURES)."""
    old, _ = read_lists(SEED_000_CONNECTION, ConnectionState)
    new, _ = read_lists(SEED_001_CONNECTION, ConnectionState)
    added = {(s, k) for s in new for k in new[s] if k not in old.get(s, {})}
    dropped = {(s, k) for s in old for k in old[s] if s in new and k not in new[s]}
    assert dropped == {(CS.STREAMING, K.NACK)}
    assert added == {
        (CS.CONNECTED, K.MIGRATE),
        (CS.HANDSHAKE, K.MIGRATE),
        *((CS.STREAMING, k) for k in (K.NOTIFY_ACK, K.NOTIFY_REFUSED, K.RESTART, K.MIGRATE)),
        (CS.MIGRATING, K.MIGRATION_ACK),
        (CS.MIGRATING, K.ERROR),
    }
    assert all(new[s][k] is old[s][k] for s in old if s in new for k in old[s] if k in new[s])


# --- the tables ---------------------------------------------------------------------------


def test_senders() -> None:
    assert {k: set(v) for k, v in SENDERS.items()} == FROM
    assert set(FROM) == set(FrameKind)


def test_the_base_tables_are_the_seeds_with_the_departures() -> None:
    assert {s: dict(row) for s, row in CONNECTION_TRANSITIONS.items()} == CONNECTION
    assert {s: dict(row) for s, row in STREAM_TRANSITIONS.items()} == STREAM
    assert set(STREAM_KINDS) == {k for row in STREAM.values() for k in row}
    assert K.HELLO not in STREAM_KINDS and K.MIGRATE not in STREAM_KINDS


def test_the_tables_are_read_only() -> None:
    with pytest.raises(TypeError):
        CONNECTION_TABLE[(W, CS.ERROR, K.HELLO, RECV)] = CS.ERROR  # type: ignore[index]
    with pytest.raises(TypeError):
        STREAM_TRANSITIONS[SS.INTRO][K.MESSAGE] = SS.OPEN  # type: ignore[index]


@pytest.mark.parametrize(("role", "state", "kind", "direction"), _cases(list(ConnectionState)))
def test_connection_table(
    role: Role, state: ConnectionState, kind: FrameKind, direction: Direction
) -> None:
    expected = _expected(CONNECTION, role, state, kind, direction)
    assert CONNECTION_TABLE.get((role, state, kind, direction)) == expected
    if expected is not None:
        assert connection_step(role, state, kind, direction) is expected
        return
    with pytest.raises(UnexpectedFrameError) as info:
        connection_step(role, state, kind, direction)
    err = info.value
    assert isinstance(err, ProtocolError)
    assert (err.machine, err.role, err.state, err.kind, err.direction) == (
        "connection",
        role,
        state,
        kind,
        direction,
    )
    assert err.stream_id is None
    verb = "sent" if direction is SEND else "received"
    text = str(err)
    assert text.startswith(f"the {role.value} {verb} {kind.name} in connection state {state.name}")


@pytest.mark.parametrize(("role", "state", "kind", "direction"), _cases(list(StreamState)))
def test_stream_table(
    role: Role, state: StreamState, kind: FrameKind, direction: Direction
) -> None:
    expected = _expected(STREAM, role, state, kind, direction)
    assert STREAM_TABLE.get((role, state, kind, direction)) == expected
    nacks = 1 if state is SS.RESET else 0
    if expected is not None:
        after, left = stream_step(role, state, nacks, kind, direction, 9)
        assert after is expected
        assert left == nacks + (kind is K.NACK) - (kind is K.NOTIFY and state is SS.RESET)
        return
    with pytest.raises(UnexpectedFrameError) as info:
        stream_step(role, state, nacks, kind, direction, 9)
    err = info.value
    assert (err.machine, err.role, err.state, err.kind, err.direction, err.stream_id) == (
        "stream",
        role,
        state,
        kind,
        direction,
        9,
    )
    assert f"stream state {state.name} (stream 9)" in str(err)


def test_tables_have_no_other_keys() -> None:
    tables: list[tuple[Any, Table, list[object]]] = [
        (CONNECTION_TABLE, CONNECTION, list(ConnectionState)),
        (STREAM_TABLE, STREAM, list(StreamState)),
    ]
    for table, expected, states in tables:
        keys = {c for c in _cases(states) if _expected(expected, *c) is not None}
        assert set(table) == keys


# --- kinds and errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("frame", "kind"),
    [
        (Hello("0.0.1", b"", "p", "i"), K.HELLO),
        (Ok(5), K.OK),
        (Error("why"), K.ERROR),
        (Notify(1, "s", 0), K.NOTIFY),
        (NotifyAck(True, 1, NOTHING_SEEN), K.NOTIFY_ACK),
        (NotifyAck(False, 1, 0), K.NOTIFY_REFUSED),
        (Message(1, 2, b"x"), K.MESSAGE),
        (Message(1, 2, None), K.MESSAGE),
        (Message(1, 2, b"x", MessageFlags.EOS), K.MESSAGE_EOS),
        (Message(1, 2, None, MessageFlags.EOS | MessageFlags.EPHEMERAL), K.MESSAGE_EOS),
        (EosMessage(1), K.EOS_MESSAGE),
        (Ack(3, ((1, 2),)), K.ACK),
        (Nack(3, 1, 0), K.NACK),
        (Restart("h:1"), K.RESTART),
        (Migrate("h", 1), K.MIGRATE),
        (MigrationAck(), K.MIGRATION_ACK),
    ],
)
def test_kind_of(frame: object, kind: FrameKind) -> None:
    assert kind_of(frame) is kind  # type: ignore[arg-type]


def test_kind_of_refuses_what_is_not_a_frame() -> None:
    with pytest.raises(TypeError, match="str is not a connector frame"):
        kind_of("HELLO")  # type: ignore[arg-type]


def test_error_messages_say_where_the_frame_is_valid() -> None:
    with pytest.raises(UnexpectedFrameError) as info:
        connection_step(W, CS.STREAMING, K.HELLO, RECV)
    assert str(info.value) == (
        "the worker received HELLO in connection state STREAMING: HELLO goes "
        "connector -> worker, in connection state CONNECTED"
    )
    assert info.value.frame == "Hello" and info.value.reason == str(info.value)
    assert info.value.dialect == "" and info.value.offset == -1 and info.value.field is None
    with pytest.raises(UnexpectedFrameError) as info:
        connection_step(W, CS.STREAMING, K.OK, RECV)  # a frame only the worker sends
    assert "OK goes worker -> connector, in connection state HANDSHAKE" in str(info.value)
    with pytest.raises(UnexpectedFrameError) as info:
        connection_step(C, CS.ERROR, K.ERROR, SEND)
    assert "ERROR goes either way, in connection state CONNECTED or HANDSHAKE or STREAMING or " \
        "MIGRATING" in str(info.value)  # fmt: skip
    with pytest.raises(UnexpectedFrameError) as info:
        stream_step(W, SS.CLOSED, 0, K.MESSAGE, RECV, 77)
    assert str(info.value) == (
        "the worker received MESSAGE in stream state CLOSED (stream 77): MESSAGE goes "
        "connector -> worker, in stream state OPEN or RESET"
    )
    with pytest.raises(UnexpectedFrameError) as info:
        connection_step(C, CS.HANDSHAKE, K.HELLO, SEND)  # a second HELLO
    assert "sent HELLO in connection state HANDSHAKE" in str(info.value)


def test_errors_pickle_with_their_fields() -> None:
    try:
        stream_step(C, SS.INTRO, 0, K.MESSAGE, SEND, 5)
    except UnexpectedFrameError as err:
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is UnexpectedFrameError and str(back) == str(err)
        assert (back.machine, back.role, back.state, back.kind, back.stream_id) == (
            "stream",
            C,
            SS.INTRO,
            K.MESSAGE,
            5,
        )
    else:  # pragma: no cover
        pytest.fail("no error")


def test_public_names_are_exported() -> None:
    names = {
        "ConnectionMachine", "ConnectionState", "Direction", "FrameKind", "Role",
        "StreamMachine", "StreamState", "UnexpectedFrameError", "kind_of",
    }  # fmt: skip
    assert names <= set(wallaroo.__all__)
    for name in names:
        assert getattr(wallaroo, name) is not None


# --- the machines -----------------------------------------------------------------------


def test_a_session_on_both_sides() -> None:
    """The same frames, each side in its own role, keep both machines in step."""
    worker, connector = ConnectionMachine(W), ConnectionMachine(C)
    frames: list[tuple[Role, object]] = [
        (C, Hello("0.0.1", b"c", "p", "i")),
        (W, Ok(10)),
        (C, Notify(1, "s", 0)),
        (W, NotifyAck(True, 1, NOTHING_SEEN)),
        (C, Message(1, 1, b"x")),
        (W, Ack(1, ((1, 1),))),
        (W, Migrate("h", 7)),
        (C, Message(1, 2, None, MessageFlags.EOS)),
        (W, Ack(1, ((1, 2),))),
        (C, MigrationAck()),
    ]
    states = []
    for sender, frame in frames:
        mine, theirs = (connector, worker) if sender is C else (worker, connector)
        a = mine.send(frame)  # type: ignore[arg-type]
        b = theirs.receive(frame)  # type: ignore[arg-type]
        assert a is b
        states.append(a)
    streaming, migrating = [CS.STREAMING] * 4, [CS.MIGRATING] * 3
    assert states == [CS.HANDSHAKE, CS.STREAMING, *streaming, *migrating, CS.DISCONNECTED]


def test_a_refused_frame_leaves_the_state() -> None:
    m = ConnectionMachine(W)
    with pytest.raises(UnexpectedFrameError):
        m.receive(Notify(1, "s", 0))
    assert m.state is CS.CONNECTED
    m.receive(K.HELLO)
    m.send(K.OK)
    with pytest.raises(UnexpectedFrameError):
        m.receive(K.HELLO)  # a second HELLO
    assert m.state is CS.STREAMING
    assert m.send(K.ERROR) is CS.ERROR
    with pytest.raises(UnexpectedFrameError):
        m.receive(K.MESSAGE)  # nothing is valid after ERROR
    assert m.close() is CS.DISCONNECTED
    assert repr(m) == "ConnectionMachine(WORKER, DISCONNECTED)"


def test_restart_disconnects() -> None:
    m = ConnectionMachine(C, CS.STREAMING)
    assert m.receive(Restart("h:1")) is CS.DISCONNECTED


def test_nacks_stack() -> None:
    """000:440: each NACK needs its own NOTIFY; 000:330: messages of a reset stream are
    ignored."""
    s = StreamMachine(W, 3)
    assert s.receive(Notify(3, "s", 0)) is SS.OPEN
    assert s.send(Nack(5, 3, 0)) is SS.RESET and s.nacks == 1
    assert s.send(K.NACK) is SS.RESET and s.nacks == 2
    assert s.receive(Message(3, 9, b"x")) is SS.RESET  # ignored, not an error
    assert s.receive(K.NOTIFY) is SS.RESET and s.nacks == 1
    assert s.send(K.NOTIFY_ACK) is SS.RESET
    assert s.receive(K.NOTIFY) is SS.OPEN and s.nacks == 0
    assert s.receive(K.MESSAGE_EOS) is SS.CLOSED
    assert s.send(K.NACK) is SS.RESET and s.nacks == 1
    assert s.receive(K.NOTIFY) is SS.OPEN
    assert repr(s) == "StreamMachine(WORKER, 3, OPEN, nacks=0)"


def test_stream_machine_takes_only_stream_frames() -> None:
    with pytest.raises(TypeError, match="HELLO names no stream"):
        StreamMachine(W, 1).receive(K.HELLO)


def test_refused_notify_and_late_acks() -> None:
    s = StreamMachine(C, 1)
    assert s.send(Notify(1, "s", 0)) is SS.OPEN
    assert s.receive(NotifyAck(False, 1, 0)) is SS.INTRO
    assert s.receive(K.ACK) is SS.INTRO  # a late ACK
    with pytest.raises(UnexpectedFrameError):
        s.send(Message(1, 1, b"x"))
    with pytest.raises(UnexpectedFrameError):
        s.send(EosMessage(1))


def test_machines_pickle_compactly() -> None:
    s = StreamMachine(W, 2**64 - 1, SS.RESET, 2)
    back = pickle.loads(pickle.dumps(s))
    assert (back.role, back.stream_id, back.state, back.nacks) == (W, 2**64 - 1, SS.RESET, 2)
    c = pickle.loads(pickle.dumps(ConnectionMachine(C, CS.MIGRATING)))
    assert (c.role, c.state) == (C, CS.MIGRATING)


# --- random sequences against the expected tables ------------------------------------------


class StreamModel:
    """The expected stream table with 000:440's stack of NACKs, one side's view."""

    def __init__(self) -> None:
        self.state = SS.INTRO
        self.stack = 0

    def step(self, kind: FrameKind) -> bool:
        """Apply ``kind``; False (and no change) where it is not valid."""
        after = STREAM[self.state].get(kind)
        if after is None:
            return False
        if kind is K.NACK:
            self.stack += 1
        elif kind is K.NOTIFY and self.state is SS.RESET:
            self.stack -= 1  # "Each NACK will require a NOTIFY"
            after = SS.RESET if self.stack else after
        self.state = after
        return True


_STREAM_KINDS = sorted({k for row in STREAM.values() for k in row}, key=lambda k: k.value)


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(_STREAM_KINDS), st.sampled_from(Role)), max_size=60))
def test_stream_machine_against_the_model(events: list[tuple[FrameKind, Role]]) -> None:
    for role in Role:
        machine, model = StreamMachine(role, 1), StreamModel()
        for kind, sender in events:
            if sender not in FROM[kind]:
                continue  # this sender never sends that kind: checked by the table tests
            direction = SEND if sender is role else RECV
            before = (machine.state, machine.nacks)
            if model.step(kind):
                machine._step(kind, direction)
            else:
                with pytest.raises(UnexpectedFrameError):
                    machine._step(kind, direction)
                assert (machine.state, machine.nacks) == before
            assert (machine.state, machine.nacks) == (model.state, model.stack)
            assert (machine.state is SS.RESET) == (machine.nacks > 0)


@settings(max_examples=300)
@given(
    st.lists(
        st.one_of(
            st.tuples(
                st.sampled_from(sorted(FrameKind, key=lambda k: k.value)),
                st.sampled_from(Role),
            ),
            st.just(("close", C)),
        ),
        max_size=40,
    ),
)
def test_connection_machine_against_the_model(events: list[tuple[FrameKind | str, Role]]) -> None:
    for role in Role:
        machine, state = ConnectionMachine(role), CS.CONNECTED
        for kind, sender in events:
            if kind == "close":  # the transport is gone: the diagrams' Disconnected
                machine.close()
                state = CS.DISCONNECTED
                continue
            assert isinstance(kind, FrameKind)
            if sender not in FROM[kind]:
                continue
            before = machine.state
            send = machine.send if sender is role else machine.receive
            after = CONNECTION[state].get(kind)
            if after is not None:
                send(kind)
                state = after
            else:
                with pytest.raises(UnexpectedFrameError):
                    send(kind)
                assert machine.state is before
            assert machine.state is state


def test_a_notify_answered_after_the_streams_eos() -> None:
    """A draft connector does not wait for NOTIFY_ACK, so a short stream may have sent its
    EOS before the answer: accepted, it stays closed; refused, it was never open here."""
    for answer, after in [(NotifyAck(True, 1, 0), SS.CLOSED), (NotifyAck(False, 1, 0), SS.INTRO)]:
        s = StreamMachine(C, 1)
        s.send(Notify(1, "s", 0))
        assert s.send(Message(1, 3, None, MessageFlags.EOS)) is SS.CLOSED
        assert s.receive(answer) is after
