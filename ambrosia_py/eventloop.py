"""The event loop our processes run on: uvloop where it is installed, else asyncio's own.

A coordinator, a binding (``ambrosia-py run``, the test runner) and the benchmark's
skeletons all start their loops here, so they run on the same one. uvloop is a
dependency on the platforms it supports; on the others, or with ``AMBROSIA_LOOP=asyncio``,
asyncio's selector loop runs instead. Both are supported and tested: the protocol cores
are sans-IO and the adapters use only the loop's public API (transports, ``add_reader``,
``call_soon_threadsafe``). ``AMBROSIA_LOOP=uvloop`` makes a missing uvloop an error rather
than a fallback.

On an awaited call between two instances uvloop takes a good part of each coordinator's
CPU per round trip off (docs/performance.md, *What the design does for speed*).
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

__all__ = [
    "LOOP_ENV",
    "LOOPS",
    "loop_factory",
    "loop_name",
    "new_event_loop",
    "run",
    "running_loop_name",
]

LOOP_ENV = "AMBROSIA_LOOP"
LOOPS = ("uvloop", "asyncio")

T = TypeVar("T")


def loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop :func:`new_event_loop` makes here."""
    asked = os.environ.get(LOOP_ENV, "")
    if asked not in ("", *LOOPS):
        raise ValueError(f"{LOOP_ENV}={asked!r}: expected one of {', '.join(LOOPS)}")
    if asked == "asyncio":
        return "asyncio"
    try:
        importlib.import_module("uvloop")
    except ImportError as exc:
        if asked == "uvloop":
            raise ImportError(f"{LOOP_ENV}=uvloop, but uvloop is not installed ({exc})") from exc
        return "asyncio"
    return "uvloop"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop of the kind :func:`loop_name` names."""
    if loop_name() == "uvloop":
        factory: Callable[[], asyncio.AbstractEventLoop] = importlib.import_module(
            "uvloop"
        ).new_event_loop
        return factory
    return asyncio.SelectorEventLoop


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop, not set as the thread's current one."""
    return loop_factory()()


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on our loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop running this coroutine (for start-up logs)."""
    return type(asyncio.get_running_loop()).__module__.partition(".")[0]
