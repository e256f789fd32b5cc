"""Group commit in two stages: write the next record while the last one is synced.

The coordinator's log is disk-bound. Writing a record (``writev`` into the page cache)
and making it durable (``fdatasync``) each take a large share of a record's time, so doing
them one after the other leaves the disk idle while the kernel copies, and the copy idle
while the disk works. The pipeline overlaps them, the way the released coordinator's
double buffers do: the committer writes record N+1 while a second worker thread runs
``fdatasync`` for everything written up to record N.

The rule that matters is unchanged: a record is forwarded to the binding only after an
``fdatasync`` that *started after its write had finished* returned. ``fdatasync`` makes
durable everything written before the call; a record written while a sync is in flight
waits for the next one. A crash in between leaves at most a partial last record, which
recovery cuts as a torn tail.

Forwarding here means handing the record to the coordinator's forwarder
(:mod:`.forwarding`), which never waits for the binding: the pipeline must keep logging,
and ``on_durable`` (the Commit to the senders in the record) must run, while a binding
is blocked, or two instances waiting on each other's outbox limit would deadlock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, TypeVar

from ... import wire
from ..storage.files import LogWriter

__all__ = ["INLINE_MAX_BYTES", "CommitPipeline"]

# The largest record the latency path takes. A larger one is throughput, not a request
# waiting for its answer: written and synced on the event loop it stopped the loop for
# milliseconds (a 4 MiB link frame), and with it the reading of the links, whose senders
# then stalled (64 KiB forks between two instances ran measurably slower).
INLINE_MAX_BYTES = 256 * 1024

R = TypeVar("R")  # what is forwarded for a record: its wire form (and where it lies)


class CommitPipeline(Generic[R]):
    """Records written to a log, made durable by a sync stage, then forwarded in order.

    ``append`` writes one record and returns once it is in the file (not yet durable);
    ``flush`` returns once everything appended so far is durable and forwarded. At most
    ``max_unsynced`` bytes wait for a sync at any time (``append`` waits for room).
    ``forward`` should not wait for the binding (see the module docstring).
    """

    def __init__(self, forward: Callable[[R], None], *, max_unsynced: int) -> None:
        self._forward = forward
        self._max_unsynced = max_unsynced
        # per written record: its file, what to forward, its size, what to run once durable
        self._written: list[tuple[LogWriter, R, int, Callable[[], None] | None]] = []
        self._unsynced_bytes = 0
        self._appended = 0  # records appended so far
        self._done = 0  # records durable and forwarded so far
        self._changed = asyncio.Condition()  # for appenders (room) and flush (done)
        self._to_sync = asyncio.Event()  # for the sync stage: records were written
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._sync_loop())

    async def append(
        self,
        writer: LogWriter,
        disk_parts: list[wire.Payload],
        wire_record: R,
        on_durable: Callable[[], None] | None = None,
        *,
        alone: bool = False,
    ) -> None:
        """Write one record (its disk form) and queue ``wire_record`` for forwarding.

        ``on_durable`` runs once the record is durable, before it is forwarded: it tells
        the senders, and durability, not delivery, is what that promises. With ``alone``
        (no more input is waiting), nothing in flight and a record of at most
        :data:`INLINE_MAX_BYTES`, there is nothing to overlap: the record is written and
        synced right away, on the calling thread, and forwarded at once — the latency
        path, with no hop through worker threads.
        """
        size = sum(map(len, disk_parts))
        if alone and size <= INLINE_MAX_BYTES and self.idle:
            self.append_now(writer, disk_parts, wire_record, on_durable)
            return
        async with self._changed:
            await self._changed.wait_for(
                lambda: self._error is not None or self._unsynced_bytes < self._max_unsynced
            )
            self.check()
        # Only this coroutine writes, so the file sees records in order.
        await asyncio.to_thread(writer.write, disk_parts)
        async with self._changed:
            self._written.append((writer, wire_record, size, on_durable))
            self._unsynced_bytes += size
            self._appended += 1
        self._to_sync.set()

    @property
    def idle(self) -> bool:
        """Nothing in flight (every record appended is durable and forwarded) and nothing
        failed: :meth:`append_now` may run."""
        return self._done == self._appended and self._error is None

    def append_now(
        self,
        writer: LogWriter,
        disk_parts: list[wire.Payload],
        wire_record: R,
        on_durable: Callable[[], None] | None = None,
    ) -> None:
        """The latency path of :meth:`append`, for a caller that found the pipeline
        :attr:`idle` and holds a record of at most :data:`INLINE_MAX_BYTES`: written,
        synced, ``on_durable`` run and forwarded right away, on the calling thread.

        Inline, on the event loop: nothing else is waiting to be written, and two thread
        hops cost more than the fsync itself. Input arriving meanwhile is read after it.
        No waiter needs telling: with nothing in flight, none waits for room or for this
        record.
        """
        assert self.idle, "append_now with records in flight"
        self._appended += 1
        try:
            writer.append(disk_parts)
            if on_durable is not None:
                on_durable()
            self._forward(wire_record)
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._done += 1

    async def flush(self) -> None:
        """Wait until every record appended so far is durable and forwarded."""
        target = self._appended
        async with self._changed:
            await self._changed.wait_for(lambda: self._error is not None or self._done >= target)
            self.check()

    async def close(self) -> None:
        """Stop the sync stage (after :meth:`flush` when nothing went wrong)."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def check(self) -> None:
        """Raise what failed, if a record's write, sync or forwarding did."""
        if self._error is not None:
            raise self._error

    async def _sync_loop(self) -> None:
        try:
            while True:
                await self._to_sync.wait()
                self._to_sync.clear()
                batch, self._written = self._written, []
                # Everything in the batch was fully written before this sync starts.
                synced: set[int] = set()
                for writer, _, _, _ in batch:
                    if id(writer) not in synced:
                        await asyncio.to_thread(writer.sync)
                        synced.add(id(writer))
                for _, record, _, done in batch:
                    if done is not None:
                        done()
                    self._forward(record)
                async with self._changed:
                    self._unsynced_bytes -= sum(size for _, _, size, _ in batch)
                    self._done += len(batch)
                    self._changed.notify_all()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a failed sync or a lost binding: stop everything
            async with self._changed:
                self._error = exc
                self._changed.notify_all()
