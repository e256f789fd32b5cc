"""The dispatcher's state across crashes: its mode, and what its next checkpoint holds.

A checkpoint is the state taken the last time nothing was in flight (its *base*) and
the incoming messages handled since (its *tail*): see :mod:`checkpoint`.
:class:`Checkpoints` keeps the two as records are handled and makes the blob; the
dispatcher says what its state is (:class:`Snapshot`) and puts a restored one back.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

import attrs

from .. import wire
from ..wire import IncomingReturnValue, IncomingRpc, Message
from .checkpoint import Snapshot, decode_snapshot, encode_snapshot
from .errors import CheckpointFormatError

__all__ = ["Checkpoints", "Mode", "class_name", "tail_messages"]

log = logging.getLogger("ambrosia_py.binding")
_TAIL_KEEP = 1024  # messages the tail may hold with nothing in flight (see trim)


class Mode(enum.Enum):
    STARTING = "starting"
    RECOVERING = "recovering"
    PRIMARY = "primary"


def class_name(cls: type) -> str:
    """How a checkpoint names the immortal's class."""
    return f"{cls.__module__}:{cls.__qualname__}"


class Checkpoints:
    """The base and the tail of the next checkpoint.

    No base: none was taken since the tail was dropped (:meth:`trim`) or ever; then
    nothing is in flight. The tail is one list for the dispatcher's life (emptied, never
    replaced), so the hot path may hold on to it.
    """

    __slots__ = ("base", "tail")

    def __init__(self) -> None:
        self.base: Snapshot | None = None
        self.tail: list[Message] = []

    def rebase(self, base: Snapshot | None) -> None:
        """``base`` is the state now; the tail starts here."""
        self.base = base
        self.tail.clear()

    def trim(self, in_flight: bool) -> None:
        """With nothing in flight, drop a long tail: it is needed only from the next
        handler that may suspend on (the dispatcher takes a base then). Kept, it would
        hold every call's arguments (and the buffers they are views of) until the next
        checkpoint."""
        if len(self.tail) > _TAIL_KEEP and not in_flight:
            self.rebase(None)

    def blob(self, now: Callable[[], Snapshot], in_flight: bool) -> bytes:
        """The checkpoint blob: the state ``now`` gives when nothing is in flight (it
        becomes the base), else the base and the tail."""
        if not in_flight:
            base = now()
            self.rebase(base)
            return encode_snapshot(base)
        assert self.base is not None, "a suspended handler implies an earlier checkpoint"
        tail = tuple(wire.encode_message(m) for m in self.tail)
        return encode_snapshot(attrs.evolve(self.base, tail=tail))

    def restore(self, blob: wire.Payload, cls: type, version: int) -> Snapshot:
        """The snapshot in ``blob``, checked against the class it is restored into
        (``cls``, at ``version``); it is the base now, with an empty tail."""
        snap = decode_snapshot(blob)
        if snap.class_name != class_name(cls) and snap.class_version == version:
            log.warning("checkpoint of %s restored into %s", snap.class_name, class_name(cls))
        if snap.class_version != version:
            raise CheckpointFormatError(
                f"checkpoint of {snap.class_name} version {snap.class_version}, but the service "
                f"is version {version}: run the old code and upgrade with --upgrade-version"
            )
        self.rebase(attrs.evolve(snap, tail=()))
        return snap


def tail_messages(snap: Snapshot) -> list[IncomingRpc | IncomingReturnValue]:
    """The incoming messages a checkpoint's tail holds, decoded."""
    messages: list[IncomingRpc | IncomingReturnValue] = []
    for raw in snap.tail:
        msg, _ = wire.decode_message(raw)
        if not isinstance(msg, IncomingRpc | IncomingReturnValue):
            raise CheckpointFormatError(
                f"checkpoint tail holds a {type(msg).__name__}, not an incoming message"
            )
        messages.append(msg)
    return messages
