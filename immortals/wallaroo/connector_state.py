"""What the connector's core keeps, per connection, per stream and per migration.

:mod:`.connector_core` owns the handlers; these are the records they change, all part
of the connector immortal's state (checkpointed and replayed), and :class:`Batch`, what
one handler builds before it returns its :class:`~.connector_actions.Actions`. Sans-IO.
"""

from __future__ import annotations

from typing import Any, Final

import attrs

from .connector_actions import Action, Actions
from .states import ConnectionMachine, Role, StreamMachine

__all__ = ["MAIN", "MIGRATION", "Batch", "Conn", "Migration", "Stream"]

MAIN, MIGRATION = "main", "migration"
"""A connection's purpose: the session the streams run on, or the one a migration opens."""

_C = Role.CONNECTOR
_NOTHING: Final = Actions()


class Conn:
    """One connection to a worker, as the core knows it."""

    __slots__ = ("address", "machine", "offset", "purpose", "streamed")

    def __init__(self, address: str, purpose: str) -> None:
        self.address = address
        self.purpose = purpose  # MAIN, or MIGRATION until the migration completes
        self.machine = ConnectionMachine(_C)
        self.offset = 0  # stream offset of the next byte from the worker
        self.streamed = False  # OK came: the session got going


class Stream:
    """One stream of the source: its progress (durable) and its session (per connection)."""

    __slots__ = (
        "acked",
        "broken",
        "close_seen",
        "configured",
        "conn",
        "end",
        "eos_at",
        "generation",
        "halting",
        "machine",
        "name",
        "notifies",
        "quiet",
        "refusals",
        "running",
    )

    def __init__(self, stream_id: int, name: str) -> None:
        self.name = name
        self.acked: int | None = None  # the worker's last acknowledged point; durable progress
        self.end: int | None = None  # where the source ended (EOS), once the reader found it
        self.configured = True  # in the source this incarnation reads
        self.broken: str | None = None  # the source cannot resume it (seed 000, D5)
        self.close_seen = False  # the worker surely handled an EOS at ``end`` (below)
        self.generation = 0  # bumped whenever a reader's reports must be ignored
        self.machine = StreamMachine(_C, stream_id)
        self.reset_session()

    def reset_session(self) -> None:
        """A new session: not introduced anywhere, no reader."""
        self.machine = StreamMachine(_C, self.machine.stream_id)
        self.conn: str | None = None  # where it was introduced
        self.notifies = 0  # NOTIFYs not yet answered
        self.running = False  # a reader sends it (a Go is out)
        self.halting = False  # a Halt is out, its report not yet in
        self.eos_at: int | None = None  # the point its EOS on ``conn`` carried
        self.quiet = False  # its reader here started at ``end``: it sends no MESSAGE
        self.refusals = 0
        self.generation += 1

    @property
    def finished(self) -> bool:
        """The worker acknowledged the end of the source: every record is applied."""
        return self.end is not None and self.acked == self.end

    @property
    def done(self) -> bool:
        """Finished, and the worker surely closed it. An ACK of the end that follows
        the EOS may be the one for the last MESSAGE, sent before the worker read the
        EOS; if the worker then crashed, its stream was never closed. So a finished
        stream is introduced again in the next session, at its end, where its reader
        sends nothing: an ACK of it there can only be the EOS's (``close_seen``)."""
        return self.finished and self.close_seen

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.close_seen = self.quiet = False  # not in checkpoints from before they were
        for k, v in state.items():
            setattr(self, k, v)


@attrs.define
class Migration:
    """A migration under way (seed 001): the old connection, where to, the new one."""

    old: str
    to: str
    dial: int
    new: str | None = None
    failures: int = 0


class Batch:
    """What one handler builds: its actions, in order, and problems worth logging."""

    __slots__ = ("actions", "problems")

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.problems: list[str] = []

    def done(self) -> Actions:
        if not self.actions and not self.problems:
            return _NOTHING
        return Actions(tuple(self.actions), tuple(self.problems))
