"""``ambrosia-py``: the command line. Each package contributes its own commands."""

from __future__ import annotations

import click

from .bench import bench
from .binding.hashseed import as_program
from .binding.run_cli import replay, run
from .coordinator.admin_cli import instances, log, register, registry
from .coordinator.ic_cli import coordinator, debug
from .demo import demo
from .spark.analyze import analyze


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="ambrosia-py")
def main() -> None:
    """AMBROSIA-style virtual resiliency for Python."""


main.add_command(bench)
main.add_command(register)
main.add_command(instances)
main.add_command(registry)
main.add_command(log)
main.add_command(coordinator)
main.add_command(debug)
main.add_command(run)
main.add_command(replay)
main.add_command(demo)
main.add_command(analyze)


def program() -> None:
    """The ``ambrosia-py`` program (not an in-process call of :func:`main`): it may
    execute itself again, under an instance's hash seed (``binding/hashseed.py``)."""
    as_program()
    main()


if __name__ == "__main__":  # pragma: no cover
    program()
