"""What a replicated primary holds back until its records are committed.

Standalone, a record is forwarded to the binding and confirmed to the link senders whose
messages it holds as soon as it is durable in the log. With replicas it must also be
durable on ``--replication-ack`` of them (``replication/primary.py``'s commit point):
only then may the binding see it (whatever the binding does next can become visible
outside), and only then may a sender drop its copy. :class:`CommitGate` sits between
the commit pipeline and those two: the committer hands it each record's actions as the
record becomes durable here, and it runs them in log order once the commit point passes
the record. A control message for the binding (TakeCheckpoint after a roll) queues
behind the records before it, so its place in the binding's stream does not change.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

__all__ = ["CommitGate"]

Action = Callable[[], None]


class CommitGate:
    """Actions held by record seq until :meth:`commit` passes them (see the module).

    ``on_durable`` is told each local durable end (the replication core counts the
    primary's own durability toward the commit point).
    """

    def __init__(self, on_durable: Callable[[int], None]) -> None:
        self._on_durable = on_durable
        self._held: deque[tuple[int, Action]] = deque()  # (seq, action), in log order
        self._commit_end = 0
        self._current = -1  # the seq whose actions are being handed over now

    @property
    def commit_end(self) -> int:
        """The first seq not known committed."""
        return self._commit_end

    @property
    def held(self) -> int:
        """Actions waiting for the commit point."""
        return len(self._held)

    def durable(self, seq: int, action: Action | None = None) -> None:
        """Record ``seq`` is durable in this replica's log; ``action`` (its confirmation
        to link senders) runs once it is committed. Its forwarding (:meth:`forward`)
        follows this call."""
        if seq < self._current:
            raise ValueError(f"record {seq} made durable after record {self._current}")
        self._current = seq
        if action is not None:
            self._hold(seq, action)
        self._on_durable(seq + 1)

    def forward(self, action: Action) -> None:
        """Forward the record last made durable (:meth:`durable`) once it is committed."""
        self._hold(self._current, action)

    def control(self, action: Action) -> None:
        """A control message for the binding, in order behind every record before it."""
        if self._held:
            self._held.append((self._held[-1][0], action))
        else:
            action()

    def commit(self, end: int) -> None:
        """Records below ``end`` are committed: run what they held, in order."""
        if end <= self._commit_end:
            return
        self._commit_end = end
        held = self._held
        while held and held[0][0] < end:
            _, action = held.popleft()
            action()

    def _hold(self, seq: int, action: Action) -> None:
        if seq < self._commit_end and not self._held:
            action()
        else:
            self._held.append((seq, action))
