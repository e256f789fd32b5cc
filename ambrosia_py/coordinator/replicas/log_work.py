"""A replica's log worked on beside the event loop: fdatasyncs in a worker thread (the
steps that close or remove log files wait for one in flight to end), the reads that
feed a secondary behind from the primary's log, and a secondary's rolls of its log for
checkpoints of its own and their commits (the follower, ``follow.py``, takes them).

:class:`LogWork` is a part of :class:`~.node.ReplicaNode`, apart by concern.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine

from ..replication import Event, Primary, Secondary, Timing
from ..storage.errors import StorageError
from .disk import ReplicaDisk
from .follow import Follower

__all__ = ["LogWork"]

log = logging.getLogger("ambrosia_py.coordinator")


class LogWork:
    """See the module; its state is the node's."""

    disk: ReplicaDisk
    core: Primary | Secondary
    timing: Timing
    _syncing: bool
    _backlog: deque[Event]
    _deferred: deque[Callable[[], None]]
    _durable_moved: asyncio.Event
    replica: int
    follower: Follower | None
    trigger_bytes: int | None

    def _pump(self) -> None:
        """Carry out what the core asks (the node's)."""
        raise NotImplementedError

    def _do(self, event: Event) -> None:
        """Carry out one event (the node's)."""
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        """The replicated log failed (the node's)."""
        raise NotImplementedError

    def _later(self, work: Coroutine[object, object, None]) -> None:
        """Run ``work`` in the background (the node's)."""
        raise NotImplementedError

    def _drain_backlog(self) -> None:
        try:
            while self._backlog and not self._syncing:
                self._do(self._backlog.popleft())
            while self._deferred and not self._syncing:
                self._deferred.popleft()()
        except Exception as exc:
            self._fail(exc)

    def _when_not_syncing(self, step: Callable[[], None]) -> None:
        """Run ``step`` (it closes or removes log files) now, or once the sync in
        flight ends."""
        if self._syncing or self._deferred:
            self._deferred.append(step)
        else:
            step()

    def _sync_soon(self) -> None:
        if not self._syncing:
            self._syncing = True
            self._later(self._sync())

    async def _sync(self) -> None:
        """fdatasync the log in a worker thread, again while records came in meanwhile
        (appends go on during a sync: :meth:`LogWriter.sync` runs without the write
        lock, and :meth:`ReplicaLog.sync` claims only the end it read as it began)."""
        try:
            while True:
                rlog = self.disk.log
                assert rlog is not None
                target = rlog.end
                end = await asyncio.to_thread(rlog.sync)
                core = self.core
                if isinstance(core, Secondary):
                    core.records_durable(end)
                    self._pump()  # the acknowledgement: out now, not after the next sync
                if self.disk.log is not rlog or rlog.end <= target:
                    break
        except Exception as exc:
            self._fail(exc)
        finally:
            self._syncing = False
        self._drain_backlog()
        self._pump()

    async def _read(self, replica: int, from_seq: int) -> None:
        core = self.core
        try:
            # The log holds a record of the commit path once it is durable (durable()).
            # Looked up each time: an upgrade moves it to the new version's files.
            while (rlog := self.disk.log) is not None and rlog.durable_end <= from_seq:
                if self.core is not core:
                    return
                self._durable_moved.clear()
                await self._durable_moved.wait()
            assert rlog is not None
            try:
                records = await asyncio.to_thread(rlog.read, from_seq, self.timing.max_append_bytes)
            except (StorageError, OSError):
                if self.disk.log is rlog:
                    raise
                records = []  # the log moved to an upgrade's files: from the checkpoint
            if self.core is core and isinstance(core, Primary):
                core.records_read(replica, from_seq, records, time.monotonic())
                self._pump()
        except Exception as exc:
            self._fail(exc)

    # --- a secondary's checkpoints of its own (follow.py) ---------------------------------

    def _roll_if_due(self) -> None:
        """Past the size trigger, roll the log to a new file at its end, where the
        follower takes a checkpoint."""
        follower, rlog, trigger = self.follower, self.disk.log, self.trigger_bytes
        if (
            follower is None
            or follower.planning
            or follower.state is None
            or rlog is None
            or trigger is None
            or rlog.log_size < trigger
            or self._deferred
        ):
            return

        def roll() -> None:
            rlog = self.disk.log
            if rlog is None or self.follower is not follower or follower.planning:
                return
            n, seq = rlog.log_number + 1, rlog.end
            rlog.roll(n)
            follower.checkpoint_at(n, seq)
            log.info("replica %d rolled to log %d at seq %d for a checkpoint", self.replica, n, seq)

        self._when_not_syncing(roll)

    def commit_checkpoint(self, n: int, seq: int) -> None:
        """Checkpoint ``n``, written by the follower, the state before ``seq``, is safe to
        recover from: commit it in the state file, then drop the files before it."""

        def commit() -> None:
            rlog = self.disk.log
            assert rlog is not None
            self.disk.save(checkpoint=n)
            rlog.drop_before(n)
            self.core.log_pruned(seq)

        self._when_not_syncing(commit)
