"""The worker's state, piece by piece: its connections and streams, what one read
builds, what a handler hands back, and the errors only a worker raises. The rules that
use them are in :mod:`.worker_core`; this module holds no rule, only the shapes."""

from __future__ import annotations

from typing import Any, Final

import attrs

from .codec import NOTHING_SEEN
from .errors import ProtocolError
from .frames import Frame
from .handoff import Call
from .states import ConnectionMachine, ConnectionState, Role, StreamMachine

__all__ = [
    "LIVE",
    "NOTHING",
    "Batch",
    "Connection",
    "NoCreditsError",
    "Replies",
    "Send",
    "Stream",
    "StreamNotOpenError",
]

_W = Role.WORKER
LIVE: Final = frozenset({ConnectionState.STREAMING, ConnectionState.MIGRATING})
"""The connection states in which frames cost credits and ACKs may be sent."""


class NoCreditsError(ProtocolError):
    """A frame that came when the connection had no credits left (reference)."""

    def __init__(self, dialect: str, frame: str, offset: int) -> None:
        super().__init__(dialect, frame, None, offset, "no credits left")

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str, int]]:  # type: ignore[override]
        return (type(self), (self.dialect, self.frame, self.offset))


class StreamNotOpenError(ProtocolError):
    """A MESSAGE or EOS for a stream not open on its connection: never notified, closed
    by EOS, or held by another connection (seed 000, *Streaming*; reference)."""

    def __init__(self, dialect: str, frame: str, offset: int, stream_id: int, why: str) -> None:
        reason = f"stream {stream_id} is not open on this connection: {why}"
        super().__init__(dialect, frame, "stream_id", offset, reason)
        self.stream_id = stream_id
        self.why = why

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str, int, int, str]]:  # type: ignore[override]
        return (type(self), (self.dialect, self.frame, self.offset, self.stream_id, self.why))


@attrs.frozen
class Send:
    """Frames for one connection, encoded in order, and whether to close it after."""

    conn: str
    wire: bytes
    close: bool = False


@attrs.frozen
class Replies:
    """What a handler produced: writes per connection, problems worth logging, and
    calls to another worker (a move's hand-off, :mod:`.handoff`)."""

    sends: tuple[Send, ...] = ()
    problems: tuple[str, ...] = ()
    calls: tuple[Call, ...] = ()


NOTHING: Final = Replies()


class Connection:
    __slots__ = ("credits", "machine", "name", "offset", "peer", "refused")

    def __init__(self, peer: str) -> None:
        self.peer = peer
        self.machine = ConnectionMachine(_W)
        self.credits = 0
        self.offset = 0  # stream offset of the next byte: errors name where
        self.name = ""  # HELLO's program and instance names, for operators
        self.refused: set[int] = set()  # draft: streams whose NOTIFY was refused here

    def __getstate__(self) -> tuple[str, ConnectionMachine, int, int, str, set[int]]:
        return (self.peer, self.machine, self.credits, self.offset, self.name, self.refused)

    def __setstate__(self, s: tuple[Any, ...]) -> None:
        self.peer, self.machine, self.credits, self.offset, self.name = s[:5]
        self.refused = s[5] if len(s) > 5 else set()  # a checkpoint from before the set


class Stream:
    __slots__ = ("machine", "name", "owner", "point")

    def __init__(self, stream_id: int, name: str) -> None:
        self.name = name
        self.owner: str | None = None  # the connection it is open on
        self.machine = StreamMachine(_W, stream_id)  # its owner's session's view
        self.point: int | None = None  # last message id held; None: nothing yet

    def __getstate__(self) -> tuple[str, str | None, StreamMachine, int | None]:
        return (self.name, self.owner, self.machine, self.point)

    def __setstate__(self, s: tuple[str, str | None, StreamMachine, int | None]) -> None:
        self.name, self.owner, self.machine, self.point = s

    @property
    def wire_point(self) -> int:
        return NOTHING_SEEN if self.point is None else self.point


class Batch:
    """What handling one connection's frames builds: its replies and the points moved."""

    __slots__ = ("acks", "close", "closed", "frames", "problems")

    def __init__(self) -> None:
        self.frames: list[Frame] = []
        self.acks: dict[int, int] = {}
        self.close = False
        self.problems: list[str] = []
        self.closed: list[int] = []  # streams an EOS closed while the worker moves
