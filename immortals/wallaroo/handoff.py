"""Moving a worker's streams to another worker: the state that goes with them.

Seed 001 moves a connector from one worker to another (steps 4-6: the old worker
checkpoints every stream, "migrate[s the] source state to [the] new worker", then ACKs
every stream), so that the new worker resumes each stream where the old one stopped and
nothing is applied twice. The source state of a stream is its name, its point of
reference (the last message id the old worker took) and whether it was closed by EOS.
The application's state stays with the worker that applied the messages.

The two workers are immortals, so the hand-off is a conversation of calls between them,
each logged by both before it is handled, exactly once across crashes of either:

1. ``move`` (an operator's command) on the old worker: from now on it refuses every
   NOTIFY (so no stream is taken up there again) and calls ``expect`` on the new worker
   with the ids of every stream it has.
2. ``expect`` on the new worker: it refuses a NOTIFY for each of those streams until
   their state arrives (the connector retries a refused NOTIFY after a back-off), and
   answers ``expecting``.
3. ``expecting`` on the old worker: now it sends its connectors away (MIGRATE in the
   draft, RESTART in v3, as in :mod:`.worker_core`), and a connector that connects
   later is sent away as it says HELLO. Each stream is handed over (``adopt``) once no
   connection holds it: at once for a stream already free; for a stream a migrating
   connector holds, when its EOS comes (the draft), the ACK of that EOS held back until
   the new worker has the stream (seed 001, step 6); for a stream on a connection that
   goes away, when it goes.
4. ``adopt`` on the new worker takes each stream's point (and its closed state) and
   answers ``adopted``; the old worker then sends the ACKs it held back.

So a stream is open on at most one worker at a time, and whatever the order in which the
connector reaches the new worker, the records after each stream's point are taken there
exactly once. Sans-IO: :class:`Move` is part of the worker's state; calls to the other
worker leave as :class:`Call` values that the immortal makes.
"""

from __future__ import annotations

from typing import Any

import attrs

__all__ = ["Call", "Move", "Handed"]

Handed = tuple[int, str, "int | None", bool]
"""One stream's source state: (stream id, name, point or None, closed by EOS)."""


@attrs.frozen
class Call:
    """A call to another worker: ``method(*args)`` on instance ``peer``, forked."""

    peer: str
    method: str
    args: tuple[Any, ...]


@attrs.define
class Move:
    """A move of this worker's streams to ``peer`` (listening at ``host:port``)."""

    host: str
    port: int
    peer: str
    ready: bool = False
    """The peer expects the streams: connectors are sent there."""
    handed: set[int] = attrs.field(factory=set)
    """Streams whose state went (or is going) to the peer."""
    batches: int = 0
    """Hand-off batches sent so far: each ``adopt`` carries the next number."""
    held: dict[int, tuple[str | None, tuple[tuple[int, int], ...]]] = attrs.field(factory=dict)
    """Batch -> (the connection whose ACKs wait for it, those (stream, point) pairs)."""

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def done(self, streams: int) -> bool:
        """Every one of the worker's ``streams`` went, and the peer took them all."""
        return self.ready and len(self.handed) == streams and not self.held

    def status(self, streams: int) -> dict[str, Any]:
        return {
            "to": self.address,
            "peer": self.peer,
            "ready": self.ready,
            "handed": len(self.handed),
            "waiting": len(self.held),
            "done": self.done(streams),
        }
