"""Exactly-once links between coordinators, sans-IO (reference ambrosia.md, *Between
coordinators*).

One link carries the calls and return values one instance sends another. The sending
coordinator numbers what its binding addresses to each destination (0, 1, 2, ... per
destination; replay regenerates the same messages with the same numbers, since the binding
is deterministic) and keeps each in an :class:`Outbox` until the destination says it has
it durably. The receiving coordinator logs what arrives like any other input, and records
per sender the next number it expects (:class:`Inbox`, and watermarks in every log record
and checkpoint). The conversation on one connection, dialer = sender:

* sender → receiver: :class:`Hello` (who is calling whom, and the sender's incarnation),
  then batches of messages in the receiver's incoming form, numbered implicitly from where
  the receiver asked.
* receiver → sender: ``ReplayFrom(n, n)`` once (the first number it does not have
  durably or queued), a ``Commit`` of what it already holds durably, then ``Commit(n, n)``
  after each record that made messages durable: the sender drops everything below ``n``
  (a ReplayFrom alone never lets it drop anything).

Every message on a link is replayable: impulses come from the outside world into an
instance's own log and are never sent to another instance, so the two numbers of the
reference's ReplayFrom and Commit (all messages, replayable messages) are equal here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import attrs

from ... import wire
from ...flow import Token

__all__ = [
    "LINK_MAGIC",
    "LINK_TOKEN",
    "Hello",
    "Inbox",
    "LinkError",
    "Outbox",
    "OutboxBudget",
]

LINK_MAGIC = b"AMBLINK1"
# The flow endpoint a coordinator serves links on: well-known (first = all ones), at an
# index above FoundationDB's own well-known endpoints.
LINK_TOKEN = Token(0xFFFF_FFFF_FFFF_FFFF, 0x414D_4252)  # "AMBR"


class LinkError(wire.ProtocolError):
    """A peer coordinator broke the link protocol; the connection is closed."""


@attrs.frozen
class Hello:
    """The first frame of a link: ``magic | zigzag len | sender | zigzag len | destination
    | zigzag incarnation``.

    ``incarnation`` is the sender's committer id, drawn at its first start and kept for
    its whole history: a sender that started over from nothing has a new one, and its
    numbering restarted with it (see :meth:`Inbox.check_incarnation`).
    """

    sender: str
    destination: str
    incarnation: int

    def encode(self) -> bytes:
        out = bytearray(LINK_MAGIC)
        for name in (self.sender, self.destination):
            raw = name.encode()
            out += wire.encode_zigzag_int(len(raw)) + raw
        out += wire.encode_zigzag_int(self.incarnation)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes | memoryview) -> Hello:
        mv = memoryview(data)
        if bytes(mv[: len(LINK_MAGIC)]) != LINK_MAGIC:
            raise LinkError("link hello does not start with the link magic", offset=0)
        pos = len(LINK_MAGIC)
        names = []
        for what in ("sender", "destination"):
            n, pos = wire.decode_zigzag_int(mv, pos)
            if n <= 0 or pos + n > len(mv):
                raise LinkError(f"link hello: {what} name length {n}", offset=pos)
            try:
                names.append(str(mv[pos : pos + n], "utf-8"))
            except UnicodeDecodeError:
                raise LinkError(f"link hello: {what} name is not UTF-8", offset=pos) from None
            pos += n
        if pos >= len(mv):
            raise LinkError("link hello: the incarnation is missing", offset=pos)
        incarnation, pos = wire.decode_zigzag_int(mv, pos)
        if pos != len(mv):
            raise LinkError(f"link hello: {len(mv) - pos} trailing bytes", offset=pos)
        return cls(names[0], names[1], incarnation)


class OutboxBudget:
    """The bytes all of one instance's outboxes hold, and when its binding must wait.

    Output stays in an outbox until its destination confirms it durable, so while a
    destination is down (or slow) it piles up in memory and in every checkpoint. Past
    ``limit`` bytes over all outboxes the budget is :attr:`paused`: the coordinator stops
    reading its binding, which then blocks writing more. It resumes only once commits
    bring the total below :attr:`resume_below` (three quarters of the limit), so a
    binding is not woken for every message a destination confirms. ``limit`` None: no
    limit. ``on_resume`` runs when the budget stops being paused.

    The limit bounds what the binding adds; one read of the binding's socket (and the one
    message it may end inside) can still go past it before the pause takes effect.
    """

    RESUME_FRACTION = 0.75

    def __init__(self, limit: int | None = None) -> None:
        if limit is not None and limit <= 0:
            raise ValueError(f"an outbox limit must be above 0 bytes, not {limit}")
        self.limit = limit
        self.resume_below = None if limit is None else int(limit * self.RESUME_FRACTION)
        self.total = 0
        self.paused = False
        self.on_resume: Callable[[], None] | None = None

    def added(self, size: int) -> None:
        """``size`` bytes of output were queued (or restored from a checkpoint)."""
        self.total += size
        if self.limit is not None and self.total > self.limit:
            self.paused = True

    def released(self, size: int) -> None:
        """``size`` bytes were confirmed durable by their destination and dropped."""
        self.total -= size
        assert self.total >= 0, f"outbox budget below zero ({self.total})"
        if self.paused and self.resume_below is not None and self.total < self.resume_below:
            self.paused = False
            if self.on_resume is not None:
                self.on_resume()


class Outbox:
    """What this instance sent one destination and the destination may not have yet.

    ``next_seq`` numbers the next message; the buffer holds the framed incoming messages
    from ``first`` (the lowest seq the destination has not confirmed) to ``next_seq - 1``,
    consecutive, so a seq is found by its index. While connected, ``cursor`` is the next
    seq to send on the connection. :attr:`size` is the bytes buffered, also counted in
    ``budget`` (shared by an instance's outboxes) when one is given.
    """

    def __init__(
        self,
        next_seq: int = 0,
        buffered: Iterable[tuple[int, bytes]] = (),
        budget: OutboxBudget | None = None,
    ) -> None:
        entries = list(buffered)
        self.next_seq = next_seq
        self.first = next_seq - len(entries)
        if [seq for seq, _ in entries] != list(range(self.first, next_seq)):
            raise ValueError(f"buffered output must be seqs {self.first}..{next_seq - 1}")
        self._frames = [frame for _, frame in entries]
        self.cursor: int | None = None
        self.budget = budget if budget is not None else OutboxBudget()
        self.size = sum(len(frame) for frame in self._frames)
        self.budget.added(self.size)

    def add(self, frame: bytes) -> int:
        """Queue one message (incoming form, framed); return its seq."""
        seq = self.next_seq
        self.next_seq += 1
        self._frames.append(frame)
        self.size += len(frame)
        self.budget.added(len(frame))
        return seq

    @property
    def buffered(self) -> list[tuple[int, bytes]]:
        """The unconfirmed messages, oldest first (what a checkpoint keeps)."""
        return list(enumerate(self._frames, self.first))

    def connected(self, replay_from: int) -> None:
        """The destination asked for everything from ``replay_from`` on.

        Nothing is forgotten here: the destination may have below ``replay_from`` only
        queued, not durable, and ask for it again after a crash. Only a Commit says durable.
        """
        if replay_from < self.first:
            raise LinkError(
                f"peer asks to replay from seq {replay_from}, but everything below "
                f"{self.first} was confirmed durable by it earlier and is gone: its log lost "
                "committed input"
            )
        self.cursor = replay_from

    def disconnected(self) -> None:
        self.cursor = None

    def commit(self, seq: int) -> None:
        """The destination has everything below ``seq`` durably: forget it.

        It can only have what was sent to it: a commit past the connection's cursor is a
        peer out of protocol, refused before it can make us forget unsent output.
        """
        if self.cursor is not None and seq > self.cursor:
            raise LinkError(
                f"peer commits up to seq {seq}, but only {self.cursor} messages were sent to it"
            )
        if seq > self.first:
            drop = min(seq, self.next_seq) - self.first
            size = sum(len(frame) for frame in self._frames[:drop])
            del self._frames[:drop]
            self.first += drop
            self.size -= size
            self.budget.released(size)

    def take(self, max_bytes: int) -> list[bytes]:
        """Messages to send next on the connection (at least one if any), advancing it.

        Below the cursor is what was sent on this connection already, or what the
        destination has although this instance regenerated it (recovery).
        """
        if self.cursor is None:
            return []
        out: list[bytes] = []
        size = 0
        frames = self._frames
        # first <= cursor always: connected() checks it, commit() never passes the cursor.
        for i in range(self.cursor - self.first, len(frames)):
            if out and size + len(frames[i]) > max_bytes:
                break
            out.append(frames[i])
            size += len(frames[i])
        self.cursor += len(out)
        return out


class Inbox:
    """Per sender, the seq of the next message to log (durable or queued) and the durable
    one, which ``Commit`` reports; and the sender's incarnation, once it has linked."""

    def __init__(
        self, durable: dict[str, int] | None = None, incarnations: dict[str, int] | None = None
    ) -> None:
        self.durable: dict[str, int] = dict(durable or {})
        self.queued: dict[str, int] = dict(self.durable)
        self.incarnations: dict[str, int] = dict(incarnations or {})

    def check_incarnation(self, hello: Hello) -> None:
        """Refuse a sender that started over: its numbering restarted, so its new calls
        would be taken for ones already logged and dropped."""
        known = self.incarnations.setdefault(hello.sender, hello.incarnation)
        if known != hello.incarnation:
            raise LinkError(
                f"instance {hello.sender!r} started over from an empty history (committer id "
                f"{known}, now {hello.incarnation}): its calls from seq "
                f"{self.queued.get(hello.sender, 0)} down would be dropped as duplicates, so "
                "its link is refused; restore its data directory, or give it a new name"
            )

    def expect(self, sender: str) -> int:
        """Where a (re)connecting sender must resume: everything below is logged or queued."""
        return self.queued.get(sender, 0)

    def accept(self, sender: str, count: int) -> int:
        """``count`` messages arrived from ``sender``; return the seq after them."""
        seq = self.queued.get(sender, 0) + count
        self.queued[sender] = seq
        return seq

    def made_durable(self, marks: dict[str, int]) -> None:
        for sender, seq in marks.items():
            if seq > self.durable.get(sender, 0):
                self.durable[sender] = seq
