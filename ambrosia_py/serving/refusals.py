"""Refusal logs that a flood cannot turn into a flood of log lines.

A server logs why it refused or closed a connection, since that is how an operator
finds a misconfigured peer. A peer that reconnects as fast as it is refused would make
that log grow without bound, so each server logs refusals through one
:class:`RefusalLog`: per source address, the first ``first`` refusals of an interval in
full, then only a count, written as one summary line when the interval ends ("412
more refused from 127.0.0.1 in the last 10 s"). Sources past ``max_sources`` in one
interval share one count, so the table stays small however many addresses a flood uses.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import attrs

__all__ = ["RefusalLog"]

_OTHERS = "other sources"


@attrs.define
class _Count:
    logged: int = 0
    suppressed: int = 0
    level: int = logging.DEBUG  # the highest level among the suppressed lines


class RefusalLog:
    """The refusal lines of one server (see the module)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        first: int = 5,
        interval_s: float = 10.0,
        max_sources: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._log = logger
        self._what = what  # "refused", "ingress connections closed", ...
        self._first = first
        self._interval = interval_s
        self._max_sources = max_sources
        self._clock = clock
        self._counts: dict[str, _Count] = {}
        self._since: float | None = None  # when this interval began
        self._timer: asyncio.TimerHandle | None = None

    def __call__(
        self, source: str, message: str, *args: object, level: int = logging.WARNING
    ) -> None:
        """Log one refusal of a connection from ``source`` (``message % args``), or count
        it for the interval's summary."""
        now = self._clock()
        if self._since is not None and now - self._since >= self._interval:
            self.flush()
        if self._since is None:
            self._since = now
            self._arm()
        key = source
        if key not in self._counts and len(self._counts) >= self._max_sources:
            key = _OTHERS
        count = self._counts.setdefault(key, _Count())
        if count.logged < self._first:
            count.logged += 1
            self._log.log(level, message, *args)
        else:
            count.suppressed += 1
            count.level = max(count.level, level)

    def flush(self) -> None:
        """End the interval: one summary line per source whose refusals were counted."""
        if self._since is None:
            return
        span = max(self._clock() - self._since, 0.0)
        for source, count in self._counts.items():
            if count.suppressed:
                self._log.log(
                    count.level,
                    "%d more %s from %s in the last %.3g s",
                    count.suppressed,
                    self._what,
                    source,
                    span,
                )
        self._counts.clear()
        self._since = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self) -> None:
        """Write the summary when the interval ends even if no refusal comes after it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: the next refusal, or flush(), writes it
            return
        self._timer = loop.call_later(self._interval, self.flush)
