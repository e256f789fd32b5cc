"""``ambrosia-py bench``: measured figures, never asserted in tests."""

from __future__ import annotations

import click

from ..helpformat import Group
from .compare import compare_bench
from .coordinator import coordinator
from .ingress import ingress_bench
from .ockam import ockam_bench
from .rpc import rpc_bench
from .spark import spark_bench
from .wallaroo import wallaroo_bench
from .wire import wire


@click.group(cls=Group)
def bench() -> None:
    """Measure throughput and latency on this machine."""


bench.add_command(wire)
bench.add_command(coordinator)
bench.add_command(rpc_bench)
bench.add_command(ockam_bench)
bench.add_command(spark_bench)
bench.add_command(ingress_bench)
bench.add_command(wallaroo_bench)
bench.add_command(compare_bench)

__all__ = ["bench"]
