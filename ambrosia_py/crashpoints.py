"""Crash points: named places where a test makes this process SIGKILL itself.

Durability is decided at a few moments: a record written, then synced, then forwarded
and acknowledged; a checkpoint written, then committed; a log file created, then
registered; bytes half sent on a socket. A kill from outside lands between them only by
luck (a sleep, a progress count); a crash point lands exactly there, every run, in the
manner of FoundationDB's simulation faults. ``tests/test_crash_points.py`` walks every
point of :data:`POINTS` and checks exactly-once effects after recovery;
``docs/operations.md`` (*Crash points*) lists them.

Arming, by environment, read once when this module is imported:

* ``AMBROSIA_CRASH_AT=NAME[:N]``: the N-th time (1 by default) this process reaches point
  NAME, it SIGKILLs itself there. Points name the process they live in (``ic.*`` the
  coordinator, ``binding.*`` the service process), so the variable can be given to
  ``ambrosia-py run``, whose coordinator inherits it. An unknown name stops the process
  at import, naming the points: a typo must not silently arm nothing.
* ``AMBROSIA_CRASH_MARKER=PATH``: where a line saying which point killed which pid is
  appended just before the kill (it also goes to stderr), so a test can tell the crash
  it asked for from any other death.

Off (the production case) a point costs one call and one comparison. A hook is one line
at the place it names: :func:`reach`, or :func:`reach_midway` where the point is halfway
through a write, which writes the first half of the bytes before the kill.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Final

__all__ = [
    "ENV",
    "MARKER_ENV",
    "POINTS",
    "CrashPointError",
    "armed",
    "reach",
    "reach_midway",
]

ENV: Final = "AMBROSIA_CRASH_AT"
MARKER_ENV: Final = "AMBROSIA_CRASH_MARKER"
MARKER_TEXT: Final = "ambrosia crash point"

# name -> what a crash there proves recovery copes with. One place for the names: the
# hooks, the test that walks them and docs/operations.md all follow this table.
POINTS: Final[Mapping[str, str]] = MappingProxyType(
    {
        "ic.log.before_write": "a record taken from pending input but not written is not "
        "lost: its senders were not told, so they send it again",
        "ic.log.mid_write": "half a record on disk is cut as a torn tail, never replayed",
        "ic.log.before_sync": "a record written but not synced may vanish: nobody was told of it",
        "ic.log.after_sync": "a durable record forwarded to nobody and acknowledged to no "
        "sender is replayed once, and its senders' resends are dropped as duplicates",
        "ic.log.roll": "a new log file created but not yet registered by a checkpoint is "
        "replayed from the previous checkpoint",
        "ic.checkpoint.mid_write": "a half-written checkpoint is never read: recovery uses "
        "the last committed one",
        "ic.checkpoint.before_commit": "a checkpoint written but not committed in the "
        "registry is ignored: recovery replays from the one before",
        "ic.replica.checkpoint.before_commit": "a secondary's own checkpoint written but "
        "not committed in its state file is ignored: it restarts from the one before",
        "ic.replica.checkpoint.before_ship": "a checkpoint a secondary took for the "
        "primary's roll, not yet sent back: the primary asks again at its next roll",
        "ic.forward.mid_send": "half a record sent to the binding is never applied",
        "ic.link.mid_send": "half a frame sent to a peer coordinator is dropped; the link "
        "resends from where the receiver asks",
        "binding.checkpoint": "a checkpoint taken but not handed to the coordinator leaves "
        "the previous one in force",
        "binding.before_effects": "a call handled, its outputs sent, its effects (the "
        "ingress's answer) not run: replay suppresses the effects, the retry gets the "
        "stored outcome",
        "binding.mid_send": "half of a binding's outgoing calls sent: the coordinator logs "
        "none of the partial message, and replay sends them again",
    }
)


class CrashPointError(ValueError):
    """``AMBROSIA_CRASH_AT`` names no point or no valid count."""


class _Armed:
    """The one point armed in this process, and how often it was reached so far."""

    __slots__ = ("at", "lock", "marker", "name", "reached")

    def __init__(self, name: str, at: int, marker: str | None) -> None:
        self.name = name
        self.at = at
        self.marker = marker
        self.reached = 0
        self.lock = threading.Lock()  # points are reached from worker threads too


def _parse(spec: str | None, marker: str | None) -> _Armed | None:
    if not spec:
        return None
    name, sep, count = spec.partition(":")
    if name not in POINTS:
        raise CrashPointError(
            f"{ENV}={spec!r}: there is no crash point {name!r}; the points are " + ", ".join(POINTS)
        )
    try:
        at = int(count) if sep else 1
    except ValueError:
        at = 0
    if at < 1:
        raise CrashPointError(f"{ENV}={spec!r}: the count after ':' must be 1 or more")
    return _Armed(name, at, marker or None)


_armed: _Armed | None = _parse(os.environ.get(ENV), os.environ.get(MARKER_ENV))


def armed() -> str | None:
    """The name of the point armed in this process, if any."""
    return None if _armed is None else _armed.name


def reach(name: str) -> None:
    """This process is at point ``name``: SIGKILL it if that is the armed point's turn."""
    if _armed is not None and _armed.name == name:
        _arrive(_armed)


# A file at an offset (a file descriptor and where the write goes), a socket, a transport.
Target = tuple[int, int] | socket.socket | asyncio.WriteTransport


def reach_midway(
    name: str, target: Target, parts: Sequence[bytes | bytearray | memoryview]
) -> None:
    """At point ``name``, halfway through writing ``parts`` to ``target``: if it is the
    armed point's turn, write the first half of the bytes, then SIGKILL."""
    if _armed is not None and _armed.name == name:
        _arrive(_armed, lambda: _write(target, _half(parts)))


def _write(target: Target, data: bytes) -> None:
    if isinstance(target, tuple):
        os.pwrite(target[0], data, target[1])
    elif isinstance(target, socket.socket):
        target.sendall(data)
    else:  # a transport sends at once what the socket takes when nothing is queued before it
        target.write(data)


def _half(parts: Sequence[bytes | bytearray | memoryview]) -> bytes:
    data = b"".join(parts)
    return data[: max(1, len(data) // 2)]


def _arrive(point: _Armed, before: Callable[[], object] | None = None) -> None:
    with point.lock:
        point.reached += 1
        if point.reached != point.at:
            return
        if before is not None:
            before()
        line = (
            f"{MARKER_TEXT} {point.name} reached (time {point.reached}) "
            f"in pid {os.getpid()}: SIGKILL\n"
        ).encode()
        if point.marker is not None:
            fd = os.open(point.marker, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        os.write(2, line)  # unbuffered: nothing of it may wait in a Python buffer
        os.kill(os.getpid(), signal.SIGKILL)
