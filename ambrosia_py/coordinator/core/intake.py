"""The coordinator's protocol logic, sans-IO: what the binding's messages become.

The binding sends bare messages (seed 002); the coordinator logs *input* — the calls and
return values addressed to its own instance — in the incoming form its binding will
receive, and handles the rest itself. :class:`Intake` takes the binding's frames and
sorts them into input to log, output for other instances, and control events. It owns no
socket, file or clock; ``ic_server`` drives it. The byte format of the coordinator's
checkpoint files is :mod:`.checkpoint`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ... import wire
from ...wire import (
    AttachTo,
    Checkpoint,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    MessageReader,
    MessageType,
    OutgoingReturnValue,
    OutgoingRpc,
    RawMessage,
    RpcBatch,
    TakeCheckpoint,
)
from ..links.protocol import Inbox, LinkError, Outbox, OutboxBudget
from .checkpoint import IcState, OutboxState, StateFormatError
from .routing import (
    is_replayable,
    large_link_forks,
    one_link_message,
    split_link_forks,
    to_incoming,
)

__all__ = [
    "CheckpointArrived",
    "CheckpointRequested",
    "IcState",
    "InitialArrived",
    "Intake",
    "IntakeEvent",
    "StateFormatError",
    "OutboxState",
    "is_replayable",
    "to_incoming",
]

# A link frame under this size holding one message is decoded on its own (the latency
# path of an awaited call and its reply), not through a message reader.
_ONE_SMALL = 8 * 1024

# --- routing (the byte-level steps are in routing.py) -----------------------------------


@attrs.frozen
class CheckpointRequested:
    """The binding asked to roll the log and take a checkpoint (TakeCheckpoint)."""


@attrs.frozen
class CheckpointArrived:
    """The binding sent a checkpoint (its blob).

    ``binding_outputs`` is the index of the binding's next replayable output at that
    point; ``enqueued`` how many messages had been queued for logging before it: the
    checkpoint may only be committed once all of those are durable, since replay from it
    will not regenerate them. ``attached``: the instances attached to by then (None: not
    recorded, see :meth:`Intake.restore_attached`).
    """

    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    binding_outputs: int = 0
    enqueued: int = 0
    outboxes: dict[str, OutboxState] = attrs.field(factory=dict)
    attached: frozenset[str] | None = None


@attrs.frozen
class InitialArrived:
    """The binding sent its InitialMessage; ``frame`` is the framed message to log."""

    frame: bytes


IntakeEvent = CheckpointRequested | CheckpointArrived | InitialArrived


_IMPULSE = int(wire.RpcType.IMPULSE)
_MAX_NAMES = 4096  # destination names remembered by Intake (then it starts over)


class Intake:
    """Sorts the binding's byte stream into input to log, output and control events.

    Exactly-once self-calls: a binding regenerates its outputs when it replays the log
    after a crash (replay is deterministic), and some of them were logged before the
    crash. Every *replayable* message the binding sends to itself (a call or return value,
    not an impulse, which comes from outside and is never regenerated) gets an index: the
    count of such messages before it, which the checkpoint carries (``binding_outputs``).
    Messages are logged in index order, so "already logged" is one number,
    :attr:`skip_below`; a regenerated message whose index is below it is dropped.

    Output for other instances goes to one :class:`links.Outbox` per destination, where
    the same numbering per destination lets the receiver drop what it already has; their
    bytes together count against :attr:`outbox_budget` (``max_outbox_bytes``, None: no
    limit), which says when the binding must wait for destinations to confirm.
    Input from other instances' links arrives through :meth:`link_input`, numbered per
    sender by :attr:`inbox`.

    Attach before send (seed 002, *Attach-before-send protocol*): a call for another
    instance is refused unless the binding sent AttachTo for that instance first, in this
    run or before the checkpoint it was restored from (:attr:`attached`). A return value
    goes back to an instance that called this one and needs none: neither ours nor the
    released bindings attach to their callers. Attaching again is harmless.

    ``feed`` returns the control events in order; input for this instance accumulates in
    :attr:`pending` (framed incoming messages as buffers, ready to be packed into a record
    without copying).
    """

    def __init__(self, instance: str, max_outbox_bytes: int | None = None) -> None:
        self.instance = instance
        self.outbox_budget = OutboxBudget(max_outbox_bytes)
        self._reader = MessageReader()
        # Per message: its buffers, whether it is a replayable output of the binding, and
        # for input from a link its sender and the sender's seq after it.
        self.pending: list[tuple[list[wire.Payload], bool, str | None, int]] = []
        self.pending_bytes = 0
        self.attached: set[str] = set()  # instances the binding sent AttachTo for
        self.require_attach = True  # see restore_attached
        self.outboxes: dict[str, Outbox] = {}
        self.inbox = Inbox()
        self.new_destinations: list[str] = []  # destinations seen for the first time
        self.received_outputs = 0  # index of the next replayable message from the binding
        self.skip_below = 0  # replayable messages with a lower index are already logged
        self.dropped = 0  # regenerated messages dropped as duplicates
        self.queued_outputs = 0  # replayable messages in ``pending``
        self.enqueued = 0  # messages ever queued in ``pending``
        self.dequeued = 0  # messages ever taken out of it
        self._names: dict[bytes, str] = {}  # destination names seen, by their UTF-8 bytes

    @property
    def offset(self) -> int:
        """Bytes of the binding's stream consumed so far."""
        return self._reader.offset

    def feed(self, data: bytes | memoryview) -> list[IntakeEvent]:
        """Consume bytes from the binding; raises :class:`wire.ProtocolError` on bad input."""
        reader = self._reader
        reader.feed(data)
        events: list[IntakeEvent] = []
        small: list[bytes] = []
        while True:
            # Runs of small RPC frames (nearly all traffic) take the fast path; anything
            # else is read, decoded and checked frame by frame.
            offset = reader.take_rpc_frames(small)
            if small:
                self._small_rpcs(small, offset)
                small.clear()
            frame = reader.next_frame()
            if frame is None:
                return events
            event = self._frame(frame)
            if event is not None:
                events.append(event)

    def close(self) -> None:
        """The binding's stream ended: raise if it ended inside a message."""
        self._reader.close()

    def restore_outboxes(self, outboxes: dict[str, OutboxState]) -> None:
        """Recovery: the output a checkpoint kept; replay regenerates what follows."""
        for dest, (next_seq, frames) in outboxes.items():
            self.outboxes[dest] = Outbox(next_seq, frames, self.outbox_budget)
            self.new_destinations.append(dest)

    def outbox_snapshot(self) -> dict[str, OutboxState]:
        return {dest: (box.next_seq, box.buffered) for dest, box in self.outboxes.items()}

    def restore_attached(self, attached: frozenset[str] | None) -> None:
        """Recovery: the instances attached to before the checkpoint, which the binding,
        restored from the same checkpoint, may call without attaching again. None: the
        checkpoint did not record them (it was written before they were kept), so calls
        are not checked for an AttachTo on this instance, now or after later checkpoints
        (:meth:`attached_snapshot` passes the None on)."""
        if attached is None:
            self.require_attach = False
        else:
            self.attached.update(attached)

    def attached_snapshot(self) -> frozenset[str] | None:
        return frozenset(self.attached) if self.require_attach else None

    def link_input(self, sender: str, payload: bytes | memoryview) -> int:
        """Queue the messages of one link frame from ``sender``; return how many.

        The whole frame is checked before anything is queued: a peer that sends anything
        but complete incoming calls and return values is refused (``LinkError``), and
        nothing of that frame reaches the log.
        """
        if isinstance(payload, memoryview) and (views := large_link_forks(payload)):
            return self._queue_forks(sender, views, payload.nbytes)
        data = payload if isinstance(payload, bytes) else bytes(payload)
        forks = split_link_forks(data)
        if forks:  # the common shape, checked byte by byte
            return self._queue_forks(sender, forks, len(data))
        if len(data) < _ONE_SMALL and self._one_message(sender, data):
            return 1  # a call awaited or its reply, alone: the latency path
        reader = MessageReader(direction=wire.Direction.TO_BINDING)  # the incoming form
        reader.feed(data)
        frames: list[RawMessage] = []
        try:
            while (frame := reader.next_frame()) is not None:
                if frame.type != MessageType.RPC:
                    raise LinkError(
                        f"a link carries calls and return values, not {frame.type.name}",
                        offset=frame.offset,
                    )
                msg = reader.decode(frame)
                if not isinstance(msg, IncomingReturnValue | IncomingRpc):
                    raise LinkError("a link carries incoming calls only", offset=frame.offset)
                if isinstance(msg, IncomingRpc) and msg.rpc_type == wire.RpcType.IMPULSE:
                    raise LinkError("an impulse on a link", offset=frame.offset)
                # A reply, or an async/await call (whose reply goes to its sender), must
                # name the peer it came from: the binding takes a reply only from the
                # instance its call went to, and that holds only if the name is true.
                claimed = msg.sender
                if (
                    isinstance(msg, IncomingReturnValue) or msg.rpc_type == wire.RpcType.ASYNC_AWAIT
                ) and claimed != sender:
                    raise LinkError(
                        f"a message on {sender!r}'s link names sender {claimed!r}",
                        offset=frame.offset,
                    )
                frames.append(frame)
            reader.close()
        except LinkError:
            raise
        except wire.ProtocolError as exc:
            raise LinkError(f"bad message on a link: {exc}", offset=exc.offset) from None
        for frame in frames:
            seq = self.inbox.accept(sender, 1)
            # As the reader gave it: a small message a copy of its own, a large one a view
            # no later feed changes (of ``data``, which is immutable), not copied again.
            self._queue([frame.raw], False, sender, seq)
        return len(frames)

    def _one_message(self, sender: str, data: bytes) -> bool:
        """Queue a frame of exactly one message that the general path of
        :meth:`link_input` would accept (an incoming call, not an impulse, or a return
        value; one that is awaited or a reply naming ``sender``), decoded on its own: no
        reader, no frame objects. False, having queued nothing, for anything else, which
        the general path then reads and refuses with its errors."""
        msg = one_link_message(data)
        if msg is None:
            return False
        if type(msg) is IncomingReturnValue:
            if msg.sender != sender:
                return False
        elif type(msg) is IncomingRpc:
            kind = msg.rpc_type
            if kind is wire.RpcType.IMPULSE or (
                kind is wire.RpcType.ASYNC_AWAIT and msg.sender != sender
            ):
                return False
        else:
            return False
        self._queue([data], False, sender, self.inbox.accept(sender, 1))
        return True

    def _queue_forks(self, sender: str, forks: Sequence[wire.Payload], size: int) -> int:
        """Queue the fork calls of one link frame (``size`` bytes in all) from ``sender``."""
        n = len(forks)
        seq = self.inbox.accept(sender, n) - n
        pending = self.pending
        for fork in forks:
            seq += 1
            pending.append(([fork], False, sender, seq))
        self.enqueued += n
        self.pending_bytes += size
        return n

    def take(
        self, max_bytes: int, max_messages: int | None = None
    ) -> tuple[list[wire.Payload], int, dict[str, int]]:
        """Remove pending input, at most ``max_bytes`` (at least one message), as buffers.

        Returns the buffers (small ones joined, large payloads left as views: see
        ``wire.coalesce_parts``), how many replayable outputs of the binding they hold,
        and per link sender the seq after its last message in them (the watermarks).
        """
        taken = 0
        n = 0
        outputs = 0
        marks: dict[str, int] = {}
        for parts, replayable, sender, seq in self.pending:
            size = sum(map(len, parts))
            if n and (taken + size > max_bytes or n == max_messages):
                break
            taken += size
            outputs += replayable
            if sender is not None:
                marks[sender] = seq
            n += 1
        out = [p for parts, _, _, _ in self.pending[:n] for p in parts]
        del self.pending[:n]
        self.dequeued += n
        self.pending_bytes -= taken
        self.queued_outputs -= outputs
        return wire.coalesce_parts(out), outputs, marks

    def _queue(
        self, parts: list[wire.Payload], replayable: bool, sender: str | None = None, seq: int = 0
    ) -> None:
        self.pending.append((parts, replayable, sender, seq))
        self.enqueued += 1
        self.pending_bytes += sum(map(len, parts))

    def _input(self, parts: list[wire.Payload], replayable: bool) -> None:
        if replayable:
            index = self.received_outputs
            self.received_outputs += 1
            if index < self.skip_below:
                self.dropped += 1
                return
            self.queued_outputs += 1
        self._queue(parts, replayable)

    def _output(
        self, destination: str, frame: bytes, replayable: bool, offset: int, *, call: bool
    ) -> None:
        """Queue a call (``call``) or return value (``frame``, in its incoming form) for
        another instance."""
        if not replayable:
            raise wire.MalformedMessageError(
                f"an impulse for instance {destination!r}: impulses are input from the "
                "outside world to the instance itself and are never sent to another",
                offset=offset,
            )
        if call and self.require_attach and destination not in self.attached:
            raise wire.MalformedMessageError(
                f"a call for instance {destination!r} before any AttachTo {destination!r}: "
                "a binding attaches to each instance before its first call to it (seed 002, "
                "Attach-before-send protocol)",
                offset=offset,
            )
        box = self.outboxes.get(destination)
        if box is None:
            box = self.outboxes[destination] = Outbox(budget=self.outbox_budget)
            self.new_destinations.append(destination)
        box.add(frame)

    def _rpc(self, raw: bytes | memoryview, offset: int) -> str:
        """One outgoing RPC frame, the general path; returns its destination."""
        destination, prefix, body = to_incoming(raw)
        if destination in ("", self.instance):
            self._input([prefix, body], is_replayable(body))
        else:
            replayable = is_replayable(body)
            self._output(destination, prefix + bytes(body), replayable, offset, call=not body[0])
        return destination

    def _small_rpcs(self, frames: list[bytes], offset: int) -> None:
        """RPC frames under 8 KiB from ``MessageReader.take_rpc_frames``, at ``offset``.

        The same as :meth:`_rpc` per frame, with the common shape done inline: a
        destination name already seen (its length one varint byte) and a method id of
        one varint byte or a return value. Any other frame takes :meth:`_rpc`, which
        checks it in full and raises the documented errors.
        """
        names = self._names
        instance = self.instance
        outboxes = self.outboxes
        pending = self.pending
        attached = self.attached if self.require_attach else None
        for raw in frames:
            n = len(raw)
            at = 1 if raw[0] < 0x80 else 2  # after the size varint: the type byte
            nl = raw[at + 1] if at + 1 < n else 0x80
            name_at = at + 2
            body_at = name_at + (nl >> 1)
            dest = (
                names.get(raw[name_at:body_at])
                if nl < 0x80 and not nl & 1 and body_at < n
                else None
            )
            if dest is None:
                dest = self._rpc(raw, offset)
                if nl < 0x80 and not nl & 1 and body_at < n:
                    if len(names) >= _MAX_NAMES:
                        names.clear()
                    names[raw[name_at:body_at]] = dest
                offset += n
                continue
            if raw[body_at]:
                replayable = True  # a return value
            else:  # a call: skip its method id (a ZigZagInt: 32 bits, at most 5 bytes)
                p = body_at + 1
                last = min(p + 5, n)
                while p < last and raw[p] >= 0x80:
                    p += 1
                if p < last and (p - body_at < 5 or raw[p] <= 0x0F):
                    replayable = p + 1 >= n or raw[p + 1] != _IMPULSE
                else:  # not a valid varint: is_replayable raises what decoding does
                    replayable = is_replayable(memoryview(raw)[body_at:])
            m = (n - body_at + 1) << 1  # the incoming frame's size, as a ZigZagInt
            prefix = bytes((m, 0)) if m < 0x80 else bytes(((m & 0x7F) | 0x80, m >> 7, 0))
            frame = prefix + raw[body_at:]
            if dest == "" or dest == instance:
                if replayable:
                    index = self.received_outputs
                    self.received_outputs = index + 1
                    if index < self.skip_below:
                        self.dropped += 1
                        offset += n
                        continue
                    self.queued_outputs += 1
                pending.append(([frame], replayable, None, 0))
                self.enqueued += 1
                self.pending_bytes += len(frame)
            elif replayable and (attached is None or raw[body_at] or dest in attached):
                box = outboxes.get(dest)
                if box is None:
                    box = outboxes[dest] = Outbox(budget=self.outbox_budget)
                    self.new_destinations.append(dest)
                box.add(frame)
            else:  # raises: an impulse, or a call before its AttachTo
                self._output(dest, frame, replayable, offset, call=not raw[body_at])
            offset += n

    def _frame(self, frame: RawMessage) -> IntakeEvent | None:
        t = frame.type
        if t == MessageType.RPC:
            self._rpc(frame.raw, frame.offset)
            return None
        msg = self._reader.decode(frame)
        if isinstance(msg, RpcBatch):
            for inner in msg.messages:
                self._route_message(inner, frame.offset)
            return None
        if isinstance(msg, AttachTo):
            self.attached.add(msg.destination)
            return None
        if isinstance(msg, TakeCheckpoint):
            return CheckpointRequested()
        if isinstance(msg, Checkpoint):
            return CheckpointArrived(
                msg.blob,
                self.received_outputs,
                self.enqueued,
                self.outbox_snapshot(),
                self.attached_snapshot(),
            )
        if isinstance(msg, InitialMessage):
            return InitialArrived(bytes(frame.raw))
        raise wire.MalformedMessageError(
            f"a binding does not send {t.name} (type {int(t)})", offset=frame.offset
        )

    def _route_message(self, msg: wire.Message, offset: int) -> None:
        if isinstance(msg, OutgoingRpc):
            incoming: wire.Message = IncomingRpc(
                msg.method_id, msg.rpc_type, msg.args, msg.sender, msg.call_seq
            )
        elif isinstance(msg, OutgoingReturnValue):
            incoming = IncomingReturnValue(msg.return_type, msg.sender, msg.call_seq, msg.value)
        else:  # pragma: no cover - the batch decoder only yields RPC messages
            raise wire.MalformedMessageError(f"batch holds a {type(msg).__name__}")
        frame = wire.encode_message(incoming)
        _, pos = wire.decode_zigzag_int(frame, 0)
        body = memoryview(frame)[pos + 1 :]
        if msg.destination in ("", self.instance):
            self._input([frame], is_replayable(body))
        else:
            call = isinstance(msg, OutgoingRpc)
            self._output(msg.destination, frame, is_replayable(body), offset, call=call)
