"""Recording written checkpoints in the registry, through the registry's outages.

Recovery starts from the checkpoint the registry last recorded, so a checkpoint counts
once it is recorded there, after its file is written (atomically and durably). Until
then, the checkpoint recorded before it stays a valid place to start from: recovery from
checkpoint K replays logs K, K+1, ..., every one of which is still there (the
coordinator removes no log, and ``log prune`` keeps every log from the registry's
checkpoint on, whatever newer checkpoint files say).

So a registry that cannot be reached (etcd down, or this machine cut off from it) never
stops a coordinator that can serve: :class:`CheckpointRecorder` records each written
checkpoint from a background task, off the commit loop, and while the registry is
unreachable it tries again, waiting longer each time (up to :data:`RETRY_MAX_S`). Newest
wins: checkpoint numbers only grow, so recording N makes every older one moot, and a
checkpoint written while another waits replaces it. A recorded checkpoint is said once in
the log, as before; an outage is said once by the registry's client, when it begins and
when it ends.

Two cases wait for the record instead: checkpoint 1 of a version (a first start, an
upgrade) has no earlier checkpoint of its version to recover from, so nothing goes on
until it is recorded. And a refusal (an answer that is not an outage: say, another
coordinator of the instance recorded a newer checkpoint) is a failure the commit loop
raises, as it did when it recorded checkpoints itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ..registry.interface import InstanceRegistry, RegistryUnavailable

__all__ = ["RETRY_MAX_S", "RETRY_MIN_S", "CheckpointRecorder"]

log = logging.getLogger("ambrosia_py.coordinator")

RETRY_MIN_S = 0.1  # the first wait before a record is tried again
RETRY_MAX_S = 2.0  # the longest


class CheckpointRecorder:
    """The checkpoints of one instance, recorded in ``registry`` in the background.

    ``on_failure`` is called (on the event loop) when the registry refuses a record;
    :meth:`check` then raises the refusal.
    """

    def __init__(
        self, registry: InstanceRegistry, instance: str, on_failure: Callable[[], None]
    ) -> None:
        self.registry = registry
        self.instance = instance
        self._on_failure = on_failure
        self._pending: tuple[int, int, str] | None = None  # version, checkpoint, details
        self._task: asyncio.Task[None] | None = None
        self._nudge = asyncio.Event()  # ends a wait between tries (closing)
        self._closing = False
        self._failure: Exception | None = None
        self.recorded: tuple[int, int] | None = None  # the last recorded by this process

    def check(self) -> None:
        """Raise the registry's refusal of a record, if it refused one."""
        if self._failure is not None:
            raise self._failure

    async def record(self, version: int, checkpoint: int, details: str = "") -> None:
        """Record ``checkpoint`` of ``version`` (its file is written). Returns at once,
        except for checkpoint 1, which it waits for (and raises a refusal of)."""
        self.check()
        self._pending = (version, checkpoint, details)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="checkpoint records")
        if checkpoint == 1:
            await asyncio.shield(self._task)
            self.check()

    async def close(self) -> None:
        """Wait for the record in progress (one more try if the registry was unreachable);
        say which checkpoint stays unrecorded if the registry still cannot be reached."""
        self._closing = True
        self._nudge.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._pending is not None and self._failure is None:
            log.warning(
                "checkpoint %d is not recorded in the registry (%s is unreachable): the next "
                "start recovers from the one recorded before it, and replays the logs since",
                self._pending[1],
                self.registry.where,
            )

    async def _run(self) -> None:
        delay = RETRY_MIN_S
        while self._pending is not None:
            version, checkpoint, details = self._pending
            try:
                await asyncio.to_thread(
                    self.registry.commit_checkpoint, self.instance, version, checkpoint, checkpoint
                )
            except RegistryUnavailable:
                # Said once by the registry's client; the older checkpoint stays valid.
                if self._closing:
                    return
                self._nudge.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._nudge.wait()
                delay = min(delay * 2, RETRY_MAX_S)
                continue
            except Exception as exc:  # a refusal (RegistryError), or the store failing
                log.error("the registry refused checkpoint %d: %s", checkpoint, exc)
                self._failure = exc
                self._on_failure()
                return
            if self._pending == (version, checkpoint, details):
                self._pending = None
            self.recorded = (version, checkpoint)
            delay = RETRY_MIN_S
            log.info("checkpoint %d committed%s", checkpoint, details)
