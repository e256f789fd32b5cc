"""The primary's checkpoints, taken by a secondary: the primary never pauses to
checkpoint. When the adapter rolls its log (:meth:`Rolling.rolled`), the streaming
secondary of the group that has acknowledged the most is asked (ROLL) for the state
before the roll point, which its binding takes as it replays; the chunks it sends back
(TAKEN) are kept aside (:class:`~.events.StoreCheckpointChunk`) and, once whole, kept as
the checkpoint of the log that starts there (:class:`~.events.CheckpointTaken`). Only
the last roll's checkpoint is taken; one that never comes is asked for again at the next
roll.

:class:`Rolling` is a part of :class:`~.primary.Primary`, apart by concern.
"""

from __future__ import annotations

from collections import deque

from .chunks import ChunkTransfer
from .errors import ReplicationRuleError
from .events import CheckpointTaken, Event, StoreCheckpointChunk
from .feeds import Feed
from .group import Group
from .messages import Message, Roll, TakenChunk
from .states import TERM, FeedState, TermEvent, TermState, step

__all__ = ["Rolling"]


class Rolling:
    """A primary's checkpoints taken by its secondaries (see the module)."""

    epoch: int
    group: Group
    state: TermState
    log_end: int
    _events: deque[Event]
    _feeds: dict[int, Feed]
    _handing: tuple[int, int, float] | None
    _rolled: tuple[int, int] | None  # (seq, replica) asked at the last roll
    _taken: ChunkTransfer | None  # what came of that checkpoint so far

    def _send(self, to: int, msg: Message, now: float) -> None:
        """Send ``msg`` to replica ``to`` (the core's)."""
        raise NotImplementedError

    def rolled(self, seq: int, now: float) -> int | None:
        """The adapter rolled its log at ``seq``, its end (the records below are in older
        files), and would keep the state there as its checkpoint: the streaming
        secondary that has acknowledged the most (the lowest number of those tied) is
        asked for it. Returns that replica; None if none can be asked now (the term not
        established, or no secondary keeping up), and the adapter asks at its next roll."""
        if self.state is not TermState.ESTABLISHED or self._handing is not None:
            return None
        self.state = step("primary", TERM, self.state, TermEvent.ROLL)
        if seq != self.log_end:
            raise ReplicationRuleError(f"rolled at {seq}, not at the log's end {self.log_end}")
        keeping_up = [
            (feed.match, -r)
            for r, feed in self._feeds.items()
            if feed.state is FeedState.STREAMING and r in self.group.replicas
        ]
        if not keeping_up:
            return None
        chosen = -max(keeping_up)[1]
        self._rolled, self._taken = (seq, chosen), None
        self._send(chosen, Roll(self.epoch, seq), now)
        return chosen

    def _taken_chunk(self, replica: int, msg: TakenChunk) -> None:
        if self._rolled != (msg.seq, replica):
            return  # for an earlier roll, or not asked of this replica: not kept
        key = (msg.epoch, msg.seq, msg.total)
        held = self._taken if self._taken is not None and self._taken.key == key else None
        transfer = self._taken = held or ChunkTransfer(key)
        if transfer.add(msg.offset, len(msg.data)):
            self._events.append(
                StoreCheckpointChunk(msg.seq, msg.total, msg.offset, msg.data, held is None)
            )
        if transfer.missing_after(0, 0) == 0:
            self._rolled = self._taken = None
            self._events.append(CheckpointTaken(msg.seq))
