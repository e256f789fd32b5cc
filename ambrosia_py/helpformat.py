"""How the command line lists a group's commands: each with its whole summary.

click cuts a command's summary at the width left on its row ("Write a report (HTML,
PNG charts, Parquet tables) over the..."), so every group of ours lists the first
sentence of each command's help whole, wrapped under it.
"""

from __future__ import annotations

import click

__all__ = ["Group"]


class Group(click.Group):
    """A click group whose listing keeps each command's summary whole."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1_000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
