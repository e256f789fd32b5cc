"""``ambrosia-py group``: the replica group of an instance run as replicas: which
replicas it has and how many hold a record before it is committed; with ``--members``
or ``--replication-ack``, a change of it.

The registry's store holds the group (``coordinator/registry/groups.py``); the rules of
a change are ``coordinator/replication/group.py``'s and the replicas' part in it
``coordinator/replicas/membership.py``'s. A change is written to the store as the new
group changing from the old; the primary begins a term of its own in it (keeping the
role, under a higher epoch), which needs a quorum of positions from each group, and
settles the change once that term has committed its start. The command waits for that
(unless ``--no-wait``) and says when it is settled.

A change is refused when the new group's terms could not be established: a term needs
positions from ``n - k + 1`` of its members that hold their logs, and a member not
running, or running but recovering (started empty and not caught up), holds none. A new
member counts as not holding its log: add one at a time if the group is small, and start
it (before or after the change: it waits to be added, or catches up once it is).
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from ..coordinator.registry.backends import open_registry, registry_file
from ..coordinator.registry.interface import RegistryError
from ..coordinator.registry.primary import PrimaryElection, open_election
from ..coordinator.replication.group import Group
from .options import coordinators_data_dir, registry_options

__all__ = ["group"]

POLL = 0.2  # seconds between looks at the store while waiting for a change to settle


def _members(text: str) -> frozenset[int]:
    try:
        members = frozenset(int(part) for part in text.split(","))
    except ValueError:
        raise click.BadParameter(f"{text!r} is not replica numbers separated by commas") from None
    if any(r < 0 for r in members):
        raise click.BadParameter(f"{text!r}: replica numbers are 0 or more")
    return members


@click.command()
@click.option("--instance", required=True, help="The instance run as replicas.")
@click.option(
    "--members",
    metavar="N,N,...",
    help="Change the group to these replicas (their numbers, as `run --replica` takes).",
)
@click.option(
    "--replication-ack",
    type=click.IntRange(min=1),
    help="Change how many replicas must hold a record before it is committed (default "
    "with --members: a majority of them).",
)
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="Wait until the change is settled.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the change to be settled.",
)
@coordinators_data_dir
@registry_options
def group(
    instance: str,
    members: str | None,
    replication_ack: int | None,
    wait: bool,
    timeout: float,
    data_dir: Path,
    registry: str | None,
    cluster: str,
) -> None:
    """Show the replica group of an instance run as replicas, or change it."""
    try:
        path = registry_file(registry, data_dir)
        if path is not None and not path.exists():
            raise click.ClickException(f"no registry {path}")
        with open_registry(registry, data_dir, cluster) as reg:
            election = open_election(reg)
            try:
                _show_or_change(election, instance, members, replication_ack, wait, timeout)
            finally:
                election.close()
    except RegistryError as exc:
        raise click.ClickException(str(exc)) from None


def _show_or_change(
    election: PrimaryElection,
    instance: str,
    members: str | None,
    ack: int | None,
    wait: bool,
    timeout: float,
) -> None:
    stored = election.group(instance)
    if stored is None:
        raise click.ClickException(
            f"{instance!r} has no replica group: its replicas store it as they first start"
        )
    if members is None and ack is None:
        click.echo(f"{instance}: {stored.describe()}")
        return
    replicas = stored.replicas if members is None else _members(members)
    try:
        new = Group.of(replicas, ack)
    except ValueError:
        new = None  # not a group at all: the store's own check names what is wrong
    if new is not None:
        _check_terms(election, instance, new)
    changing = election.change_group(instance, replicas, ack, from_version=stored.version)
    click.echo(f"{instance}: changing to {changing.describe()}")
    if not wait:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = election.group(instance)
        if now is not None and now.version != changing.version:
            click.echo(f"{instance}: settled, {now.describe()}")
            return
        time.sleep(POLL)
    raise click.ClickException(
        f"the change of {instance!r}'s group was not settled within {timeout:g} s: a term "
        "of the new group needs a quorum of each group's replicas that hold their logs "
        f"(`ambrosia-py instances` shows them); `ambrosia-py group --instance {instance}` "
        "says when it is"
    )


def _check_terms(election: PrimaryElection, instance: str, new: Group) -> None:
    """Refuse a group whose terms could not be established by the replicas running and
    caught up now (see the module)."""
    holding = {r.replica for r in election.replicas(instance) if not r.recovering}
    able = len(new.replicas & holding)
    if able < new.term_quorum:
        raise click.ClickException(
            f"a term of {new.describe()} needs positions from {new.term_quorum} of them "
            f"that hold their logs, and {able} do (running and caught up: "
            f"{','.join(map(str, sorted(holding))) or 'none'}): start the missing ones and "
            "let them catch up first, or change the group in smaller steps"
        )
