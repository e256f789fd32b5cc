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
import contextlib
import functools
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

# A record written, waiting for a sync: its file, what to forward, its size, what to run
# once durable.
_Written = tuple[LogWriter, R, int, Callable[[], None] | None]


class CommitPipeline(Generic[R]):
    """Records written to a log, made durable by a sync stage, then forwarded in order.

    :meth:`append` is the one way in, for a record alone and for a record of a busy
    round: called once :attr:`ready` (:meth:`wait_ready`), it either makes the record
    durable and forwards it before it returns (the latency path) or starts writing it in
    a worker thread, after which the sync stage takes it. :meth:`flush` returns once
    everything appended so far is durable and forwarded. At most ``max_unsynced`` bytes
    are written and not yet synced at any time. ``forward`` should not wait for the
    binding (see the module docstring).
    """

    def __init__(self, forward: Callable[[R], None], *, max_unsynced: int) -> None:
        self._forward = forward
        self._max_unsynced = max_unsynced
        self._written: list[_Written[R]] = []  # in the file, waiting for a sync
        self._unsynced_bytes = 0  # written or being written, not yet synced
        self._appended = 0  # records appended so far
        self._done = 0  # records durable and forwarded so far
        self._writing: asyncio.Future[None] | None = None  # a worker thread's write
        self._changed = asyncio.Event()  # a write or a sync ended, or something failed
        self._to_sync = asyncio.Event()  # for the sync stage: records were written
        self._error: BaseException | None = None
        self._task = asyncio.create_task(self._sync_loop())

    @property
    def ready(self) -> bool:
        """:meth:`append` may be called: no write is in flight and there is room."""
        return self._writing is None and self._unsynced_bytes < self._max_unsynced

    @property
    def idle(self) -> bool:
        """Nothing in flight (every record appended is durable and forwarded) and nothing
        failed: a record appended ``alone`` now takes the latency path."""
        return self._done == self._appended and self._error is None

    async def wait_ready(self) -> None:
        """Wait until :attr:`ready`; raise what failed meanwhile, if anything did."""
        while self._error is None and not self.ready:
            writing = self._writing
            if writing is None:  # room: the sync stage is behind
                self._changed.clear()
                await self._changed.wait()
                continue
            # The write itself is awaited: this resumes in the loop turn that ends it
            # (after _wrote), a turn sooner than through _changed. What it raised is kept
            # by _wrote, and raised below.
            with contextlib.suppress(Exception):
                await writing
        self.check()

    def append(
        self,
        writer: LogWriter,
        disk_parts: list[wire.Payload],
        wire_record: R,
        on_durable: Callable[[], None] | None = None,
        *,
        size: int | None = None,
        alone: bool = False,
    ) -> None:
        """Append one record (its disk form); forward ``wire_record`` once it is durable.

        ``on_durable`` runs once the record is durable, before it is forwarded: it tells
        the senders, and durability, not delivery, is what that promises. ``size``: the
        disk form's length, if the caller knows it.

        With ``alone`` (no more input is waiting), nothing in flight (:attr:`idle`) and a
        record of at most :data:`INLINE_MAX_BYTES`, there is nothing to overlap: the
        record is written, synced, ``on_durable`` run and the record forwarded before
        this returns, on the event loop — the latency path, with no hop through worker
        threads, which cost more than the fsync itself; input arriving meanwhile is read
        after it. A failure there is raised, and kept: every later call raises it too.
        Otherwise the record is written by a worker thread, and :attr:`ready` is False
        until that write ended.
        """
        self.check()
        if not self.ready:
            raise RuntimeError("a record appended while the pipeline is not ready")
        if size is None:
            size = sum(map(len, disk_parts))
        inline = alone and size <= INLINE_MAX_BYTES and self._done == self._appended
        self._appended += 1
        if inline:
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
            return
        # Only one write at a time, so the file sees records in order.
        self._unsynced_bytes += size
        writing = asyncio.get_running_loop().run_in_executor(None, writer.write, disk_parts)
        self._writing = writing
        writing.add_done_callback(
            functools.partial(self._wrote, (writer, wire_record, size, on_durable))
        )

    def _wrote(self, written: _Written[R], writing: asyncio.Future[None]) -> None:
        self._writing = None
        exc = writing.exception() if not writing.cancelled() else asyncio.CancelledError()
        if exc is not None:
            self._error = self._error or exc
        else:
            self._written.append(written)
            self._to_sync.set()
        self._changed.set()

    async def flush(self) -> None:
        """Wait until every record appended so far is durable and forwarded."""
        target = self._appended
        await self._until(lambda: self._error is not None or self._done >= target)
        self.check()

    async def close(self) -> None:
        """Stop the sync stage (after :meth:`flush` when nothing went wrong), once a write
        in flight has ended: the log is closed after this."""
        if self._writing is not None:
            await asyncio.gather(self._writing, return_exceptions=True)
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    def check(self) -> None:
        """Raise what failed, if a record's write, sync or forwarding did."""
        if self._error is not None:
            raise self._error

    async def _until(self, done: Callable[[], bool]) -> None:
        while not done():
            self._changed.clear()
            await self._changed.wait()

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
                self._unsynced_bytes -= sum(size for _, _, size, _ in batch)
                self._done += len(batch)
                self._changed.set()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # a failed sync or a lost binding: stop everything
            self._error = exc
            self._changed.set()
