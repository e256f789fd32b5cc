"""``ambrosia-py instances``: the instances a registry knows, where each runs, and whether
its coordinator is alive; for an instance run as replicas, each live replica too.

The registry is the data directory's own, or the one ``--registry`` names (a shared
SQLite file, or etcd: every instance of the cluster, on every machine). Reads it without
a running coordinator and creates nothing.

Replicas (docs/replication.md) are shown in a second table, one line per live replica,
from the registry's primary role (``coordinator/registry/primary.py``): which replica
holds the current term and its epoch, where each replica takes the shipped log, and how
far its log reaches. Each replica publishes that position about once a second
(``coordinator/replicas/node.py``), so how far a secondary is behind the primary is the
difference of two positions published at different moments: approximate, and never
shown below zero (a secondary cannot truly be ahead of the primary it copies). A
secondary started with an empty data dir and not caught up since is "secondary
(recovering)": no new term counts it until it has caught up.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import click
from rich.console import Console
from rich.table import Table

from ..coordinator.registry.backends import open_registry, registry_file
from ..coordinator.registry.interface import (
    Addresses,
    Endpoint,
    InstanceInfo,
    InstanceRegistry,
    RegistryError,
)
from ..coordinator.registry.primary import Replica, Term, open_election
from ..coordinator.registry.sqlite import SqliteRegistry
from ..coordinator.registry.store import Registry
from ..coordinator.storage.data_dir import DataDirError, existing_data_dir, running_pid
from ..coordinator.storage.files import InstanceFiles
from .options import coordinators_data_dir, or_dash, registry_options

if TYPE_CHECKING:
    from ..coordinator.replication.group import Group

__all__ = ["instances"]

_COLUMNS = (
    *("name", "version", "receive", "send", "checkpoint", "log", "committer"),
    *("alive", "host", "link", "ingress"),
)
_REPLICA_COLUMNS = (
    *("instance", "replica", "role", "in group", "epoch", "from seq"),
    *("host", "replication", "position", "behind"),
)


@attrs.frozen
class _ReplicaLine:
    """One live replica as ``instances`` shows it.

    ``epoch`` and ``since`` (the log position the primary's term began at: the registry
    keeps no time of day for a term) are the primary's only; ``behind`` is how many
    records the primary's published position is past this one's, ``None`` for the
    primary itself and whenever no live replica holds the current term.
    """

    instance: str
    replica: int
    primary: bool
    epoch: int | None
    since: int | None
    host_name: str
    address: Endpoint
    log_position: int
    behind: int | None
    recovering: bool = False
    in_group: str = "-"  # yes, joining, leaving (a change under way), no; "-": no group


def _role(line: _ReplicaLine) -> str:
    if line.primary:
        return "primary"
    return "secondary (recovering)" if line.recovering else "secondary"


def _in_group(replica: int, group: Group | None) -> str:
    if group is None:
        return "-"
    if replica in group.replicas:
        old = group.previous
        return "joining" if old is not None and replica not in old.replicas else "yes"
    return "leaving" if group.previous and replica in group.previous.replicas else "no"


def _replica_lines(
    instance: str, replicas: list[Replica], term: Term | None, group: Group | None = None
) -> list[_ReplicaLine]:
    """The lines of ``instance``'s live ``replicas``, by number; ``term`` the current one,
    ``group`` the registry's."""
    primary = next((r for r in replicas if term is not None and r.replica == term.replica), None)
    return [
        _ReplicaLine(
            instance=instance,
            replica=r.replica,
            primary=r is primary,
            epoch=term.epoch if r is primary and term is not None else None,
            since=term.log_position if r is primary and term is not None else None,
            host_name=r.host_name,
            address=r.address,
            log_position=r.log_position,
            recovering=r.recovering,
            in_group=_in_group(r.replica, group),
            behind=(
                None
                if primary is None or r is primary
                else max(0, primary.log_position - r.log_position)
            ),
        )
        for r in sorted(replicas, key=lambda r: r.replica)
    ]


def _read_replicas(registry: InstanceRegistry, names: list[str]) -> list[_ReplicaLine]:
    """The live replicas of every instance in ``names`` that has any.

    A SQLite registry no replica ever used has no place for them yet, and opening its
    primary role would make one (a directory beside the file, two tables): ``instances``
    creates nothing, so it asks only once a replica has made them.
    """
    if isinstance(registry, SqliteRegistry) and not _roles_made(registry.path):
        return []
    election = open_election(registry)
    try:
        lines = []
        for name in names:
            replicas = election.replicas(name)
            if replicas:
                term, group = election.current(name), election.group(name)
                lines += _replica_lines(name, replicas, term, group)
        return lines
    finally:
        election.close()


def _roles_made(path: Path) -> bool:
    """Whether a replica ever used the SQLite registry at ``path``: made the directory
    ``sqlite_primary.py`` keeps its role locks in, ``<registry file>.roles``."""
    return path.with_name(path.name + ".roles").is_dir()


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
    """List the registered instances, where each runs and whether it is alive, and the
    live replicas of those run as replicas (creating nothing)."""
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
            replicas = _read_replicas(reg, [i.name for i in infos])
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
    console = Console(soft_wrap=False, width=None if sys.stdout.isatty() else 240)
    console.print(table)
    if replicas:
        console.print(_replica_table(where, replicas))


def _replica_table(where: str, lines: list[_ReplicaLine]) -> Table:
    """The replicas' table: one section per instance."""
    # Imported here: the replica's module brings in the whole replication core, which
    # an `instances` of standalone instances has no use for.
    from ..coordinator.replicas.leading import POSITION_EVERY

    table = Table(
        title=f"replicas in {where}",
        caption=f"positions are published every {POSITION_EVERY:g} s or so: "
        "behind (records) is approximate",
    )
    for header in _REPLICA_COLUMNS:
        table.add_column(header, overflow="fold")
    for n, line in enumerate(lines):
        last = n + 1 == len(lines) or lines[n + 1].instance != line.instance
        table.add_row(
            line.instance,
            str(line.replica),
            _role(line),
            line.in_group,
            or_dash(line.epoch),
            or_dash(line.since),
            line.host_name,
            f"{line.address.host}:{line.address.port}",
            str(line.log_position),
            or_dash(line.behind),
            end_section=last,
        )
    return table
