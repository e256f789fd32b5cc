"""The handshake's state machine as a transition table, sans-IO.

The authenticated channel (:mod:`.channel`) has one handshake, three messages long, that
the links and the ingress both run (``docs/security.md``, *One authenticated channel*)::

    CHALLENGE  challenger -> responder   the challenger's nonce (and what it binds in)
    RESPONSE   responder -> challenger   the responder's nonce and its proof
    CONFIRM    challenger -> responder   the challenger's proof

It is written down once, as a table ``state -> message kind -> next state``
(:data:`TRANSITIONS`) naming who sends each kind (:data:`SENDERS`); the table one side
checks against is derived from it: :data:`TABLE`, keyed by ``(role, state, kind,
direction)``, and :data:`EXPECTED`, the one kind a side may receive in a state. Both
sides walk the same states, each as its own role: START, then CHALLENGED once the
CHALLENGE crossed, RESPONDED once the RESPONSE did, CONFIRMED once the CONFIRM did.
Seen from one side, START is "send or await the CHALLENGE", CHALLENGED is the
challenger's "await the RESPONSE", RESPONDED the responder's "await the CONFIRM".

Nothing is valid in CONFIRMED (the handshake is over: what follows is tagged frames,
:class:`~.channel.Channel`) nor in FAILED, where a side goes from any state when it
refuses a message (a bad proof, a malformed message, a message out of turn): it takes
nothing more, and its connection is closed. Each protocol maps the kinds to its own
messages: the links' CHALLENGE, RESPONSE and CONFIRM; the ingress's HELLO, AUTH and
WELCOME. Nothing here touches a socket, a clock or the bytes. The layout follows
``immortals/wallaroo/states.py``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from .errors import ChannelError

__all__ = [
    "EXPECTED",
    "SENDERS",
    "TABLE",
    "TRANSITIONS",
    "Direction",
    "HandshakeState",
    "MessageKind",
    "Role",
    "UnexpectedMessageError",
    "rule",
    "step",
]


class _Member(enum.Enum):
    """An enum hashed by identity: its members are singletons, and Enum's own
    ``__hash__`` is Python code run on every table lookup."""

    __hash__ = object.__hash__


class Role(_Member):
    """Which side's machine: the one that sends the first nonce, or the one that answers
    it with its own and proves the secret first. Links: the dialer challenges, the
    acceptor responds; the ingress: the server challenges, the client responds."""

    CHALLENGER = "challenger"
    RESPONDER = "responder"


class Direction(_Member):
    """Whether the side whose machine it is sends the message or receives it."""

    SEND = "send"
    RECEIVE = "receive"


class MessageKind(_Member):
    """The handshake's three messages."""

    CHALLENGE = "CHALLENGE"
    RESPONSE = "RESPONSE"
    CONFIRM = "CONFIRM"


class HandshakeState(_Member):
    """Where a handshake is: which of its messages have crossed (see the module)."""

    START = "start"
    CHALLENGED = "challenged"
    RESPONDED = "responded"
    CONFIRMED = "confirmed"
    FAILED = "failed"


K = MessageKind
S = HandshakeState
_C, _R = Role.CHALLENGER, Role.RESPONDER

SENDERS: Final[Mapping[MessageKind, Role]] = MappingProxyType(
    {K.CHALLENGE: _C, K.RESPONSE: _R, K.CONFIRM: _C}
)
"""Who sends each kind of message; the other side receives it."""

TRANSITIONS: Final[Mapping[HandshakeState, Mapping[MessageKind, HandshakeState]]] = (
    MappingProxyType(
        {
            S.START: MappingProxyType({K.CHALLENGE: S.CHALLENGED}),
            S.CHALLENGED: MappingProxyType({K.RESPONSE: S.RESPONDED}),
            S.RESPONDED: MappingProxyType({K.CONFIRM: S.CONFIRMED}),
            S.CONFIRMED: MappingProxyType({}),
            S.FAILED: MappingProxyType({}),
        }
    )
)
"""The handshake's transitions; CONFIRMED and FAILED admit nothing."""


def _per_role() -> Mapping[tuple[Role, HandshakeState, MessageKind, Direction], HandshakeState]:
    table: dict[tuple[Role, HandshakeState, MessageKind, Direction], HandshakeState] = {}
    for state, row in TRANSITIONS.items():
        for kind, after in row.items():
            for role in Role:
                direction = Direction.SEND if role is SENDERS[kind] else Direction.RECEIVE
                table[(role, state, kind, direction)] = after
    return MappingProxyType(table)


TABLE: Final = _per_role()
"""``(role, state, kind, direction) -> next state``; absent: invalid."""

EXPECTED: Final[Mapping[tuple[Role, HandshakeState], MessageKind]] = MappingProxyType(
    {
        (role, state): kind
        for (role, state, kind, direction) in TABLE
        if direction is Direction.RECEIVE
    }
)
"""``(role, state) -> the kind that side may receive there``; absent: it receives none
(its turn to send, or the handshake is over)."""


class UnexpectedMessageError(ChannelError):
    """A handshake message not valid where it met the machine: the wrong kind for the
    state, sent by the wrong side, or any message once the handshake is over or failed.
    ``role``, ``state`` and ``direction`` say whose machine, where, and whether that
    side sent the message or received it; ``kind`` which message."""

    def __init__(
        self, role: Role, state: HandshakeState, kind: MessageKind, direction: Direction
    ) -> None:
        verb = "sent" if direction is Direction.SEND else "received"
        super().__init__(
            f"the {role.value} {verb} {kind.name} in handshake state {state.name}: {rule(kind)}",
            kind=kind,
        )
        self.role = role
        self.state = state
        self.direction = direction

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[type[UnexpectedMessageError], tuple[Role, HandshakeState, MessageKind, Direction]]:
        assert self.kind is not None
        return (type(self), (self.role, self.state, self.kind, self.direction))


def rule(kind: MessageKind) -> str:
    """Where ``kind`` is valid: who sends it, in which state."""
    sender = SENDERS[kind]
    other = _R if sender is _C else _C
    states = [state.name for state, row in TRANSITIONS.items() if kind in row]
    return f"{kind.name} goes {sender.value} -> {other.value}, in state {' or '.join(states)}"


def step(
    role: Role, state: HandshakeState, kind: MessageKind, direction: Direction
) -> HandshakeState:
    """The state after ``role`` sends or receives a ``kind`` message in ``state``.

    Raises :class:`UnexpectedMessageError` if the message is not valid there.
    """
    after = TABLE.get((role, state, kind, direction))
    if after is None:
        raise UnexpectedMessageError(role, state, kind, direction)
    return after
