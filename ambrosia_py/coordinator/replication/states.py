"""The replicated log's state machines as transition tables, sans-IO.

Three machines, each written down once as ``state -> event -> next state`` (the layout
of ``immortals/wallaroo/states.py`` and ``ambrosia_py/auth/states.py``); the cores
(:mod:`.primary`, :mod:`.secondary`) move only through :func:`step`, which raises
:class:`UnexpectedEventError` naming the machine, the state and the event when the table
has no entry. What a core *does* on a transition is its own code; which transitions
exist, and so what can follow what, is here.

A secondary's (:data:`SECONDARY`): it holds an epoch and follows that epoch's primary.

- JOINING: not synced to the epoch's primary. It writes nothing and acknowledges
  nothing; whatever the primary sends it answers with its :class:`~.messages.Position`.
- STREAMING: synced (a SYNC truncated what disagreed and gave it the primary's
  history). It appends what the primary ships, acknowledges what is durable.
- INSTALLING: taking a checkpoint in chunks, in whatever order they come, because the
  primary's log no longer holds where its own ends. It appends nothing meanwhile, and
  gives the transfer up when no chunk has come for a while (STALLED).

Every message of the current primary may arrive in every state (the network delays and
reorders), so the table is total over them: a message out of place is answered or
ignored, never an error. A higher epoch (HIGHER_EPOCH) sends every state to JOINING.
The check before a take-over (PROBE, SILENCE) moves no machine, whatever its epoch: the
cores answer or count it before they look at a table (:mod:`.secondary`).

The primary's term (:data:`TERM`): GATHERING until a quorum of replicas has answered
its NEW_TERM with positions none of which is ahead of its own (QUORUM), then
ESTABLISHED; DEPOSED once it meets a higher epoch, finds it can never gather such a
quorum, or runs out of time (OUTRANKED), or has handed the role over (ASK, then
HANDED). Acknowledgements and resend requests belong to ESTABLISHED only: nobody is
synced before it, so nobody may send them.

The primary's feed of one secondary (:data:`FEED`): UNKNOWN until its position is in,
then READING (fed from the log, a read at a time), STREAMING (caught up: each record
goes out as it is appended) or CHECKPOINT (its log ends below what the primary's log
still holds, so it is sent the checkpoint; the replica's RESEND after installing it
moves the feed on).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final, TypeVar

from .errors import ReplicationRuleError

__all__ = [
    "FEED",
    "SECONDARY",
    "TERM",
    "FeedEvent",
    "FeedState",
    "SecondaryEvent",
    "SecondaryState",
    "TermEvent",
    "TermState",
    "UnexpectedEventError",
    "step",
]


class SecondaryState(enum.Enum):
    JOINING = "joining"
    STREAMING = "streaming"
    INSTALLING = "installing"


class SecondaryEvent(enum.Enum):
    """What reaches a secondary from the primary of its epoch, as the table tells it
    apart (a checkpoint chunk by where it falls), and its own stalled transfer."""

    NEW_TERM = "NEW_TERM"
    SYNC = "SYNC"
    SYNC_APART = "SYNC_APART"
    """A SYNC whose history shares no epoch with this log's, where this log holds records
    below the primary's first entry (compacted away): nothing of it is vouched for, and
    it waits for the primary's checkpoint to start over from (INSTALLING)."""
    APPEND = "APPEND"
    HEARTBEAT = "HEARTBEAT"
    TRIM = "TRIM"
    """Trim points for the outboxes: taken in every state (they are facts about the
    destinations, whatever this log holds)."""
    ROLL = "ROLL"
    """A checkpoint asked for: taken while STREAMING (the replay follows the primary's
    log), ignored otherwise (the primary asks again at its next roll)."""
    CHUNK = "CHUNK"
    """A chunk of a checkpoint this log needs (it ends below the checkpoint's seq) that
    leaves the checkpoint incomplete."""
    CHUNK_LAST = "CHUNK_LAST"
    """The chunk that completes the checkpoint, in whatever order they came."""
    CHUNK_STALE = "CHUNK_STALE"
    """A chunk of a checkpoint this log does not need: it reaches that seq already."""
    HANDOVER = "HANDOVER"
    """The primary steps down for a replica: taken in every state (that replica, or the
    role left to it for a while)."""
    HIGHER_EPOCH = "HIGHER_EPOCH"
    STALLED = "STALLED"
    """No chunk for a while: the transfer is given up."""


class TermState(enum.Enum):
    GATHERING = "gathering"
    ESTABLISHED = "established"
    DEPOSED = "deposed"


class TermEvent(enum.Enum):
    POSITION = "POSITION"
    QUORUM = "QUORUM"
    OUTRANKED = "OUTRANKED"
    HIGHER_EPOCH = "HIGHER_EPOCH"
    ACK = "ACK"
    RESEND = "RESEND"
    APPEND = "APPEND"
    """The adapter hands the primary new records."""
    READ = "READ"
    """The adapter hands the primary records or checkpoint bytes it asked for."""
    DURABLE = "DURABLE"
    TICK = "TICK"
    ROLL = "ROLL"
    """The adapter rolled the log: a secondary is asked for the checkpoint there."""
    TAKEN = "TAKEN"
    """A chunk of the checkpoint a secondary took for a roll."""
    ASK = "ASK"
    """A replica started to upgrade asks for the role: nothing more is shipped."""
    HANDED = "HANDED"
    """That replica holds everything shipped: the term ends, handed over."""


class FeedState(enum.Enum):
    UNKNOWN = "unknown"
    READING = "reading"
    STREAMING = "streaming"
    CHECKPOINT = "checkpoint"


class FeedEvent(enum.Enum):
    BEHIND = "BEHIND"
    """Its position or resend request is at a seq the log holds, below the log's end;
    or new records found it with too much unacknowledged."""
    CAUGHT_UP = "CAUGHT_UP"
    """What was sent reaches the log's end."""
    PRUNED = "PRUNED"
    """It needs records the log no longer holds."""


SS, SE = SecondaryState, SecondaryEvent
_S = TypeVar("_S", bound=enum.Enum)
_E = TypeVar("_E", bound=enum.Enum)


def _table(rows: dict[_S, dict[_E, _S]]) -> Mapping[_S, Mapping[_E, _S]]:
    return MappingProxyType({state: MappingProxyType(row) for state, row in rows.items()})


SECONDARY: Final = _table(
    {
        SS.JOINING: {
            SE.ROLL: SS.JOINING,
            SE.NEW_TERM: SS.JOINING,
            SE.SYNC: SS.STREAMING,
            SE.SYNC_APART: SS.INSTALLING,
            SE.APPEND: SS.JOINING,
            SE.HEARTBEAT: SS.JOINING,
            SE.TRIM: SS.JOINING,
            SE.CHUNK: SS.JOINING,
            SE.CHUNK_LAST: SS.JOINING,
            SE.CHUNK_STALE: SS.JOINING,
            SE.HANDOVER: SS.JOINING,
            SE.HIGHER_EPOCH: SS.JOINING,
        },
        SS.STREAMING: {
            SE.ROLL: SS.STREAMING,
            SE.NEW_TERM: SS.STREAMING,
            SE.SYNC: SS.STREAMING,
            SE.SYNC_APART: SS.INSTALLING,
            SE.APPEND: SS.STREAMING,
            SE.HEARTBEAT: SS.STREAMING,
            SE.TRIM: SS.STREAMING,
            SE.CHUNK: SS.INSTALLING,
            SE.CHUNK_LAST: SS.STREAMING,
            SE.CHUNK_STALE: SS.STREAMING,
            SE.HANDOVER: SS.STREAMING,
            SE.HIGHER_EPOCH: SS.JOINING,
        },
        SS.INSTALLING: {
            SE.ROLL: SS.INSTALLING,
            SE.NEW_TERM: SS.JOINING,
            SE.SYNC: SS.STREAMING,
            SE.SYNC_APART: SS.INSTALLING,
            SE.APPEND: SS.INSTALLING,
            SE.HEARTBEAT: SS.INSTALLING,
            SE.TRIM: SS.INSTALLING,
            SE.CHUNK: SS.INSTALLING,
            SE.CHUNK_LAST: SS.STREAMING,
            SE.CHUNK_STALE: SS.INSTALLING,
            SE.HANDOVER: SS.INSTALLING,
            SE.HIGHER_EPOCH: SS.JOINING,
            SE.STALLED: SS.JOINING,
        },
    }
)
"""A secondary's transitions (see the module). JOINING drops chunks (it answers with
its position: the SYNC they follow went missing); a SYNC in INSTALLING gives the
transfer up (the primary starts a new one if it still must)."""

TS, TE = TermState, TermEvent

TERM: Final = _table(
    {
        TS.GATHERING: {
            TE.POSITION: TS.GATHERING,
            TE.DURABLE: TS.GATHERING,
            TE.TICK: TS.GATHERING,
            TE.QUORUM: TS.ESTABLISHED,
            TE.OUTRANKED: TS.DEPOSED,
            TE.HIGHER_EPOCH: TS.DEPOSED,
        },
        TS.ESTABLISHED: {
            TE.POSITION: TS.ESTABLISHED,
            TE.DURABLE: TS.ESTABLISHED,
            TE.TICK: TS.ESTABLISHED,
            TE.ACK: TS.ESTABLISHED,
            TE.RESEND: TS.ESTABLISHED,
            TE.APPEND: TS.ESTABLISHED,
            TE.READ: TS.ESTABLISHED,
            TE.ROLL: TS.ESTABLISHED,
            TE.TAKEN: TS.ESTABLISHED,
            TE.ASK: TS.ESTABLISHED,
            TE.HANDED: TS.DEPOSED,
            TE.HIGHER_EPOCH: TS.DEPOSED,
        },
        TS.DEPOSED: {},
    }
)
"""The primary's term: what it may take in each state, and where it leads."""

FS, FE = FeedState, FeedEvent

FEED: Final = _table(
    {
        FS.UNKNOWN: {FE.BEHIND: FS.READING, FE.CAUGHT_UP: FS.STREAMING, FE.PRUNED: FS.CHECKPOINT},
        FS.READING: {FE.BEHIND: FS.READING, FE.CAUGHT_UP: FS.STREAMING, FE.PRUNED: FS.CHECKPOINT},
        FS.STREAMING: {FE.BEHIND: FS.READING, FE.CAUGHT_UP: FS.STREAMING, FE.PRUNED: FS.CHECKPOINT},
        FS.CHECKPOINT: {
            FE.BEHIND: FS.READING,
            FE.CAUGHT_UP: FS.STREAMING,
            FE.PRUNED: FS.CHECKPOINT,
        },
    }
)
"""How the primary feeds one secondary: every state may lead to every other, since a
secondary's answer (a position, a resend request) can put it anywhere; UNKNOWN is only
where a feed starts."""


class UnexpectedEventError(ReplicationRuleError):
    """An event the machine's table has no entry for in its state."""

    def __init__(self, machine: str, state: enum.Enum, event: enum.Enum) -> None:
        super().__init__(f"{machine}: {event.name} is not valid in state {state.name}")
        self.machine = machine
        self.state = state
        self.event = event


def step(machine: str, table: Mapping[_S, Mapping[_E, _S]], state: _S, event: _E) -> _S:
    """The state after ``event`` in ``state`` per ``table``; raises
    :class:`UnexpectedEventError` (naming ``machine``) if there is none."""
    after = table[state].get(event)
    if after is None:
        raise UnexpectedEventError(machine, state, event)
    return after
