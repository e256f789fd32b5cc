"""``ambrosia-py registry rebuild``: the registry of a data directory (or the one
``--registry`` names), recovered from the instance files in it
(``coordinator/registry/files.py``); refused beside a running coordinator."""

from __future__ import annotations

from pathlib import Path

import click

from ..coordinator.registry.files import rebuild_registry
from ..coordinator.registry.store import RegistryError
from ..coordinator.storage.files import StorageError
from ..helpformat import Group
from .options import coordinators_data_dir, or_dash, registry_options

__all__ = ["registry"]


@click.group(cls=Group)
def registry() -> None:
    """Maintain the instance registry of a data directory."""


@registry.command()
@coordinators_data_dir
@registry_options
def rebuild(data_dir: Path, registry: str | None, cluster: str) -> None:
    """Recover the registry (DATA_DIR's own, or --registry's) from the instance
    directories in DATA_DIR.

    Registers every instance whose files are present and the registry lacks: its version
    (the newest directory with a checkpoint), its last checkpoint (the newest that reads)
    and its committer id. Ports are allocated anew. An unreadable registry is first moved
    aside, not deleted. Refuses while a coordinator runs one of the instances.
    """
    if not data_dir.is_dir():
        raise click.ClickException(f"no data directory {data_dir}")
    try:
        rebuilt, moved = rebuild_registry(data_dir, registry, cluster)
    except (RegistryError, StorageError) as exc:
        raise click.ClickException(f"registry not rebuilt: {exc}") from None
    for path in moved:
        click.echo(f"moved the unreadable {path.name.split('.damaged-')[0]} aside: {path}")
    for i in rebuilt:
        click.echo(
            f"{i.name}: version {i.version}, checkpoint {or_dash(i.checkpoint)}, committer "
            f"{or_dash(i.committer_id)}, receive port {i.receive_port}, send port {i.send_port} "
            "(ports allocated anew)"
        )
        for why in i.skipped:
            click.echo(f"  skipped a checkpoint that does not read: {why}")
    if not rebuilt:
        click.echo(f"the registry already knows every instance with files in {data_dir}")
