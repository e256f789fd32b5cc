"""The coordinator's protocol logic, sans-IO: the binding's and the links' bytes in,
numbered log records and control events out.

The binding sends bare messages (seed 002); the coordinator logs *input* — the calls and
return values addressed to its own instance — in the incoming form its binding will
receive, and handles the rest itself. :class:`Intake` is shaped as h11's connection is:
bytes go in (:meth:`Intake.receive_data` from the binding, :meth:`Intake.link_input` for
one link frame), events come out (:meth:`Intake.next_event`: the binding's control
messages; :meth:`Intake.next_record`: the next log record, ready to append, forward and
confirm, see :mod:`.events`), and :meth:`Intake.made_durable` is told when a record is
durable. It owns no socket, file or clock; :mod:`.server` drives it. The byte format of
the coordinator's checkpoint files is :mod:`.checkpoint`'s.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

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
from ...wire.records import coalesce_parts, encode_disk_tail, encode_marks_tail, record_headers
from ..links.protocol import Inbox, LinkError, Outbox, OutboxBudget
from .checkpoint import IcState, OutboxState, StateFormatError
from .events import (
    CheckpointArrived,
    CheckpointRequested,
    ControlEvent,
    InitialArrived,
    RecordReady,
    new_record_ready,
)
from .routing import count_replayable, is_replayable, to_incoming

__all__ = [
    "CheckpointArrived",
    "CheckpointRequested",
    "ControlEvent",
    "IcState",
    "InitialArrived",
    "Intake",
    "OutboxState",
    "RecordReady",
    "StateFormatError",
]

_MAX_NAMES = 4096  # destination names remembered by Intake (then it starts over)
_EMPTY_TAIL = encode_disk_tail()  # a record's watermarks when no link sent to it
# Link messages this large are queued as views of their frame (when it cannot change);
# smaller ones as copies of their own, which do not keep the frame alive.
_VIEW_FROM = 8 * 1024
_FORK = wire.RpcType.FORK
_IMPULSE = wire.RpcType.IMPULSE
_MESSAGE_TYPES = {int(t): t for t in MessageType}


class Intake:
    """Sorts the binding's byte stream into input to log, output and control events, and
    cuts the input, with the links', into numbered records.

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

    Input for this instance waits in :attr:`pending` (framed incoming messages as
    buffers, ready to be packed into a record without copying) until
    :meth:`next_record` cuts it into a record numbered :attr:`next_seq` under
    :attr:`committer_id`.
    """

    def __init__(self, instance: str, max_outbox_bytes: int | None = None) -> None:
        self.instance = instance
        self.outbox_budget = OutboxBudget(max_outbox_bytes)
        self._reader = MessageReader()
        self._events: collections.deque[ControlEvent] = collections.deque()
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
        # The records: their numbering, and the binding's replayable outputs in them.
        self.committer_id = 0
        self.next_seq = 0
        self.logged_outputs = 0
        self._initial: bytes | None = None  # an InitialMessage, record of its own, not cut

    @property
    def offset(self) -> int:
        """Bytes of the binding's stream consumed so far."""
        return self._reader.offset

    # --- bytes in ---------------------------------------------------------------------------

    def receive_data(self, data: bytes | memoryview) -> None:
        """Consume bytes from the binding; ``b""``: its stream ended (raises if it ended
        inside a message). Raises :class:`wire.ProtocolError` on bad input."""
        reader = self._reader
        if not data:
            reader.close()
            return
        reader.feed(data)
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
                return
            self._frame(frame)

    def link_input(self, sender: str, payload: bytes | memoryview) -> int:
        """Queue the messages of one link frame from ``sender``; return how many.

        Every message is decoded (``wire.decode_messages``, the incoming form) and checked
        before anything is queued: a peer that sends anything but complete incoming calls
        and return values is refused (``LinkError``), and nothing of that frame reaches
        the log. A reply, or an async/await call (whose reply goes to its sender), must
        name the peer it came from: the binding takes a reply only from the instance its
        call went to, and that holds only if the name is true.
        """
        data = payload
        if isinstance(payload, memoryview) and not (
            isinstance(payload.obj, bytes) and payload.format == "B" and payload.c_contiguous
        ):
            data = payload.tobytes()  # its owner may reuse it: what is queued must not change
        try:
            msgs = wire.decode_messages(data, 0, len(data))
        except wire.ProtocolError as exc:
            raise LinkError(f"bad message on a link: {exc}", offset=exc.offset) from None
        frames = _link_frames(data, msgs, sender)
        n = len(frames)
        if not n:
            return 0
        seq = self.inbox.accept(sender, n) - n
        pending = self.pending
        for frame in frames:
            seq += 1
            pending.append(([frame], False, sender, seq))
        self.enqueued += n
        self.pending_bytes += len(data)
        return n

    # --- events out -------------------------------------------------------------------------

    def next_event(self) -> ControlEvent | None:
        """The next control event from the binding's stream, in its order; None: none yet."""
        return self._events.popleft() if self._events else None

    def next_record(self, max_bytes: int, upto: int | None = None) -> RecordReady | None:
        """The next log record: an InitialMessage alone, else pending input, at most
        ``max_bytes`` of it (at least one message) and, with ``upto``, only messages
        queued before the ``upto``-th (see :class:`CheckpointArrived`); None: none.

        The record is numbered (:attr:`next_seq`) and its disk form carries, per link
        sender in it, its last message (the watermarks, reference ambrosia.md, *Files on
        disk*), from which recovery rebuilds the inbox.
        """
        if self._initial is not None:
            body: list[wire.Payload] = [self._initial]
            self._initial = None
            return self._seal(body, 0, {})
        room = None if upto is None else upto - self.dequeued
        if not self.pending or (room is not None and room <= 0):
            return None
        taken = 0
        n = 0
        outputs = 0
        marks: dict[str, int] = {}
        for parts, replayable, sender, seq in self.pending:
            size = sum(map(len, parts))
            if n and (taken + size > max_bytes or n == room):
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
        return self._seal(coalesce_parts(out), outputs, marks)

    def made_durable(self, record: RecordReady) -> None:
        """``record`` is durable: its link senders' messages count as durable (the inbox,
        whose numbers the links' Commits and the next checkpoint carry)."""
        if record.marks:
            self.inbox.made_durable(record.marks)

    def _seal(self, body: list[wire.Payload], outputs: int, marks: dict[str, int]) -> RecordReady:
        seq = self.next_seq
        wire_header, disk_header = record_headers(self.committer_id, seq, body)
        self.next_seq = seq + 1
        self.logged_outputs += outputs
        tail = encode_marks_tail(marks) if marks else _EMPTY_TAIL
        disk = [disk_header, *body, tail]
        return new_record_ready(seq, disk, [wire_header, *body], marks, sum(map(len, disk)))

    # --- checkpoints and recovery -----------------------------------------------------------

    def restore_outboxes(self, outboxes: dict[str, OutboxState]) -> None:
        """Recovery: the output a checkpoint kept; replay regenerates what follows."""
        for dest, (next_seq, frames) in outboxes.items():
            self.outboxes[dest] = Outbox(next_seq, frames, self.outbox_budget)
            self.new_destinations.append(dest)

    # --- following another replica's log (a secondary's continuous recovery) -----------

    def follow(self, state: IcState) -> None:
        """The binding was (re)loaded from checkpoint ``state`` and replays the log another
        replica writes: start over from it, as recovery does. What the binding
        regenerates from here is kept until the log shows it logged (:meth:`replayed`);
        what it sends other instances, until they have it (:meth:`trim_outboxes`).

        The byte stream goes on: only what was read from it is dropped."""
        self.committer_id = state.committer_id
        self.next_seq = state.next_seq
        self.received_outputs = state.binding_outputs
        self.logged_outputs = self.skip_below = state.logged_outputs
        self.dequeued += len(self.pending)
        self.pending.clear()
        self.pending_bytes = self.queued_outputs = 0
        for box in self.outboxes.values():
            box.commit(box.next_seq)  # gives its bytes back to the budget
        self.outboxes = {}
        self.new_destinations = []
        self.restore_outboxes(state.outboxes)
        self.attached = set()
        self.require_attach = True
        self.restore_attached(state.attached)
        self.inbox = Inbox(state.inbox, state.senders)

    def replayed(self, next_seq: int, outputs: int) -> None:
        """Following: the binding was sent the records below ``next_seq``, which hold
        ``outputs`` more of its own replayable outputs. Those it regenerated already are
        dropped from :attr:`pending` (they are the oldest there), the rest as they come.
        """
        self.next_seq = next_seq
        self.logged_outputs += outputs
        self.skip_below = self.logged_outputs
        first = self.received_outputs - self.queued_outputs  # the index of the oldest
        drop = min(self.skip_below - first, self.queued_outputs)
        if drop <= 0:
            return
        kept: list[tuple[list[wire.Payload], bool, str | None, int]] = []
        for entry in self.pending:
            if drop and entry[1]:
                drop -= 1
                self.queued_outputs -= 1
                self.dequeued += 1
                self.dropped += 1
                self.pending_bytes -= sum(map(len, entry[0]))
            else:
                kept.append(entry)
        self.pending = kept

    def trim_outboxes(self, points: Iterable[tuple[str, int]]) -> None:
        """Following: per destination, the seq below which it has confirmed what this
        instance sent it: forget that output. A destination not seen yet is skipped; the
        caller applies the points again after more is replayed."""
        for dest, seq in points:
            box = self.outboxes.get(dest)
            if box is not None:
                box.commit(seq)

    def outbox_trims(self) -> tuple[tuple[str, int], ...]:
        """Per destination, the seq below which it confirmed what was sent it (a
        primary's, for its secondaries' :meth:`trim_outboxes`)."""
        return tuple((dest, box.first) for dest, box in self.outboxes.items())

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

    # --- the binding's messages -------------------------------------------------------------

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

        The same as :meth:`_rpc` per frame, with a destination name already seen cut out
        by a lookup (its varints read by ``wire.varint``, as everywhere); whether the
        message is replayable is routing's answer (:func:`count_replayable` on the
        incoming frame, which reads a fork or an impulse call in C; :func:`is_replayable`
        for anything else). Any other frame takes :meth:`_rpc`, which checks it in full
        and raises the documented errors.
        """
        names = self._names
        instance = self.instance
        outboxes = self.outboxes
        pending = self.pending
        attached = self.attached if self.require_attach else None
        decode_int = wire.decode_zigzag_int
        encode_int = wire.encode_zigzag_int
        for raw in frames:
            n = len(raw)
            at = decode_int(raw, 0)[1] + 1  # after the size and the type byte: the name
            try:
                name_size, name_at = decode_int(raw, at)
            except wire.ProtocolError:  # _rpc says what is wrong
                name_size, name_at = -1, n
            body_at = name_at + name_size
            plain = name_size >= 0 and body_at < n  # a name, then a body
            dest = names.get(raw[name_at:body_at]) if plain else None
            if dest is None:
                dest = self._rpc(raw, offset)
                if plain:
                    if len(names) >= _MAX_NAMES:
                        names.clear()
                    names[raw[name_at:body_at]] = dest
                offset += n
                continue
            body = raw[body_at:]
            frame = encode_int(n - body_at + 1) + b"\x00" + body  # the incoming frame
            forks = count_replayable(frame)  # 1: a fork call, 0: an impulse
            # None: a return value or an awaited call, or not a valid one (which raises)
            replayable = is_replayable(body) if forks is None else forks == 1
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

    def _frame(self, frame: RawMessage) -> None:
        t = frame.type
        if t == MessageType.RPC:
            self._rpc(frame.raw, frame.offset)
            return
        msg = self._reader.decode(frame)
        if isinstance(msg, RpcBatch):
            for inner in msg.messages:
                self._route_message(inner, frame.offset)
        elif isinstance(msg, AttachTo):
            self.attached.add(msg.destination)
        elif isinstance(msg, TakeCheckpoint):
            self._events.append(CheckpointRequested())
        elif isinstance(msg, Checkpoint):
            self._events.append(
                CheckpointArrived(
                    msg.blob,
                    self.received_outputs,
                    self.enqueued,
                    self.outbox_snapshot(),
                    self.attached_snapshot(),
                )
            )
        elif isinstance(msg, InitialMessage):
            self._initial = bytes(frame.raw)
            self._events.append(InitialArrived(self._initial))
        else:
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


def _link_frames(
    data: bytes | memoryview, msgs: list[wire.Message], sender: str
) -> list[wire.Payload]:
    """The frames of a link frame's decoded messages ``msgs``, to queue, once each is
    checked: an incoming call that is no impulse, or a return value, naming ``sender``
    where a reply goes back to it. Raises :class:`LinkError` naming the first that is not.

    ``data`` is ``bytes`` or a view of ``bytes``. A message alone in ``bytes`` is queued
    as it is; a large one as a view of ``data`` (not copied), any other as a copy.
    """
    whole = len(msgs) == 1 and isinstance(data, bytes)
    frames: list[wire.Payload] = []
    append = frames.append
    pos = 0
    for msg in msgs:
        size, at = wire.decode_zigzag_int(data, pos)  # decoding accepted it
        stop = at + size
        if size > wire.DEFAULT_MAX_MESSAGE_SIZE:
            raise LinkError(
                f"a message of {size} bytes on a link: more than {wire.DEFAULT_MAX_MESSAGE_SIZE}",
                offset=pos,
            )
        if isinstance(msg, IncomingRpc):
            rpc_type = msg.rpc_type
            if rpc_type is not _FORK:
                if rpc_type is _IMPULSE:
                    raise LinkError("an impulse on a link", offset=pos)
                if msg.sender != sender:
                    raise _false_sender(sender, msg.sender, pos)
        elif isinstance(msg, IncomingReturnValue):
            if msg.sender != sender:
                raise _false_sender(sender, msg.sender, pos)
        else:
            name = _MESSAGE_TYPES[data[at]].name
            raise LinkError(f"a link carries calls and return values, not {name}", offset=pos)
        if whole:
            append(data)
        elif stop - pos >= _VIEW_FROM:
            append((memoryview(data) if isinstance(data, bytes) else data)[pos:stop])
        elif isinstance(data, bytes):
            append(data[pos:stop])
        else:
            append(data[pos:stop].tobytes())
        pos = stop
    return frames


def _false_sender(sender: str, claimed: str, offset: int) -> LinkError:
    return LinkError(f"a message on {sender!r}'s link names sender {claimed!r}", offset=offset)
