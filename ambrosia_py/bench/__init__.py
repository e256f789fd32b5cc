"""``ambrosia-py bench``: measured figures, never asserted in tests."""

from __future__ import annotations

import click

from .wire import wire


@click.group()
def bench() -> None:
    """Measure throughput and latency on this machine."""


bench.add_command(wire)

__all__ = ["bench"]
