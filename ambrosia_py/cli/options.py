"""What several commands share: ``--data-dir``, and how they show a value that may be absent.

``--data-dir`` has one default and one environment variable everywhere
(``hashseed.py`` holds them: its early step reads the option before click does); the
checks on the directory itself are the coordinator's (``coordinator/storage/data_dir.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..hashseed import DATA_DIR_ENV, DEFAULT_DATA_DIR

__all__ = ["coordinators_data_dir", "data_dir_option", "data_dir_origin", "or_dash"]

F = TypeVar("F", bound=Callable[..., Any])


def data_dir_option(help: str) -> Callable[[F], F]:
    """``--data-dir`` with the shared default and environment variable, shown in --help."""
    return click.option(
        "--data-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=DEFAULT_DATA_DIR,
        envvar=DATA_DIR_ENV,
        show_default=True,
        show_envvar=True,
        help=help + " Relative paths are from the current directory.",
    )


# The commands that work on the files coordinators leave (``register``, ``instances``,
# ``registry``, ``log prune``).
coordinators_data_dir = data_dir_option(
    "The coordinators' data directory (registry and instance directories)."
)


def data_dir_origin(ctx: click.Context) -> str:
    """Where the command's ``--data-dir`` came from, for the start-up line."""
    source = ctx.get_parameter_source("data_dir")
    if source is click.core.ParameterSource.ENVIRONMENT:
        return f"from ${DATA_DIR_ENV}"
    if source is click.core.ParameterSource.COMMANDLINE:
        return "from --data-dir"
    return f"the default; --data-dir or ${DATA_DIR_ENV} to change"


def or_dash(value: int | None) -> str:
    """A number that may be absent (no checkpoint yet, no log), as tables and lines show it."""
    return "-" if value is None else str(value)
