"""Errors shown in one line, with the traceback behind them for ``--verbose`` (or
``AMBROSIA_VERBOSE=1``; why: ``cli/exits.py``).

The commands (``cli/``) raise them, and so does
:func:`~ambrosia_py.binding.load_service` for a service file that does not load, which
is why they live here, below both.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import IO, Any

import click

__all__ = ["VERBOSE_ENV", "OneLineError", "set_verbose", "verbose"]

VERBOSE_ENV = "AMBROSIA_VERBOSE"

_verbose = [False]


def set_verbose(on: bool) -> None:
    """``--verbose`` (or ``$AMBROSIA_VERBOSE``): show the traceback behind each one-line
    error. Set by each command as it starts (commands may run in one process: tests)."""
    _verbose[0] = on or os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def verbose() -> bool:
    return _verbose[0]


class OneLineError(click.ClickException):
    """An error shown as one line; with ``--verbose``, after the traceback of its cause."""

    def __init__(
        self, message: str, cause: BaseException | None = None, status: int | None = None
    ) -> None:
        super().__init__(message)
        self.cause = cause
        if status is not None:  # else click's, 1 (``ExitStatus.ERROR``, ``cli/exits.py``)
            # click reads the status from the instance; it declares it a class variable.
            self.exit_code = int(status)  # type: ignore[misc]

    def format_message(self) -> str:
        if self.cause is not None and not verbose():
            return f"{self.message} (--verbose shows the traceback)"
        return self.message

    def show(self, file: IO[Any] | None = None) -> None:
        if self.cause is not None and verbose():
            traceback.print_exception(self.cause, file=file or sys.stderr)
        super().show(file)
