"""The coordinator's protocol logic, sans-IO: what the binding's messages become.

The binding sends bare messages (seed 002); the coordinator logs *input* — the calls and
return values addressed to its own instance — in the incoming form its binding will
receive, and handles the rest itself. :class:`Intake` takes the binding's frames and
sorts them into input to log, output for other instances, and control events. It owns no
socket, file or clock; ``ic_server`` drives it.

It also owns the byte format of the coordinator's checkpoint files (:class:`IcState`).
"""

from __future__ import annotations

import struct
from collections import defaultdict

import attrs

from .. import wire
from ..wire import (
    AttachTo,
    Checkpoint,
    Frame,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    MessageReader,
    MessageType,
    OutgoingReturnValue,
    OutgoingRpc,
    RpcBatch,
    TakeCheckpoint,
)

__all__ = [
    "CheckpointArrived",
    "CheckpointRequested",
    "IcState",
    "InitialArrived",
    "Intake",
    "IntakeEvent",
    "StateFormatError",
    "to_incoming",
]

# --- the coordinator's checkpoint file -----------------------------------------------------

_STATE_MAGIC = b"AMBRIC"
_STATE_VERSION = 1
# magic, format version u16, committer id i32, next seq i64, blob length u64
_STATE_HEADER = struct.Struct("<6sHiqQ")


class StateFormatError(ValueError):
    """A checkpoint file that is not in the coordinator's format."""


@attrs.frozen
class IcState:
    """What ``serverchkpt<N>`` holds: the coordinator's own state and the binding's blob.

    ``next_seq`` is the sequence id of the first record of log N (checkpoint N is the
    state at the start of log N). Layout: ``b"AMBRIC" | u16 format version | i32 committer
    id | i64 next seq | u64 blob length | blob``, little-endian.
    """

    committer_id: int
    next_seq: int
    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")

    def encode_parts(self) -> list[wire.Payload]:
        header = _STATE_HEADER.pack(
            _STATE_MAGIC, _STATE_VERSION, self.committer_id, self.next_seq, len(self.blob)
        )
        return [header, self.blob]

    @classmethod
    def decode(cls, data: bytes, where: str) -> IcState:
        if len(data) < _STATE_HEADER.size:
            raise StateFormatError(f"{where}: {len(data)} bytes, shorter than a state header")
        magic, version, committer, next_seq, length = _STATE_HEADER.unpack_from(data)
        if magic != _STATE_MAGIC:
            raise StateFormatError(f"{where}: not a coordinator checkpoint (magic {magic!r})")
        if version != _STATE_VERSION:
            raise StateFormatError(f"{where}: unknown checkpoint format version {version}")
        if len(data) != _STATE_HEADER.size + length:
            raise StateFormatError(
                f"{where}: blob of {length} bytes stated, {len(data) - _STATE_HEADER.size} present"
            )
        return cls(committer, next_seq, memoryview(data)[_STATE_HEADER.size :])


# --- routing -------------------------------------------------------------------------------


def to_incoming(raw: bytes | memoryview) -> tuple[str, bytes, memoryview]:
    """Split an outgoing RPC frame into its destination and the incoming frame's parts.

    ``size | 00 | ZigZagInt dest length | dest | body`` becomes ``size' | 00`` and
    ``body`` (a view of ``raw``): the destination is cut out without decoding or copying
    the body (the hot path for self-calls).
    """
    mv = memoryview(raw)
    size, pos = wire.decode_zigzag_int(mv, 0)
    name_len, name_at = wire.decode_zigzag_int(mv[: pos + size], pos + 1)
    if name_len < 0 or name_at + name_len > pos + size:
        raise wire.MalformedMessageError(f"destination length {name_len}", offset=pos + 1)
    try:
        destination = str(mv[name_at : name_at + name_len], "utf-8")
    except UnicodeDecodeError as exc:
        raise wire.InvalidNameError(
            f"destination name is not valid UTF-8: {exc.reason}", offset=name_at
        ) from None
    body = mv[name_at + name_len : pos + size]
    if not len(body):
        raise wire.TruncatedError("RPC body is empty", offset=name_at + name_len)
    return destination, wire.encode_zigzag_int(1 + len(body)) + b"\x00", body


@attrs.frozen
class CheckpointRequested:
    """The binding asked to roll the log and take a checkpoint (TakeCheckpoint)."""


@attrs.frozen
class CheckpointArrived:
    """The binding sent a checkpoint (its blob)."""

    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")


@attrs.frozen
class InitialArrived:
    """The binding sent its InitialMessage; ``frame`` is the framed message to log."""

    frame: bytes


IntakeEvent = CheckpointRequested | CheckpointArrived | InitialArrived


class Intake:
    """Sorts the binding's byte stream into input to log, output and control events.

    ``feed`` returns the control events in order; input for this instance accumulates in
    :attr:`pending` (framed incoming messages as buffers, ready to be packed into a record
    without copying), output
    for other instances in :attr:`outboxes` until links to other coordinators exist.
    """

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._reader = MessageReader()
        self.pending: list[list[wire.Payload]] = []  # one buffer list per message
        self.pending_bytes = 0
        self.attached: set[str] = set()
        self.outboxes: dict[str, list[bytes]] = defaultdict(list)
        self.new_destinations: list[str] = []  # destinations seen for the first time

    @property
    def offset(self) -> int:
        """Bytes of the binding's stream consumed so far."""
        return self._reader.offset

    def feed(self, data: bytes | memoryview) -> list[IntakeEvent]:
        """Consume bytes from the binding; raises :class:`wire.ProtocolError` on bad input."""
        self._reader.feed(data)
        events: list[IntakeEvent] = []
        while (frame := self._reader.next_frame()) is not None:
            event = self._frame(frame)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> None:
        """The binding's stream ended: raise if it ended inside a message."""
        self._reader.close()

    def take(self, max_bytes: int) -> list[wire.Payload]:
        """Remove pending input, at most ``max_bytes`` (at least one message), as buffers.

        Small buffers are joined, large payloads stay views (see ``wire.coalesce_parts``).
        """
        taken = 0
        n = 0
        for parts in self.pending:
            size = sum(len(p) for p in parts)
            if n and taken + size > max_bytes:
                break
            taken += size
            n += 1
        out = [p for parts in self.pending[:n] for p in parts]
        del self.pending[:n]
        self.pending_bytes -= taken
        return wire.coalesce_parts(out)

    def _input(self, parts: list[wire.Payload]) -> None:
        self.pending.append(parts)
        self.pending_bytes += sum(len(p) for p in parts)

    def _route(self, destination: str, incoming: list[wire.Payload], outgoing: bytes) -> None:
        if destination in ("", self.instance):
            self._input(incoming)
            return
        if destination not in self.outboxes:
            self.new_destinations.append(destination)
        self.outboxes[destination].append(outgoing)

    def _frame(self, frame: Frame) -> IntakeEvent | None:
        t = frame.type
        if t == MessageType.RPC:
            destination, prefix, body = to_incoming(frame.raw)
            if destination in ("", self.instance):
                self._input([prefix, body])
            else:
                self._route(destination, [], bytes(frame.raw))
            return None
        msg = self._reader.decode(frame)
        if isinstance(msg, RpcBatch):
            for inner in msg.messages:
                self._route_message(inner)
            return None
        if isinstance(msg, AttachTo):
            self.attached.add(msg.destination)
            return None
        if isinstance(msg, TakeCheckpoint):
            return CheckpointRequested()
        if isinstance(msg, Checkpoint):
            return CheckpointArrived(msg.blob)
        if isinstance(msg, InitialMessage):
            return InitialArrived(bytes(frame.raw))
        raise wire.MalformedMessageError(
            f"a binding does not send {t.name} (type {int(t)})", offset=frame.offset
        )

    def _route_message(self, msg: wire.Message) -> None:
        if isinstance(msg, OutgoingRpc):
            incoming: wire.Message = IncomingRpc(
                msg.method_id, msg.rpc_type, msg.args, msg.sender, msg.call_seq
            )
        elif isinstance(msg, OutgoingReturnValue):
            incoming = IncomingReturnValue(msg.return_type, msg.sender, msg.call_seq, msg.value)
        else:  # pragma: no cover - the batch decoder only yields RPC messages
            raise wire.MalformedMessageError(f"batch holds a {type(msg).__name__}")
        self._route(msg.destination, [wire.encode_message(incoming)], wire.encode_message(msg))
