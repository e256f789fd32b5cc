"""The flow connection's transition table, event by event in every state, through the
public calls: each state is reached with real bytes, each event made by a real call.

What is expected comes from seed 004 and the reference (*ConnectPacket*, *Protocol
compatibility*): the peer's ConnectPacket comes first and decides compatible or not; an
incompatible peer is sent pings only; nothing follows the end of the stream or a
protocol error; our ConnectPacket may go before or after the peer's.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

import pytest

from ambrosia_py.flow import (
    ConnectionState,
    ConnectPacket,
    ConnectPacketError,
    FlowConnection,
    FlowStateError,
    Token,
    WellKnown,
)
from ambrosia_py.flow.connection import (
    TRANSITIONS,
    ConnectionEvent,
    UnexpectedEventError,
)

S, E = ConnectionState, ConnectionEvent
PING = Token.well_known(WellKnown.PING)
TOKEN = Token(7, 9)
DIALER = ConnectPacket.current(canonical_port=4500, connection_id=1, canonical_ipv4=0x7F000001)
ACCEPTOR = ConnectPacket.current(canonical_port=4501, connection_id=2, canonical_ipv4=0x7F000001)
OTHER = ConnectPacket(0x1FDB_00B0_7400_0000, 1, 4, 2)  # another version: incompatible
TOO_LONG = (41).to_bytes(4, "little") + DIALER.encode()[4:]  # a length over 40


def _reach(state: ConnectionState) -> FlowConnection:
    """An acceptor brought to ``state`` by what a peer sends (our packet not sent)."""
    conn = FlowConnection(ACCEPTOR, dialer=False)
    if state is S.COMPATIBLE:
        conn.receive_data(DIALER.encode())
    elif state is S.INCOMPATIBLE:
        conn.receive_data(OTHER.encode())
    elif state is S.CLOSED:
        conn.receive_data(b"")
    elif state is S.ERROR:
        with pytest.raises(ConnectPacketError):
            conn.receive_data(TOO_LONG)
    assert conn.state is state
    return conn


def _sent(conn: FlowConnection) -> FlowConnection:
    """``conn`` with our ConnectPacket sent where that is allowed."""
    if conn.state not in (S.CLOSED, S.ERROR):
        conn.connect_packet_bytes()
    return conn


# Each event, made by a public call on a connection. DATA is one byte: too little to
# finish a ConnectPacket or a frame header, so it never completes anything.
CALLS: dict[ConnectionEvent, Callable[[FlowConnection], object]] = {
    E.DATA: lambda c: c.receive_data(b"\x00"),
    E.END: lambda c: c.receive_data(b""),
    E.SEND_CONNECT_PACKET: lambda c: c.connect_packet_bytes(),
    E.SEND_FRAME: lambda c: _sent(c).send(TOKEN, b"x"),
    E.SEND_PING: lambda c: _sent(c).send(PING, b""),
}

# (state, event) -> the state after it, or None where it is refused.
EXPECTED: dict[tuple[ConnectionState, ConnectionEvent], ConnectionState | None] = {
    (S.AWAIT_PEER, E.DATA): S.AWAIT_PEER,
    (S.AWAIT_PEER, E.END): S.CLOSED,
    (S.AWAIT_PEER, E.SEND_CONNECT_PACKET): S.AWAIT_PEER,  # the dialer sends it at once
    (S.AWAIT_PEER, E.SEND_FRAME): None,  # nothing before the peer's packet
    (S.AWAIT_PEER, E.SEND_PING): None,
    (S.COMPATIBLE, E.DATA): S.COMPATIBLE,
    (S.COMPATIBLE, E.END): S.CLOSED,
    (S.COMPATIBLE, E.SEND_CONNECT_PACKET): S.COMPATIBLE,  # the acceptor may send it late
    (S.COMPATIBLE, E.SEND_FRAME): S.COMPATIBLE,
    (S.COMPATIBLE, E.SEND_PING): S.COMPATIBLE,
    (S.INCOMPATIBLE, E.DATA): S.INCOMPATIBLE,  # kept open, its bytes ignored
    (S.INCOMPATIBLE, E.END): S.CLOSED,
    (S.INCOMPATIBLE, E.SEND_CONNECT_PACKET): S.INCOMPATIBLE,
    (S.INCOMPATIBLE, E.SEND_FRAME): None,  # pings only
    (S.INCOMPATIBLE, E.SEND_PING): S.INCOMPATIBLE,
    (S.CLOSED, E.DATA): None,
    (S.CLOSED, E.END): None,
    (S.CLOSED, E.SEND_CONNECT_PACKET): None,
    (S.CLOSED, E.SEND_FRAME): None,
    (S.CLOSED, E.SEND_PING): None,
    (S.ERROR, E.SEND_CONNECT_PACKET): None,
    (S.ERROR, E.SEND_FRAME): None,
    (S.ERROR, E.SEND_PING): None,
}


@pytest.mark.parametrize(("state", "event"), list(EXPECTED), ids=lambda x: x.name)
def test_each_event_in_each_state(state: ConnectionState, event: ConnectionEvent) -> None:
    conn = _reach(state)
    after = EXPECTED[(state, event)]
    if after is not None:
        CALLS[event](conn)
        assert conn.state is after
        return
    with pytest.raises(UnexpectedEventError) as info:
        CALLS[event](conn)
    err = info.value
    assert isinstance(err, FlowStateError)
    assert (err.state, err.event) == (state, event)
    assert f"in flow connection state {state.name}" in str(err)
    assert str(err).startswith(event.value)
    assert conn.state is state  # a refused event moves nothing


def test_a_failed_connection_raises_its_own_error_again() -> None:
    conn = _reach(S.ERROR)
    for data in (b"\x00", b""):
        with pytest.raises(ConnectPacketError, match="larger than 40"):
            conn.receive_data(data)
    assert conn.state is S.ERROR


def test_the_table_is_whole_and_pings_go_wherever_frames_do() -> None:
    assert set(TRANSITIONS) == set(S)
    assert TRANSITIONS[S.CLOSED] == {} and TRANSITIONS[S.ERROR] == {}
    reached = {after for row in TRANSITIONS.values() for after in row.values()}
    assert reached == set(S)  # every state is reachable, and only through the table
    for row in TRANSITIONS.values():
        if E.SEND_FRAME in row:  # the send path takes a ping as any frame there
            assert row.get(E.SEND_PING) is row[E.SEND_FRAME]


def test_the_error_pickles_with_its_fields() -> None:
    err = UnexpectedEventError(S.INCOMPATIBLE, E.SEND_FRAME, f" to {TOKEN}")
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is UnexpectedEventError
    assert (back.state, back.event, back.detail, str(back)) == (
        err.state,
        err.event,
        err.detail,
        str(err),
    )
    assert "only pings may be sent" in str(back)
