"""How ``ambrosia-py run`` ends: its exit statuses, and ``--verbose``.

A service author meets its errors at a terminal, so each is one line that names the
file, attribute, path or process involved and what to do; the traceback behind it is
for ``--verbose`` (or ``AMBROSIA_VERBOSE=1``): :mod:`ambrosia_py.oneline`. The statuses
are documented in ``docs/operations.md``; scripts and supervisors may rely on them.
"""

from __future__ import annotations

import enum
import signal
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..oneline import VERBOSE_ENV, set_verbose

__all__ = [
    "ExitStatus",
    "coordinator_ended",
    "verbose_option",
]

_F = TypeVar("_F", bound=Callable[..., Any])


class ExitStatus(enum.IntEnum):
    """``ambrosia-py run``'s exit statuses."""

    OK = 0  # stopped: Ctrl-C, SIGTERM, or the coordinator stopped cleanly
    ERROR = 1  # an error it explained in one line (a bad service file, an unusable data dir)
    USAGE = 2  # a wrong command line, or the coordinator refused to start (it said why)
    BACKGROUND_TASK_FAILED = 3  # a @background task raised (run --background-failure stop)
    COORDINATOR_DIED = 4  # the coordinator was killed or failed; running again recovers
    SERVICE_FAILED = 5  # the binding could not go on (a state that cannot be pickled, ...)


def verbose_option(command: _F) -> _F:
    """``--verbose`` for a command whose errors are
    :class:`~ambrosia_py.oneline.OneLineError`: every command that loads a service file
    (``run``, ``replay``, ``debug``, ``log show --service``), since each such error says
    "--verbose shows the traceback". Eager, so it is set before the options that load the
    service file are read."""
    return click.option(
        "--verbose",
        is_flag=True,
        envvar=VERBOSE_ENV,
        expose_value=False,
        is_eager=True,
        callback=lambda _ctx, _param, on: set_verbose(bool(on)),
        help=f"Show the traceback behind an error, not just its one line [env {VERBOSE_ENV}].",
    )(command)


def coordinator_ended(pid: int, status: int) -> str:
    """What a coordinator's exit status says happened to it, for a service author."""
    if status < 0:
        try:
            name = signal.Signals(-status).name
        except ValueError:
            name = f"signal {-status}"
        return (
            f"the coordinator (pid {pid}) was killed by {name}; "
            "run the same command again to recover"
        )
    if status == 2:  # ambrosia-py coordinator's refusals: said in one line, with a fix
        return (
            f"the coordinator (pid {pid}) refused to go on (exit status 2): its "
            "'ambrosia-py:' line above says why and what to do"
        )
    return (
        f"the coordinator (pid {pid}) exited with status {status} (its log above says why); "
        "run the same command again to recover"
    )
