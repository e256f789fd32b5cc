"""Flow control between the coordinator and its binding, both ways, without a deadlock.

Two mechanisms live here, and each is safe only because of the other:

* **Forwarding never holds up the commit loop** (:class:`Forwarder`). A durable record is
  handed to the forwarder, which sends it once the binding has taken the one before.
  While more than ``memory_bytes`` of records wait, further records are not kept in
  memory: only their place in the log is, and they are read back from the log file when
  the binding is ready for them. The log is the buffer.
* **Output waits for its destinations** (:class:`OutboxGate`). Past the outbox limit
  (:class:`~.links.OutboxBudget`: bytes sent to other instances and not yet confirmed
  durable by them) the coordinator stops reading its binding, whose ``drain()`` then
  blocks it, until commits bring the total back below three quarters of the limit.

Why the commit loop must never wait for the binding. Take instances A and B that call
each other, both past their limit, so neither coordinator reads its binding. Each binding
blocks writing its outputs and stops reading records. If forwarding a record waited for
the binding (as it did when the commit loop awaited ``drain()`` before each forward), A's
commit loop would stall on the first record for its blocked binding; it would stop
logging B's calls, so it would never Commit them; B's outbox would never shrink and B
would stay paused; and the same from B's side: a deadlock. Decoupled, A keeps logging
B's calls and tells B they are durable as soon as they are (a Commit promises
durability, not delivery: ``on_durable`` runs before forwarding, see :mod:`.commit`); B's
outbox shrinks, B reads its binding again, its binding takes A's calls and B commits
them, and A resumes. And while A's binding is blocked because a destination C is down,
whatever B keeps sending A is logged and waits in A's log, not in A's memory.

Order and checkpoints: records (and the TakeCheckpoint control record, which is not
logged) reach the binding in the order they were put, whether kept in memory or read
back. So the binding's checkpoint after a roll still follows every record of the old
log, and a log can be pruned only after a checkpoint the binding made having consumed
all of it; a spilled range keeps its own file descriptor besides, so it stays readable
whatever happens to the file's name.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from ... import wire
from ...wire.records import disk_to_wire, encode_record_parts
from ..links.protocol import Outbox, OutboxBudget
from ..storage.errors import CorruptLogError
from ..storage.files import LogWriter
from .binding_link import BindingLink

__all__ = ["FORWARD_MEMORY_BYTES", "Forwarded", "Forwarder", "LogPlace", "OutboxGate"]

log = logging.getLogger("ambrosia_py.coordinator")

# Records waiting for the binding kept in memory, beyond which they wait in the log. A
# binding that keeps up never falls this far behind; one that does is read back from the
# page cache at the cost of a copy.
FORWARD_MEMORY_BYTES = 8 * 1024 * 1024
READ_BYTES = 1024 * 1024  # what one read-back takes from a log (at least one record)
PAUSE_LOG_S = 1.0  # a pause of the binding this long gets a log line


@attrs.frozen
class LogPlace:
    """Where a record's disk form lies: its log, the offset of its header, its size
    (header, messages and watermarks)."""

    path: Path
    offset: int
    size: int

    @classmethod
    def next_in(cls, writer: LogWriter, disk_parts: list[wire.Payload]) -> LogPlace:
        """Where the next record ``writer`` writes will lie (one writer, one at a time)."""
        return cls(writer.path, writer.size, sum(map(len, disk_parts)))


# A record in wire form and where it lies in its log (None: a control record, not logged).
Forwarded = tuple[list[wire.Payload], LogPlace | None]


@attrs.define
class _Held:
    """A record kept in memory in its wire form."""

    parts: list[wire.Payload]
    size: int


@attrs.define
class _Spilled:
    """Consecutive records of one log, ``[start, end)``, to be read back in order."""

    path: Path
    fd: int
    start: int
    end: int
    reader: wire.RecordReader = attrs.field(factory=lambda: wire.RecordReader(on_disk=True))

    def read(self, end: int) -> tuple[list[wire.Payload], int]:
        """Read the next records up to ``end`` (at least one whole record): their wire
        forms and the offset after them. Blocking: run in a worker thread."""
        parts: list[wire.Payload] = []
        at = self.start + self.reader.buffered  # where the bytes fed so far end
        base = self.start - self.reader.offset  # file offset of the reader's stream start
        while not parts:
            if at >= end:
                raise CorruptLogError(
                    self.path,
                    self.start,
                    None,
                    "an incomplete record where a whole one was written",
                )
            chunk = os.pread(self.fd, min(READ_BYTES, end - at), at)
            if not chunk:
                raise CorruptLogError(
                    self.path, at, None, f"the log ends before offset {end}, which was written"
                )
            at += len(chunk)
            self.reader.feed(chunk)
            try:
                while (raw := self.reader.next_raw()) is not None:
                    # The disk form's check bytes cover the messages only: the wire header
                    # is the disk header with the length positive, and the body goes as is.
                    parts += [disk_to_wire(raw.header, b""), raw.body]
            except wire.ProtocolError as exc:
                offset = base + (exc.offset or 0)
                raise CorruptLogError(self.path, offset, exc.seq, exc.reason) from None
        return parts, base + self.reader.offset


class Forwarder:
    """Durable records on their way to the binding, in order; :meth:`put` never waits.

    ``on_stop`` runs when forwarding cannot go on and the coordinator must stop: the
    binding has gone (the reader may not notice: it does not read while the outboxes are
    over their limit), or a spilled record cannot be read back (the log changed under the
    coordinator; :attr:`error` says how).
    """

    def __init__(
        self,
        binding: BindingLink,
        on_stop: Callable[[], object],
        *,
        memory_bytes: int = FORWARD_MEMORY_BYTES,
    ) -> None:
        self._binding = binding
        self._on_stop = on_stop
        self._memory_bytes = memory_bytes
        self._queue: collections.deque[_Held | _Spilled] = collections.deque()
        self.held_bytes = 0  # records kept in memory
        self.max_held_bytes = 0  # the most ever kept (for tests and figures)
        self._spilled = 0  # spilled ranges in the queue
        self.spilled_records = 0  # records ever spilled
        self._busy = False  # written to the binding, maybe not taken yet
        self._kick = asyncio.Event()
        self._settled = asyncio.Event()  # nothing queued, nothing in flight
        self._settled.set()
        self.error: BaseException | None = None
        self._reading: asyncio.Future[tuple[list[wire.Payload], int]] | None = None
        self._task = asyncio.create_task(self._run())

    def put(self, record: list[wire.Payload], place: LogPlace | None = None) -> None:
        """Queue a record (wire form) for the binding. ``place``: where it lies in its log;
        None for a control record, which is not logged (and is always kept in memory)."""
        if self.error is not None or self._binding.gone:
            return  # stopping: what is durable reaches the next binding by replay
        if not self._queue and not self._busy:
            self._binding.write(record)  # the latency path: nothing ahead of it
            if self._binding.flushed and not self._binding.gone:
                return  # the socket took it all: nothing for the forwarding task to do
            self._busy = True
        else:
            size = sum(len(p) for p in record)
            # Once one record waits in the log, the rest follow it there (order is kept,
            # and consecutive records join one range, so memory stays flat however long
            # the binding is away).
            if place is not None and (self._spilled or self.held_bytes + size > self._memory_bytes):
                self._spill(place)
            else:
                self._queue.append(_Held(record, size))
                self.held_bytes += size
                self.max_held_bytes = max(self.max_held_bytes, self.held_bytes)
        self._settled.clear()
        self._kick.set()

    def control(self, committer_id: int, msg: wire.Message) -> None:
        """Queue a control record (seq -1), in order behind the records put before it."""
        self.put(encode_record_parts(committer_id, wire.CONTROL_SEQ, [msg]))

    def _spill(self, place: LogPlace) -> None:
        self.spilled_records += 1
        last = self._queue[-1] if self._queue else None
        if isinstance(last, _Spilled) and last.path == place.path and last.end == place.offset:
            last.end += place.size
            return
        # The range keeps its own descriptor: readable whatever happens to the name.
        fd = os.open(place.path, os.O_RDONLY)
        self._queue.append(_Spilled(place.path, fd, place.offset, place.offset + place.size))
        self._spilled += 1

    async def flush(self) -> None:
        """Wait until every record put has been handed to the binding (or it has gone)."""
        await self._settled.wait()

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if self._reading is not None:  # a worker thread may still use a descriptor
            await asyncio.gather(self._reading, return_exceptions=True)
        self._discard()

    def _discard(self) -> None:
        while self._queue:
            item = self._queue.popleft()
            if isinstance(item, _Spilled):
                os.close(item.fd)
        self.held_bytes = self._spilled = 0

    async def _run(self) -> None:
        try:
            while True:
                await self._binding.drain()  # the binding has taken what was written
                self._busy = False
                if self._binding.gone:
                    self._discard()
                    self._on_stop()
                if not self._queue:
                    self._settled.set()
                    self._kick.clear()
                    await self._kick.wait()
                    continue
                item = self._queue[0]
                if isinstance(item, _Held):
                    self._queue.popleft()
                    self.held_bytes -= item.size
                    parts = item.parts
                else:
                    # ``end`` may grow meanwhile (put extends the last range): read up to
                    # what it is now. Shielded: close() waits for the thread to finish.
                    self._reading = asyncio.ensure_future(asyncio.to_thread(item.read, item.end))
                    parts, item.start = await asyncio.shield(self._reading)
                    if item.start == item.end:
                        self._queue.popleft()
                        self._spilled -= 1
                        os.close(item.fd)
                self._binding.write(parts)
                self._busy = True
        except asyncio.CancelledError:
            raise
        except (OSError, CorruptLogError) as exc:
            log.error("cannot forward logged records to the binding: %s", exc)
            self.error = exc
            self._discard()
            self._settled.set()
            self._on_stop()


class OutboxGate:
    """Where the binding's reader waits while the outboxes are over their limit.

    The asyncio side of :class:`~.links.OutboxBudget`; a pause that lasts
    :data:`PAUSE_LOG_S` is logged, naming what each destination holds, and so is its end.
    """

    def __init__(self, budget: OutboxBudget, outboxes: Mapping[str, Outbox]) -> None:
        self._budget = budget
        self._outboxes = outboxes
        self._resumed = asyncio.Event()
        budget.on_resume = self._resumed.set

    @property
    def paused(self) -> bool:
        return self._budget.paused

    async def wait(self) -> None:
        """Return at once unless paused; else once commits brought the total down."""
        if not self.paused:
            return
        self._resumed.clear()
        started = time.monotonic()
        try:
            async with asyncio.timeout(PAUSE_LOG_S):
                await self._resumed.wait()
            return
        except TimeoutError:
            pass
        held = ", ".join(
            f"{dest!r} {box.size} bytes" for dest, box in self._outboxes.items() if box.size
        )
        log.info(
            "not reading the binding: its output not yet confirmed by other instances (%s) is "
            "over the outbox limit of %d bytes; waiting for it to fall below %d",
            held,
            self._budget.limit,
            self._budget.resume_below,
        )
        await self._resumed.wait()
        log.info(
            "reading the binding again after %.1f s: %d bytes of output unconfirmed",
            time.monotonic() - started,
            self._budget.total,
        )
