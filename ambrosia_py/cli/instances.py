"""``ambrosia-py instances``: the instances a data directory's registry knows.

Reads the registry without a running coordinator and creates nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..coordinator.registry.store import REGISTRY_FILE, InstanceInfo, Registry, RegistryError
from ..coordinator.storage.data_dir import DataDirError, existing_data_dir
from .options import coordinators_data_dir, or_dash

__all__ = ["instances"]


@click.command()
@coordinators_data_dir
def instances(data_dir: Path) -> None:
    """List the registered instances (creating nothing)."""
    try:
        existing_data_dir(data_dir, need_registry=False)
    except DataDirError as exc:
        raise click.ClickException(str(exc)) from None
    if not (data_dir / REGISTRY_FILE).exists():
        click.echo(f"no registry in {data_dir}")
        return
    try:
        with Registry(data_dir) as reg:
            infos: list[InstanceInfo] = reg.instances()
            links = {i.name: reg.link_address(i.name) for i in infos}
    except RegistryError as exc:
        raise click.ClickException(f"{exc}; see `ambrosia-py registry rebuild`") from None
    if not infos:
        click.echo(f"no instances registered in {data_dir}")
        return
    table = Table(title=f"instances in {data_dir}")
    for header in ("name", "version", "receive", "send", "checkpoint", "log", "committer"):
        table.add_column(header, overflow="fold")
    table.add_column("links", overflow="fold")
    for i in infos:
        link = links[i.name]
        table.add_row(
            i.name,
            str(i.current_version),
            str(i.receive_port),
            str(i.send_port),
            or_dash(i.last_checkpoint),
            or_dash(i.last_log),
            or_dash(i.committer_id),
            "-" if link is None else f"{link[0]}:{link[1]}",
        )
    # Piped (not a terminal), the table is not folded to an assumed 80 columns.
    Console(soft_wrap=False, width=None if sys.stdout.isatty() else 160).print(table)
