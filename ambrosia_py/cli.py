"""``ambrosia-py``: the command line. Each package contributes its own commands.

Every service (``run``) and coordinator process starts this program, and a restarted
``run`` may execute itself again under the instance's hash seed (``binding/hashseed.py``).
So this module imports nothing at the top but what that early step needs: the commands,
and click, only once the group is built (:data:`main`, on first use), and each command's
module only when that command is used.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click

__all__ = ["main", "program"]

# Every command, imported when used: ``run``'s module brings in the whole binding, and
# ``analyze``, ``bench`` and ``demo`` rich, pyarrow-side and benchmark modules.
_LAZY = {
    "analyze": "ambrosia_py.spark.analyze:analyze",
    "bench": "ambrosia_py.bench:bench",
    "coordinator": "ambrosia_py.coordinator.ic_cli:coordinator",
    "debug": "ambrosia_py.coordinator.ic_cli:debug",
    "demo": "ambrosia_py.demo:demo",
    "instances": "ambrosia_py.coordinator.admin_cli:instances",
    "log": "ambrosia_py.coordinator.admin_cli:log",
    "register": "ambrosia_py.coordinator.admin_cli:register",
    "registry": "ambrosia_py.coordinator.admin_cli:registry",
    "replay": "ambrosia_py.binding.run_cli:replay",
    "run": "ambrosia_py.binding.run_cli:run",
}

# The commands that run an instance's handlers, under its hash seed.
_SEEDED = frozenset({"run", "replay", "debug"})
# ``--data-dir``'s variable and default (coordinator/data_dir.py's, which this module does
# not import: it brings in the coordinator and the binding).
_DATA_DIR_ENV = "AMBROSIA_DATA_DIR"
_DEFAULT_DATA_DIR = "ambrosia-data"

main: click.Group  # built on first use: module __getattr__ below


@cache
def _main() -> click.Group:
    import click

    class _Commands(click.Group):
        """A group whose :data:`_LAZY` commands are imported on first use."""

        def list_commands(self, ctx: click.Context) -> list[str]:
            return sorted([*super().list_commands(ctx), *_LAZY])

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            where = _LAZY.get(cmd_name)
            if where is None:
                return super().get_command(ctx, cmd_name)
            module, name = where.split(":")
            # The binding first, as importing the package used to: coordinator/ic_cli.py
            # imports it, and its package imports run_cli.py, which imports ic_cli.py.
            importlib.import_module("ambrosia_py.binding")
            command: click.Command = getattr(importlib.import_module(module), name)
            return command

    @click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(package_name="ambrosia-py")
    def main() -> None:
        """AMBROSIA-style virtual resiliency for Python."""

    return main


def __getattr__(name: str) -> Any:
    if name == "main":
        return _main()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _hashseed() -> ModuleType:
    """``binding/hashseed.py``, without importing its package (``binding/__init__.py``
    imports all of the binding: the time the early step saves). It is entered under its
    own name, so the commands' imports of it find this module, and its one
    :func:`~ambrosia_py.binding.hashseed.as_program` flag."""
    name = "ambrosia_py.binding.hashseed"
    module = sys.modules.get(name)
    if module is not None:
        return module
    path = Path(__file__).parent / "binding" / "hashseed.py"
    spec = importlib.util.spec_from_file_location(name, path)
    if not path.is_file() or spec is None or spec.loader is None:  # not installed as files
        return importlib.import_module(name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _seeded_instance(args: list[str]) -> tuple[Path, str] | None:
    """The data dir and instance of a ``run``, ``replay`` or ``debug`` command line that
    names its instance (``run`` without ``--instance`` takes its class's name: only the
    command knows it). None when unsure: the command decides anyway."""
    if not args or args[0] not in _SEEDED:
        return None
    found: dict[str, str] = {}
    rest = iter(args[1:])
    for arg in rest:
        if arg == "--":
            break
        if arg in ("-h", "--help"):
            return None
        option, equals, value = arg.partition("=")
        if option not in ("--instance", "--data-dir"):
            continue
        if not equals:
            following = next(rest, None)
            if following is None:
                return None
            value = following
        found[option] = value  # the last one counts, as for click
    instance = found.get("--instance")
    data_dir = found.get("--data-dir") or os.environ.get(_DATA_DIR_ENV) or _DEFAULT_DATA_DIR
    if not instance or ("--data-dir" in found and not found["--data-dir"]):
        return None
    return Path(data_dir), instance


def _seed_early(hashseed: ModuleType, args: list[str]) -> None:
    """Execute the program again under the instance's hash seed now, with little imported
    and no service file loaded yet, if its command line names the instance and a seed
    file is there. Never makes the seed file (``run`` checks its command line first), and
    leaves a seed file it cannot read to the command, which says what is wrong."""
    where = _seeded_instance(args)
    if where is None:
        return
    try:
        seed = hashseed.instance_seed(*where, create=False)
    except (OSError, ValueError):
        return
    hashseed.run_under_seed(seed)


def program() -> None:
    """The ``ambrosia-py`` program (not an in-process call of :func:`main`): it may
    execute itself again, under an instance's hash seed (``binding/hashseed.py``)."""
    hashseed = _hashseed()
    hashseed.as_program()
    if not hashseed.executed_again():
        _seed_early(hashseed, sys.argv[1:])
    _main()()


if __name__ == "__main__":  # pragma: no cover
    program()
