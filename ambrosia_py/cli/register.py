"""``ambrosia-py register NAME``: register an instance in a data directory's registry, or
the one ``--registry`` names."""

from __future__ import annotations

from pathlib import Path

import click

from ..coordinator.registry.backends import open_registry
from ..coordinator.registry.interface import RegistryError
from .options import coordinators_data_dir, registry_options

__all__ = ["register"]


@click.command()
@click.argument("name")
@coordinators_data_dir
@click.option("--receive-port", type=int, help="Port the coordinator receives on.")
@click.option("--send-port", type=int, help="Port the coordinator sends on.")
@click.option("--version", "version", type=int, help="Current version (default 0).")
@registry_options
def register(
    name: str,
    data_dir: Path,
    receive_port: int | None,
    send_port: int | None,
    version: int | None,
    registry: str | None,
    cluster: str,
) -> None:
    """Register instance NAME (ports not given are allocated) and print its ports."""
    try:
        with open_registry(registry, data_dir, cluster) as reg:
            info = reg.register(
                name, receive_port=receive_port, send_port=send_port, version=version or 0
            )
            if version is not None and info.current_version != version:
                reg.set_current_version(name, version)
                info = reg.get(name) or info
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{info.name}: receive port {info.receive_port}, send port {info.send_port}, "
        f"version {info.current_version}"
    )
