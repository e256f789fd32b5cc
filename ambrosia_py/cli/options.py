"""What several commands share: ``--data-dir``, ``--registry`` and ``--cluster``, and how
they show a value that may be absent.

``--data-dir`` has one default and one environment variable everywhere
(``hashseed.py`` holds them: its early step reads the option before click does); the
checks on the directory itself are the coordinator's (``coordinator/storage/data_dir.py``).
``--registry`` and ``--cluster`` say which registry every command that reads one uses
(``coordinator/registry/backends.py`` reads the spec).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..coordinator.registry.interface import DEFAULT_CLUSTER
from ..hashseed import DATA_DIR_ENV, DEFAULT_DATA_DIR

__all__ = [
    "CLUSTER_ENV",
    "REGISTRY_ENV",
    "coordinators_data_dir",
    "data_dir_option",
    "data_dir_origin",
    "or_dash",
    "registry_options",
]

REGISTRY_ENV = "AMBROSIA_REGISTRY"
CLUSTER_ENV = "AMBROSIA_CLUSTER"

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


def registry_options(f: F) -> F:
    """``--registry SPEC`` and ``--cluster NAME``, with their environment variables."""
    f = click.option(
        "--cluster",
        default=DEFAULT_CLUSTER,
        envvar=CLUSTER_ENV,
        show_default=True,
        show_envvar=True,
        help="The cluster in an etcd registry (its keys are under /CLUSTER/): instances "
        "find each other by name within it.",
    )(f)
    return click.option(
        "--registry",
        metavar="SPEC",
        envvar=REGISTRY_ENV,
        show_envvar=True,
        help="Where instances are registered and find each other by name: a SQLite file "
        "shared by data dirs on one machine, or etcd://HOST[:PORT][,...] (etcds:// for "
        "TLS) for many machines (docs/operations.md). Default: DATA_DIR/registry.sqlite3.",
    )(f)


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
