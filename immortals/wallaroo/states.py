"""The connector protocol's state machines as transition tables, sans-IO.

Owns two machines of seed 000: a connection's (*Protocol State Machine*, with the
MIGRATING state and MIGRATE / MIGRATION_ACK of the addendum 001) and each stream's
(*Stream State Machine*). Each is written down once, as a table ``state -> frame kind ->
next state`` naming who sends each kind (:data:`SENDERS`); the tables one side checks
against are derived from it: :data:`CONNECTION_TABLE` and :data:`STREAM_TABLE`, keyed by
``(role, state, frame kind, direction)``. The connector and the worker use the same
tables, each as its own role. Nothing here touches a socket, a clock or the bytes.

A frame *kind* is a frame class, refined where a field decides the next state: a draft
MESSAGE flagged EOS (:attr:`FrameKind.MESSAGE_EOS`, seed 000: "if the EOS flag is set the
next state is closed") and a NOTIFY_ACK that refuses the stream
(:attr:`FrameKind.NOTIFY_REFUSED`). :func:`kind_of` maps a frame to its kind.

A frame not valid where it meets the machine raises :class:`UnexpectedFrameError`, a
:class:`~.errors.ProtocolError`; the seed's answer is ERROR and a close, which the caller
sends. In ERROR and DISCONNECTED nothing is valid: the seed says data after an ERROR is
discarded, which is the caller's business (it has forgotten the connection by then).

Where the seed and the addendum leave a gap we chose, and say so once here:

- MIGRATE moves CONNECTED, HANDSHAKE and STREAMING to MIGRATING (the addendum's diagram:
  an arrow from each into Migrating; its text lists MIGRATE in CONNECTED with no next
  state).
- MIGRATING admits what may cross the MIGRATE on the wire or what the migration steps
  need (addendum, *Migration Protocol*: the connector EOSes its streams, the worker ACKs
  them): MESSAGE and MESSAGE_EOS, a NOTIFY sent before the MIGRATE arrived (answered by a
  refusal), ACK. The addendum's table lists only MIGRATE_OK and ERROR there.
- MIGRATION_ACK (the addendum's MIGRATE_OK) moves the old connection to DISCONNECTED: the
  addendum's "next state = connected" is the connector's *new* connection, already
  handshaken (steps 7 to 9); the worker closes the old one (step 10).
- RESTART moves STREAMING to DISCONNECTED: the released worker sends it and closes
  (reference); the addendum lists it in STREAMING without a next state.
- EOS_MESSAGE (v3) closes a stream as a MESSAGE flagged EOS does; v3 has no MIGRATE, so
  it never meets MIGRATING.
- An ACK may name a stream in any state, INTRO included: ACKs "can arrive
  asynchronously" (seed 000), so a late one may reach a stream the connector has since
  released or that a NOTIFY_ACK refused.
- A NOTIFY in OPEN keeps the stream OPEN ("the state machine will always end up in the
  open state after a notification"); a NOTIFY_REFUSED moves it back to INTRO, since a
  refusal says the stream is not open on this connection.
- NOTIFY_ACK and NOTIFY_REFUSED may also meet a CLOSED stream: a draft connector does
  not wait for them (the seed has no NOTIFY_ACK; a stream starts with its NOTIFY), so a
  short stream can send its EOS before the answer arrives. A refusal still means the
  stream was never open here, so it leads back to INTRO.
- NACKs stack (seed 000: "each NACK will require a NOTIFY"): a NACK in OPEN, CLOSED or
  RESET pushes one; a NOTIFY in RESET pops one and opens the stream only when none is
  left. The table says where a NOTIFY in RESET leads when it pops the last one;
  :class:`StreamMachine` (or :func:`stream_step`) keeps the count. MESSAGE frames of a
  reset stream are valid and ignored (seed 000, *Acks and Nacks*).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from .errors import ProtocolError
from .frames import (
    Ack,
    EosMessage,
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
    Restart,
)

__all__ = [
    "CONNECTION_TABLE",
    "CONNECTION_TRANSITIONS",
    "SENDERS",
    "STREAM_KINDS",
    "STREAM_TABLE",
    "STREAM_TRANSITIONS",
    "ConnectionMachine",
    "ConnectionState",
    "Direction",
    "FrameKind",
    "Role",
    "StreamMachine",
    "StreamState",
    "UnexpectedFrameError",
    "connection_step",
    "kind_of",
    "stream_step",
]


class _Member(enum.Enum):
    """An enum hashed by identity: its members are singletons (pickling gives the same
    object back), and Enum's own ``__hash__`` is Python code run on every table lookup
    of a frame."""

    __hash__ = object.__hash__


class Role(_Member):
    """Which side's machine: the connector's or the worker's."""

    CONNECTOR = "connector"
    WORKER = "worker"


class Direction(_Member):
    """Whether the side whose machine it is sends the frame or receives it."""

    SEND = "send"
    RECEIVE = "receive"


class ConnectionState(_Member):
    """A connection's states (seed 000 and addendum 001, *Protocol State Machine*)."""

    CONNECTED = "connected"
    HANDSHAKE = "handshake"
    STREAMING = "streaming"
    MIGRATING = "migrating"
    ERROR = "error"
    DISCONNECTED = "disconnected"


class StreamState(_Member):
    """A stream's states during a session (seed 000, *Stream State Machine*)."""

    INTRO = "intro"
    OPEN = "open"
    CLOSED = "closed"
    RESET = "reset"


class FrameKind(_Member):
    """A frame class, refined where a field decides the next state (see the module)."""

    HELLO = "HELLO"
    OK = "OK"
    ERROR = "ERROR"
    NOTIFY = "NOTIFY"
    NOTIFY_ACK = "NOTIFY_ACK"
    """A NOTIFY_ACK whose ``success`` is true: the stream is open on this connection."""
    NOTIFY_REFUSED = "NOTIFY_REFUSED"
    """A NOTIFY_ACK whose ``success`` is false."""
    MESSAGE = "MESSAGE"
    MESSAGE_EOS = "MESSAGE_EOS"
    """A draft MESSAGE flagged EOS: the last of its stream."""
    EOS_MESSAGE = "EOS_MESSAGE"
    """v3's EOS_MESSAGE."""
    ACK = "ACK"
    NACK = "NACK"
    RESTART = "RESTART"
    MIGRATE = "MIGRATE"
    MIGRATION_ACK = "MIGRATION_ACK"


K = FrameKind
_S = TypeVar("_S", ConnectionState, StreamState)
_C, _W = Role.CONNECTOR, Role.WORKER
_BOTH: Final = frozenset(Role)

SENDERS: Final[Mapping[FrameKind, frozenset[Role]]] = MappingProxyType(
    {
        K.HELLO: frozenset({_C}),
        K.OK: frozenset({_W}),
        K.ERROR: _BOTH,  # seed 000: "ERROR: * -> *"
        K.NOTIFY: frozenset({_C}),
        K.NOTIFY_ACK: frozenset({_W}),
        K.NOTIFY_REFUSED: frozenset({_W}),
        K.MESSAGE: frozenset({_C}),
        K.MESSAGE_EOS: frozenset({_C}),
        K.EOS_MESSAGE: frozenset({_C}),
        K.ACK: frozenset({_W}),
        K.NACK: frozenset({_W}),
        K.RESTART: frozenset({_W}),
        K.MIGRATE: frozenset({_W}),
        K.MIGRATION_ACK: frozenset({_C}),
    }
)
"""Who sends each kind of frame (seed 000's lists "Connector -> Worker" and the like)."""

_CLASS: Final[Mapping[FrameKind, type[object]]] = MappingProxyType(
    {
        K.HELLO: Hello,
        K.OK: Ok,
        K.ERROR: Error,
        K.NOTIFY: Notify,
        K.NOTIFY_ACK: NotifyAck,
        K.NOTIFY_REFUSED: NotifyAck,
        K.MESSAGE: Message,
        K.MESSAGE_EOS: Message,
        K.EOS_MESSAGE: EosMessage,
        K.ACK: Ack,
        K.NACK: Nack,
        K.RESTART: Restart,
        K.MIGRATE: Migrate,
        K.MIGRATION_ACK: MigrationAck,
    }
)

_PLAIN_KIND: Final[Mapping[type[object], FrameKind]] = MappingProxyType(
    {cls: kind for kind, cls in reversed(list(_CLASS.items()))}
)


def kind_of(frame: Frame) -> FrameKind:
    """The kind of ``frame``: its class, refined by MESSAGE's EOS flag and NOTIFY_ACK's
    success. TypeError for what is not a frame."""
    cls = type(frame)
    if cls is Message:  # flags are mostly 0, and a test of an IntFlag's bits is slow
        return K.MESSAGE_EOS if frame.flags and frame.eos else K.MESSAGE  # type: ignore[union-attr]
    if cls is NotifyAck:
        return K.NOTIFY_ACK if frame.success else K.NOTIFY_REFUSED  # type: ignore[union-attr]
    kind = _PLAIN_KIND.get(cls)
    if kind is None:
        raise TypeError(f"{cls.__name__} is not a connector frame")
    return kind


# --- the tables, as the seed writes them: state -> kind -> next state --------------------

CS = ConnectionState

CONNECTION_TRANSITIONS: Final[Mapping[ConnectionState, Mapping[FrameKind, ConnectionState]]] = (
    MappingProxyType(
        {
            CS.CONNECTED: MappingProxyType(
                {K.HELLO: CS.HANDSHAKE, K.MIGRATE: CS.MIGRATING, K.ERROR: CS.ERROR}
            ),
            CS.HANDSHAKE: MappingProxyType(
                {K.OK: CS.STREAMING, K.MIGRATE: CS.MIGRATING, K.ERROR: CS.ERROR}
            ),
            CS.STREAMING: MappingProxyType(
                {
                    K.NOTIFY: CS.STREAMING,
                    K.NOTIFY_ACK: CS.STREAMING,
                    K.NOTIFY_REFUSED: CS.STREAMING,
                    K.MESSAGE: CS.STREAMING,
                    K.MESSAGE_EOS: CS.STREAMING,
                    K.EOS_MESSAGE: CS.STREAMING,
                    K.ACK: CS.STREAMING,
                    K.NACK: CS.STREAMING,
                    K.RESTART: CS.DISCONNECTED,
                    K.MIGRATE: CS.MIGRATING,
                    K.ERROR: CS.ERROR,
                }
            ),
            CS.MIGRATING: MappingProxyType(
                {
                    K.NOTIFY: CS.MIGRATING,  # sent before the MIGRATE arrived; refused
                    K.NOTIFY_REFUSED: CS.MIGRATING,
                    K.MESSAGE: CS.MIGRATING,
                    K.MESSAGE_EOS: CS.MIGRATING,  # addendum step 3
                    K.ACK: CS.MIGRATING,  # addendum step 6
                    K.MIGRATION_ACK: CS.DISCONNECTED,  # steps 9 and 10
                    K.ERROR: CS.ERROR,
                }
            ),
            CS.ERROR: MappingProxyType({}),
            CS.DISCONNECTED: MappingProxyType({}),
        }
    )
)
"""A connection's transitions as the seed and the addendum list them (see the module for
the gaps we filled). ERROR and DISCONNECTED admit nothing."""

SS = StreamState
STREAM_TRANSITIONS: Final[Mapping[StreamState, Mapping[FrameKind, StreamState]]] = MappingProxyType(
    {
        SS.INTRO: MappingProxyType({K.NOTIFY: SS.OPEN, K.ACK: SS.INTRO}),
        SS.OPEN: MappingProxyType(
            {
                K.NOTIFY: SS.OPEN,
                K.NOTIFY_ACK: SS.OPEN,
                K.NOTIFY_REFUSED: SS.INTRO,
                K.MESSAGE: SS.OPEN,
                K.MESSAGE_EOS: SS.CLOSED,
                K.EOS_MESSAGE: SS.CLOSED,
                K.ACK: SS.OPEN,
                K.NACK: SS.RESET,
            }
        ),
        SS.CLOSED: MappingProxyType(
            {
                K.NOTIFY: SS.OPEN,
                K.NOTIFY_ACK: SS.CLOSED,  # the answer came after the EOS (draft)
                K.NOTIFY_REFUSED: SS.INTRO,
                K.ACK: SS.CLOSED,
                K.NACK: SS.RESET,
            }
        ),
        SS.RESET: MappingProxyType(
            {
                K.NOTIFY: SS.OPEN,  # when it pops the last NACK; RESET while more remain
                K.NOTIFY_ACK: SS.RESET,
                K.MESSAGE: SS.RESET,  # ignored until the NOTIFY (seed 000)
                K.MESSAGE_EOS: SS.RESET,
                K.EOS_MESSAGE: SS.RESET,
                K.ACK: SS.RESET,
                K.NACK: SS.RESET,  # one more on the stack
            }
        ),
    }
)
"""A stream's transitions (seed 000, *Stream State Machine*; see the module)."""

STREAM_KINDS: Final = frozenset(kind for row in STREAM_TRANSITIONS.values() for kind in row)
"""The kinds that name a stream (an ACK names one per (stream, point) pair)."""


def _per_role(
    transitions: Mapping[_S, Mapping[FrameKind, _S]],
) -> Mapping[tuple[Role, _S, FrameKind, Direction], _S]:
    table: dict[tuple[Role, _S, FrameKind, Direction], _S] = {}
    for state, row in transitions.items():
        for kind, after in row.items():
            for sender in SENDERS[kind]:
                for role in Role:
                    direction = Direction.SEND if role is sender else Direction.RECEIVE
                    table[(role, state, kind, direction)] = after
    return MappingProxyType(table)


CONNECTION_TABLE: Final = _per_role(CONNECTION_TRANSITIONS)
"""``(role, state, kind, direction) -> next state`` for a connection; absent: invalid."""

STREAM_TABLE: Final = _per_role(STREAM_TRANSITIONS)
"""``(role, state, kind, direction) -> next state`` for a stream; absent: invalid. A
NOTIFY in RESET leads to OPEN only when it pops the last NACK (:func:`stream_step`)."""


# --- the error --------------------------------------------------------------------------


class UnexpectedFrameError(ProtocolError):
    """A frame not valid in the state it met (seed 000: answered with ERROR and a close).

    ``machine`` is ``"connection"`` or ``"stream"``, ``role`` whose machine it is,
    ``state`` the state it was in, ``kind`` the frame kind, ``direction`` whether that
    side sent or received it, ``stream_id`` the stream (stream machine only). ``frame``
    is the frame class's name and ``reason`` the whole message. A state machine sees
    frames, not bytes: ``dialect`` is ``""`` and ``offset`` is -1.
    """

    def __init__(
        self,
        machine: str,
        role: Role,
        state: ConnectionState | StreamState,
        kind: FrameKind,
        direction: Direction,
        stream_id: int | None = None,
    ) -> None:
        verb = "sent" if direction is Direction.SEND else "received"
        where = f"{machine} state {state.name}"
        if stream_id is not None:
            where = f"stream state {state.name} (stream {stream_id})"
        reason = f"the {role.value} {verb} {kind.name} in {where}: {_rule(machine, kind)}"
        super().__init__("", _CLASS[kind].__name__, None, -1, reason)
        self.args = (reason,)  # the seed's terms read better than "at offset -1"
        self.machine = machine
        self.role = role
        self.state = state
        self.kind = kind
        self.direction = direction
        self.stream_id = stream_id

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[
        type[UnexpectedFrameError],
        tuple[str, Role, ConnectionState | StreamState, FrameKind, Direction, int | None],
    ]:
        return (
            type(self),
            (self.machine, self.role, self.state, self.kind, self.direction, self.stream_id),
        )


def _rule(machine: str, kind: FrameKind) -> str:
    """Where ``kind`` is valid, in the seed's terms: who sends it, in which states."""
    senders = SENDERS[kind]
    if senders == _BOTH:
        way = "either way"
    else:
        (sender,) = senders
        other = _W if sender is _C else _C
        way = f"{sender.value} -> {other.value}"
    transitions: Mapping[enum.Enum, Mapping[FrameKind, enum.Enum]] = (
        CONNECTION_TRANSITIONS if machine == "connection" else STREAM_TRANSITIONS  # type: ignore[assignment]
    )
    states = [state.name for state, row in transitions.items() if kind in row]
    return f"{kind.name} goes {way}, in {machine} state {' or '.join(states) or 'none'}"


# --- stepping ---------------------------------------------------------------------------


def connection_step(
    role: Role, state: ConnectionState, kind: FrameKind, direction: Direction
) -> ConnectionState:
    """The connection state after ``role`` sends or receives a ``kind`` frame in ``state``.

    Raises :class:`UnexpectedFrameError` if the frame is not valid there.
    """
    after = CONNECTION_TABLE.get((role, state, kind, direction))
    if after is None:
        raise UnexpectedFrameError("connection", role, state, kind, direction)
    return after


def stream_step(
    role: Role,
    state: StreamState,
    nacks: int,
    kind: FrameKind,
    direction: Direction,
    stream_id: int | None = None,
) -> tuple[StreamState, int]:
    """The stream's state and its stack of NACKs after a ``kind`` frame in ``state``.

    A NACK pushes one; a NOTIFY in RESET pops one and opens the stream only when none
    is left (seed 000: "each NACK will require a NOTIFY"). Raises
    :class:`UnexpectedFrameError` (naming ``stream_id``) if the frame is not valid there.
    """
    after = STREAM_TABLE.get((role, state, kind, direction))
    if after is None:
        raise UnexpectedFrameError("stream", role, state, kind, direction, stream_id)
    if kind is K.NACK:
        return after, nacks + 1
    if kind is K.NOTIFY and state is SS.RESET:
        nacks -= 1
        return (after if nacks == 0 else SS.RESET), nacks
    return after, nacks


# --- machines: the state one side keeps ---------------------------------------------------


def _kind(frame: Frame | FrameKind) -> FrameKind:
    return frame if isinstance(frame, FrameKind) else kind_of(frame)


class ConnectionMachine:
    """One side's view of one connection, starting in CONNECTED (h11's ConnectionState).

    :meth:`send` and :meth:`receive` take a frame or a frame kind, move the state and
    return it, or raise :class:`UnexpectedFrameError` and stay where they were.
    """

    __slots__ = ("role", "state")

    def __init__(self, role: Role, state: ConnectionState = CS.CONNECTED) -> None:
        self.role = role
        self.state = state

    def send(self, frame: Frame | FrameKind) -> ConnectionState:
        self.state = connection_step(self.role, self.state, _kind(frame), Direction.SEND)
        return self.state

    def receive(self, frame: Frame | FrameKind) -> ConnectionState:
        self.state = connection_step(self.role, self.state, _kind(frame), Direction.RECEIVE)
        return self.state

    def close(self) -> ConnectionState:
        """The transport is gone: DISCONNECTED from any state (seed 000's diagram)."""
        self.state = CS.DISCONNECTED
        return self.state

    def __getstate__(self) -> tuple[Role, ConnectionState]:
        return (self.role, self.state)

    def __setstate__(self, state: tuple[Role, ConnectionState]) -> None:
        self.role, self.state = state

    def __repr__(self) -> str:
        return f"ConnectionMachine({self.role.name}, {self.state.name})"


class StreamMachine:
    """One side's view of one stream on a connection, starting in INTRO.

    ``nacks`` counts the NACKs not yet answered by a NOTIFY (the seed's stack). Frames
    of other kinds than :data:`STREAM_KINDS` are a TypeError here (not a protocol error:
    the caller routes only stream frames to a stream).
    """

    __slots__ = ("nacks", "role", "state", "stream_id")

    def __init__(
        self, role: Role, stream_id: int, state: StreamState = SS.INTRO, nacks: int = 0
    ) -> None:
        self.role = role
        self.stream_id = stream_id
        self.state = state
        self.nacks = nacks

    def _step(self, frame: Frame | FrameKind, direction: Direction) -> StreamState:
        kind = _kind(frame)
        if kind not in STREAM_KINDS:
            raise TypeError(f"{kind.name} names no stream")
        self.state, self.nacks = stream_step(
            self.role, self.state, self.nacks, kind, direction, self.stream_id
        )
        return self.state

    def send(self, frame: Frame | FrameKind) -> StreamState:
        return self._step(frame, Direction.SEND)

    def receive(self, frame: Frame | FrameKind) -> StreamState:
        return self._step(frame, Direction.RECEIVE)

    def __getstate__(self) -> tuple[Role, int, StreamState, int]:
        return (self.role, self.stream_id, self.state, self.nacks)

    def __setstate__(self, state: tuple[Role, int, StreamState, int]) -> None:
        self.role, self.stream_id, self.state, self.nacks = state

    def __repr__(self) -> str:
        return (
            f"StreamMachine({self.role.name}, {self.stream_id}, {self.state.name}, "
            f"nacks={self.nacks})"
        )
