"""``ambrosia-py bench``: measured figures, never asserted in tests.

The commands here measure the framework. A service built on it adds its own as a
plug-in: a click command registered under the entry point group :data:`PLUGIN_GROUP`
(``ambrosia_py.bench``) in its distribution's metadata, listed by name and imported only
when it runs (the Ockam hub's ``bench ockam``, from ``pyproject.toml``).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points

import click

from ..helpformat import Group
from .compare import compare_bench
from .coordinator import coordinator
from .ingress import ingress_bench
from .rpc import rpc_bench
from .spark import spark_bench
from .wallaroo import wallaroo_bench
from .wire import wire

__all__ = ["PLUGIN_GROUP", "bench"]

PLUGIN_GROUP = "ambrosia_py.bench"


class _BenchGroup(Group):
    """The built-in commands, and the plug-ins' (loaded when asked for)."""

    def _plugins(self) -> dict[str, EntryPoint]:
        found = {p.name: p for p in entry_points(group=PLUGIN_GROUP)}
        return {name: p for name, p in found.items() if name not in self.commands}

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self._plugins()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            return command
        point = self._plugins().get(cmd_name)
        if point is None:
            return None
        loaded = point.load()
        if not isinstance(loaded, click.Command):
            raise click.ClickException(
                f"bench plug-in {cmd_name!r} ({point.value}) is not a click command"
            )
        return loaded


@click.group(cls=_BenchGroup)
def bench() -> None:
    """Measure throughput and latency on this machine."""


bench.add_command(wire)
bench.add_command(coordinator)
bench.add_command(rpc_bench)
bench.add_command(spark_bench)
bench.add_command(ingress_bench)
bench.add_command(wallaroo_bench)
bench.add_command(compare_bench)
