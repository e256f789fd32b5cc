"""``ambrosia-py``: the command line. Each package contributes its own commands."""

from __future__ import annotations

import importlib

import click

from .binding.hashseed import as_program
from .binding.run_cli import replay, run
from .coordinator.admin_cli import instances, log, register, registry
from .coordinator.ic_cli import coordinator, debug

# Commands imported only when used: every coordinator and service process starts this
# program, and these bring in rich, pyarrow-side and benchmark modules (about 0.2 s).
_LAZY = {
    "analyze": "ambrosia_py.spark.analyze:analyze",
    "bench": "ambrosia_py.bench:bench",
    "demo": "ambrosia_py.demo:demo",
}


class _Commands(click.Group):
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


main.add_command(register)
main.add_command(instances)
main.add_command(registry)
main.add_command(log)
main.add_command(coordinator)
main.add_command(debug)
main.add_command(run)
main.add_command(replay)


def program() -> None:
    """The ``ambrosia-py`` program (not an in-process call of :func:`main`): it may
    execute itself again, under an instance's hash seed (``binding/hashseed.py``)."""
    as_program()
    main()


if __name__ == "__main__":  # pragma: no cover
    program()
