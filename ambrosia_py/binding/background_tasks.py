"""Running an immortal's ``@background`` tasks, and what happens when one fails.

Background tasks are the service's edge to the outside world (a TCP front end, a feed),
so one that dies silently leaves a service that looks alive and takes no input. A task
that raises is therefore always logged, with its name and traceback, and then, by the
policy ``ambrosia-py run --background-failure`` chooses:

* ``stop`` (the default): the service stops, its coordinator makes what it holds durable
  and exits, and ``run`` exits with status 3
  (:data:`~ambrosia_py.cli.exits.ExitStatus.BACKGROUND_TASK_FAILED`). Running the same
  command again recovers and starts the task anew.
* ``restart``: the task is started again after a delay that doubles with each failure in
  a row (:class:`Backoff`), and the rest of the service runs on meanwhile.

A task marked ``@background(on_failure=...)`` follows its own policy instead.

A task that returns is logged and not started again: returning is how a task says it is
done. Cancelling (the service stopping) is not a failure.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from typing import Any

import attrs

from .errors import BindingError
from .immortal import Immortal, background_policy

__all__ = ["Backoff", "BackgroundFailure", "BackgroundTaskError", "BackgroundTasks"]

log = logging.getLogger("ambrosia_py.binding")


class BackgroundFailure(enum.Enum):
    """What a failing background task does to the service."""

    STOP = "stop"
    RESTART = "restart"


class BackgroundTaskError(BindingError):
    """A ``@background`` task raised and the policy is to stop the service."""

    def __init__(self, task: str, cause: BaseException) -> None:
        super().__init__(
            f"background task {task!r} failed: {type(cause).__name__}: {cause} "
            "(its traceback is logged above); the service stopped. Fix the task and run the "
            "same command again: the service recovers from its log"
        )
        self.task = task
        self.cause = cause


@attrs.frozen
class Backoff:
    """Restart delays: ``first`` seconds, doubling with each failure in a row, at most
    ``most``. A task that ran ``settled`` seconds or more before failing starts over at
    ``first``: it had been working, so this failure is not part of a streak."""

    first: float = 0.1
    most: float = 30.0
    settled: float = 60.0

    def delay(self, failures_in_a_row: int) -> float:
        return float(min(self.most, self.first * 2 ** max(0, failures_in_a_row - 1)))


class BackgroundTasks:
    """The running background tasks of one immortal.

    ``immortal`` returns the immortal as it is now (an upgrade replaces it), so a
    restarted task runs the current code. ``stop`` is called once, with the error, when a
    task fails and the policy is :attr:`BackgroundFailure.STOP`.
    """

    def __init__(
        self,
        immortal: Callable[[], Immortal],
        policy: BackgroundFailure,
        stop: Callable[[BackgroundTaskError], None],
        backoff: Backoff = Backoff(),
    ) -> None:
        self._immortal = immortal
        self._policy = policy
        self._stop = stop
        self._backoff = backoff
        self._tasks: dict[str, asyncio.Task[Any]] = {}
        self._failures: dict[str, int] = {}  # failures in a row, by task
        self._started_at: dict[str, float] = {}
        self._closed = False

    @property
    def started(self) -> bool:
        return bool(self._started_at)

    def start(self) -> None:
        """Start every background method of the immortal (once: later calls do nothing)."""
        if self.started:
            return
        for name in type(self._immortal()).background_methods():
            self._start(name)

    def _start(self, name: str) -> None:
        if self._closed:
            return
        coro = getattr(self._immortal(), name)()
        task = asyncio.ensure_future(coro)
        task.set_name(f"background {name}")
        self._tasks[name] = task
        self._started_at[name] = asyncio.get_running_loop().time()
        task.add_done_callback(lambda t: self._done(name, t))
        log.info("background task %s started", name)

    def _done(self, name: str, task: asyncio.Task[Any]) -> None:
        if task.cancelled() or self._closed:
            return
        exc = task.exception()
        if exc is None:
            log.info("background task %s finished", name)
            return
        log.error("background task %s failed", name, exc_info=exc)
        own = background_policy(getattr(type(self._immortal()), name))
        if (BackgroundFailure(own) if own else self._policy) is BackgroundFailure.STOP:
            self._stop(BackgroundTaskError(name, exc))
            return
        ran = asyncio.get_running_loop().time() - self._started_at[name]
        failures = 1 if ran >= self._backoff.settled else self._failures.get(name, 0) + 1
        self._failures[name] = failures
        delay = self._backoff.delay(failures)
        log.warning(
            "background task %s failed %d time%s in a row; restarting it in %.1f s",
            name,
            failures,
            "s" * (failures != 1),
            delay,
        )
        asyncio.get_running_loop().call_later(delay, self._start, name)

    def cancel(self) -> None:
        """Cancel every task (the service is stopping); nothing restarts after this."""
        self._closed = True
        for task in self._tasks.values():
            task.cancel()
