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
    "is_replayable",
    "to_incoming",
]

# --- the coordinator's checkpoint file -----------------------------------------------------

_STATE_MAGIC = b"AMBRIC"
_STATE_VERSION = 1
# magic, format version u16, committer id i32, next seq i64, logged outputs i64,
# binding outputs i64, blob length u64
_STATE_HEADER = struct.Struct("<6sHiqqqQ")


class StateFormatError(ValueError):
    """A checkpoint file that is not in the coordinator's format."""


@attrs.frozen
class IcState:
    """What ``serverchkpt<N>`` holds: the coordinator's own state and the binding's blob.

    ``next_seq`` is the sequence id of the first record of log N (checkpoint N is the
    state at the start of log N). ``logged_outputs`` counts the binding's replayable
    outputs logged before log N; ``binding_outputs`` counts the replayable outputs the
    binding had sent when it sent this checkpoint (see :class:`Intake` for why both).
    Layout, little-endian: ``b"AMBRIC" | u16 format version | i32 committer id | i64 next
    seq | i64 logged outputs | i64 binding outputs | u64 blob length | blob``.
    """

    committer_id: int
    next_seq: int
    logged_outputs: int
    binding_outputs: int
    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")

    def encode_parts(self) -> list[wire.Payload]:
        header = _STATE_HEADER.pack(
            _STATE_MAGIC,
            _STATE_VERSION,
            self.committer_id,
            self.next_seq,
            self.logged_outputs,
            self.binding_outputs,
            len(self.blob),
        )
        return [header, self.blob]

    @classmethod
    def decode(cls, data: bytes, where: str) -> IcState:
        if len(data) < _STATE_HEADER.size:
            raise StateFormatError(f"{where}: {len(data)} bytes, shorter than a state header")
        magic, version, committer, next_seq, logged, sent, length = _STATE_HEADER.unpack_from(data)
        if magic != _STATE_MAGIC:
            raise StateFormatError(f"{where}: not a coordinator checkpoint (magic {magic!r})")
        if version != _STATE_VERSION:
            raise StateFormatError(f"{where}: unknown checkpoint format version {version}")
        if len(data) != _STATE_HEADER.size + length:
            raise StateFormatError(
                f"{where}: blob of {length} bytes stated, {len(data) - _STATE_HEADER.size} present"
            )
        return cls(committer, next_seq, logged, sent, memoryview(data)[_STATE_HEADER.size :])


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
    """The binding sent a checkpoint (its blob).

    ``binding_outputs`` is the index of the binding's next replayable output at that
    point; ``enqueued`` how many messages had been queued for logging before it: the
    checkpoint may only be committed once all of those are durable, since replay from it
    will not regenerate them.
    """

    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    binding_outputs: int = 0
    enqueued: int = 0


@attrs.frozen
class InitialArrived:
    """The binding sent its InitialMessage; ``frame`` is the framed message to log."""

    frame: bytes


IntakeEvent = CheckpointRequested | CheckpointArrived | InitialArrived


def is_replayable(incoming_body: wire.Payload) -> bool:
    """Whether an incoming RPC body (after the type byte) is anything but an impulse call."""
    if incoming_body[0] != 0:
        return True  # a return value
    _, pos = wire.decode_zigzag_int(incoming_body, 1)
    return pos >= len(incoming_body) or incoming_body[pos] != wire.RpcType.IMPULSE


class Intake:
    """Sorts the binding's byte stream into input to log, output and control events.

    Exactly-once self-calls: a binding regenerates its outputs when it replays the log
    after a crash (replay is deterministic), and some of them were logged before the
    crash. Every *replayable* message the binding sends (a call or return value, not an
    impulse, which comes from outside and is never regenerated) gets an index: the count
    of such messages before it, which the checkpoint carries (``binding_outputs``).
    Messages are logged in index order, so "already logged" is one number,
    :attr:`skip_below`; a regenerated message whose index is below it is dropped.

    ``feed`` returns the control events in order; input for this instance accumulates in
    :attr:`pending` (framed incoming messages as buffers, ready to be packed into a record
    without copying), output
    for other instances in :attr:`outboxes` until links to other coordinators exist.
    """

    def __init__(self, instance: str) -> None:
        self.instance = instance
        self._reader = MessageReader()
        # One buffer list per message, and whether it is replayable.
        self.pending: list[tuple[list[wire.Payload], bool]] = []
        self.pending_bytes = 0
        self.attached: set[str] = set()
        self.outboxes: dict[str, list[bytes]] = defaultdict(list)
        self.new_destinations: list[str] = []  # destinations seen for the first time
        self.received_outputs = 0  # index of the next replayable message from the binding
        self.skip_below = 0  # replayable messages with a lower index are already logged
        self.dropped = 0  # regenerated messages dropped as duplicates
        self.queued_outputs = 0  # replayable messages in ``pending``
        self.enqueued = 0  # messages ever queued in ``pending``
        self.dequeued = 0  # messages ever taken out of it

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

    def take(
        self, max_bytes: int, max_messages: int | None = None
    ) -> tuple[list[wire.Payload], int]:
        """Remove pending input, at most ``max_bytes`` (at least one message), as buffers.

        Returns the buffers (small ones joined, large payloads left as views: see
        ``wire.coalesce_parts``) and how many replayable messages they hold.
        """
        taken = 0
        n = 0
        outputs = 0
        for parts, replayable in self.pending:
            size = sum(len(p) for p in parts)
            if n and (taken + size > max_bytes or n == max_messages):
                break
            taken += size
            outputs += replayable
            n += 1
        out = [p for parts, _ in self.pending[:n] for p in parts]
        del self.pending[:n]
        self.dequeued += n
        self.pending_bytes -= taken
        self.queued_outputs -= outputs
        return wire.coalesce_parts(out), outputs

    def _input(self, parts: list[wire.Payload], replayable: bool) -> None:
        if replayable:
            index = self.received_outputs
            self.received_outputs += 1
            if index < self.skip_below:
                self.dropped += 1
                return
            self.queued_outputs += 1
        self.pending.append((parts, replayable))
        self.enqueued += 1
        self.pending_bytes += sum(len(p) for p in parts)

    def _route(self, destination: str, incoming: bytes, outgoing: bytes) -> None:
        if destination in ("", self.instance):
            _, pos = wire.decode_zigzag_int(incoming, 0)
            self._input([incoming], is_replayable(memoryview(incoming)[pos + 1 :]))
            return
        if destination not in self.outboxes:
            self.new_destinations.append(destination)
        self.outboxes[destination].append(outgoing)

    def _frame(self, frame: Frame) -> IntakeEvent | None:
        t = frame.type
        if t == MessageType.RPC:
            destination, prefix, body = to_incoming(frame.raw)
            if destination in ("", self.instance):
                self._input([prefix, body], is_replayable(body))
            else:
                self._route(destination, b"", bytes(frame.raw))
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
            return CheckpointArrived(msg.blob, self.received_outputs, self.enqueued)
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
        self._route(msg.destination, wire.encode_message(incoming), wire.encode_message(msg))
