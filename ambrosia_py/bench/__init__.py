"""``ambrosia-py bench``: measured figures, never asserted in tests."""

from __future__ import annotations

import click

from .coordinator import coordinator
from .wire import wire


@click.group()
def bench() -> None:
    """Measure throughput and latency on this machine."""


bench.add_command(wire)
bench.add_command(coordinator)

__all__ = ["bench"]
