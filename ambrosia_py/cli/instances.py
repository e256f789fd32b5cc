"""``ambrosia-py instances``: the instances a registry knows, where each runs, and whether
its coordinator is alive.

The registry is the data directory's own, or the one ``--registry`` names (a shared
SQLite file, or etcd: every instance of the cluster, on every machine). Reads it without
a running coordinator and creates nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from ..coordinator.registry.backends import open_registry, registry_file
from ..coordinator.registry.interface import (
    Addresses,
    InstanceInfo,
    InstanceRegistry,
    RegistryError,
)
from ..coordinator.registry.store import Registry
from ..coordinator.storage.data_dir import DataDirError, existing_data_dir, running_pid
from ..coordinator.storage.files import InstanceFiles
from .options import coordinators_data_dir, or_dash, registry_options

__all__ = ["instances"]

_COLUMNS = (
    *("name", "version", "receive", "send", "checkpoint", "log", "committer"),
    *("alive", "host", "link", "ingress"),
)


def _alive(registry: InstanceRegistry, data_dir: Path, info: InstanceInfo, live: Addresses) -> str:
    """Whether its coordinator runs: its addresses live (etcd: its lease; SQLite: its
    lock), or, SQLite, its lock in this data dir is held (while it recovers, before it
    publishes)."""
    if isinstance(registry, Registry):
        pid = running_pid(InstanceFiles(data_dir, info.name, info.current_version))
        if pid:
            return f"yes (pid {pid})"
        if pid is not None:
            return "yes"
    return "no" if live.empty else "yes"


@click.command()
@coordinators_data_dir
@registry_options
def instances(data_dir: Path, registry: str | None, cluster: str) -> None:
    """List the registered instances, where each runs and whether it is alive (creating
    nothing)."""
    try:
        path = registry_file(registry, data_dir)
        if registry is None:
            existing_data_dir(data_dir, need_registry=False)
    except (DataDirError, RegistryError) as exc:
        raise click.ClickException(str(exc)) from None
    if path is not None and not path.exists():
        click.echo(f"no registry in {data_dir}" if registry is None else f"no registry {path}")
        return
    try:
        with open_registry(registry, data_dir, cluster) as reg:
            where = str(data_dir) if registry is None else reg.where
            infos = reg.instances()
            live = {i.name: reg.addresses(i.name) for i in infos}
            alive = {i.name: _alive(reg, data_dir, i, live[i.name]) for i in infos}
    except RegistryError as exc:
        if path is None:
            raise click.ClickException(str(exc)) from None
        raise click.ClickException(f"{exc}; see `ambrosia-py registry rebuild`") from None
    if not infos:
        click.echo(f"no instances registered in {where}")
        return
    table = Table(title=f"instances in {where}")
    for header in _COLUMNS:
        table.add_column(header, overflow="fold")
    for i in infos:
        addresses = live[i.name]
        link, ingress = addresses.link, addresses.ingress
        table.add_row(
            i.name,
            str(i.current_version),
            str(i.receive_port),
            str(i.send_port),
            or_dash(i.last_checkpoint),
            or_dash(i.last_log),
            or_dash(i.committer_id),
            alive[i.name],
            addresses.host_name or "-",
            "-" if link is None else f"{link.host}:{link.port}",
            "-" if ingress is None else f"{ingress.host}:{ingress.port}",
        )
    # Piped (not a terminal), the table is not folded to an assumed 80 columns.
    Console(soft_wrap=False, width=None if sys.stdout.isatty() else 240).print(table)
