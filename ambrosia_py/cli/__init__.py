"""``ambrosia-py``: the command line. Every command is a module of this package, named
after it (``run.py``, ``coordinator.py``, ...), except ``bench`` and ``demo``, which are
packages of their own; the commands are the only modules that import across the layers,
and nothing below imports them.

Every service (``run``) and coordinator process starts this program, and a restarted
``run`` may execute itself again under the instance's hash seed (``hashseed.py``).
So this module imports nothing at the top but what that early step needs: the commands,
and click, only once the group is built (:data:`main`, on first use), and each command's
module only when that command is used. ``python -m ambrosia_py.cli`` runs it too
(``__main__.py``).
"""

from __future__ import annotations

import importlib
import sys
from functools import cache
from typing import TYPE_CHECKING, Any

from .. import hashseed

if TYPE_CHECKING:
    import click

__all__ = ["main", "program"]

# Every command, imported when used: ``run``'s module brings in the whole binding, and
# ``analyze``, ``bench`` and ``demo`` rich, pyarrow-side and benchmark modules.
_LAZY = {
    "analyze": "ambrosia_py.cli.analyze:analyze",
    "bench": "ambrosia_py.bench:bench",
    "coordinator": "ambrosia_py.cli.coordinator:coordinator",
    "debug": "ambrosia_py.cli.debug:debug",
    "demo": "ambrosia_py.demo:demo",
    "group": "ambrosia_py.cli.group:group",
    "instances": "ambrosia_py.cli.instances:instances",
    "log": "ambrosia_py.cli.log:log",
    "register": "ambrosia_py.cli.register:register",
    "registry": "ambrosia_py.cli.registry:registry",
    "replay": "ambrosia_py.cli.replay:replay",
    "run": "ambrosia_py.cli.run:run",
}

main: click.Group  # built on first use: module __getattr__ below


@cache
def _main() -> click.Group:
    import click

    from ..helpformat import Group

    class _Commands(Group):
        """A group whose :data:`_LAZY` commands are imported on first use."""

        def list_commands(self, ctx: click.Context) -> list[str]:
            return sorted([*super().list_commands(ctx), *_LAZY])

        def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
            where = _LAZY.get(cmd_name)
            if where is None:
                return super().get_command(ctx, cmd_name)
            module, name = where.split(":")
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


def program() -> None:
    """The ``ambrosia-py`` program (not an in-process call of :func:`main`): it may
    execute itself again, under an instance's hash seed (``hashseed.py``)."""
    hashseed.as_program()
    hashseed.switch_early(sys.argv[1:])
    _main()()
