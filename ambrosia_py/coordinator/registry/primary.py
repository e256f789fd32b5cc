"""Which replica of an instance is primary: a role held in the registry's store, with
an epoch per term.

An instance run active/active has replicas (``run --replica N``), each with its own data
dir, normally on its own machine. One of them, the primary, takes input and writes the
log, which it ships to the others. Who that is, is decided by the store the registry
already uses, never by a protocol of our own:

- etcd (:mod:`.etcd_primary`): a key under the primary process's lease, taken in a
  transaction that succeeds only if nobody holds it; it vanishes within the lease's TTL
  when its holder dies or is cut off.
- SQLite (:mod:`.sqlite_primary`): replicas on one machine sharing one registry file; a
  ``fcntl`` lock on a file beside it, which the kernel drops when its holder dies.

Each holding of the role is a :class:`Term`, and each term has an **epoch** taken from the
store when the term begins: the revision of the etcd write that made it, or a counter row
that every new primary increments in a SQLite transaction. Epochs only grow (never from
a clock): a later term always has a higher epoch than every earlier one.

A secondary may find the primary lost by its own heartbeats, sooner than the lease's TTL
(etcd grants nothing shorter than about a second); :meth:`PrimaryElection.take_over` then
takes the role from exactly the term it saw, in one transaction that fails if that term
is no longer the current one, so of two secondaries racing, one wins.

Safety. The store only *orders* terms; it cannot stop a primary that does not know it was
deposed (paused past its TTL, cut off from the store, or taken over from while alive)
from going on for a while. What makes such a primary harmless is that every record it
ships carries its epoch, every replica and peer refuses anything of a lower epoch than
the highest it has seen, and a record counts as committed only once a quorum of replicas
has acknowledged it. A new primary makes its epoch known to a quorum before it takes
input, and starts from the furthest log among them: a record the old primary committed
was acknowledged by a quorum that shares a replica with that one, so the new primary has
it, and whatever the old primary ships afterwards that quorum refuses, so it commits
nothing more. :meth:`PrimaryElection.still_primary` is a linearizable check a primary
makes to fence itself sooner (before acknowledging anything after a pause, say); it
narrows the window, the epochs close it.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from .interface import Endpoint, InstanceRegistry, RegistryError
from .rules import check_port

if TYPE_CHECKING:  # the replication core, not imported by whoever only reads the role
    from ..replication.group import Group

__all__ = [
    "LOG_POSITION_MAX",
    "PrimaryElection",
    "Replica",
    "Term",
    "check_replica",
    "open_election",
]

LOG_POSITION_MAX = 2**63 - 1  # a log position is a signed 64-bit number, 0 or more


@attrs.frozen
class Term:
    """One holding of the primary role: replica ``replica`` of ``instance``, from the
    moment its log reached ``log_position``; ``epoch`` is the store's and only grows."""

    instance: str
    replica: int
    epoch: int
    log_position: int


@attrs.frozen
class Replica:
    """A live replica: where it takes the shipped log (``address``), how far its log
    reaches (``log_position``), the name of its machine, and whether it is
    ``recovering`` (started with an empty data dir and not caught up since: new terms do
    not count it, docs/replication.md)."""

    replica: int
    address: Endpoint
    log_position: int
    host_name: str
    recovering: bool = False


def check_replica(replica: int, log_position: int, address: Endpoint | None = None) -> None:
    """Refuse a replica number, log position or replication address no backend can hold."""
    if not 0 <= replica <= 2**31 - 1:
        raise RegistryError(f"replica number {replica} is not in 0..{2**31 - 1}")
    if not 0 <= log_position <= LOG_POSITION_MAX:
        raise RegistryError(f"log position {log_position} is not in 0..{LOG_POSITION_MAX}")
    if address is not None:
        check_port(address.port, "replication port")
        if not address.host:
            raise RegistryError(f"the replication address of replica {replica} needs a host")


@runtime_checkable
class PrimaryElection(Protocol):
    """The primary role of instances, in the registry's store. Thread-safe.

    A process makes one per registry (:func:`open_election`). The roles it holds are its
    own: its replica registrations and terms end when it closes or dies. Every failure
    is a :class:`RegistryError` naming the store.
    """

    @property
    def where(self) -> str:
        """The store, in words for messages."""
        ...

    def close(self) -> None:
        """Give up every term this object holds and withdraw its replica registrations."""
        ...

    def register_replica(
        self,
        instance: str,
        replica: int,
        address: Endpoint,
        log_position: int,
        recovering: bool = False,
    ) -> None:
        """Publish replica ``replica`` of ``instance`` as this process's, live while the
        process is (again to move ``log_position`` on, or say it no longer recovers). A
        replica number another live process registered is refused."""
        ...

    def replicas(self, instance: str) -> list[Replica]:
        """The live replicas of ``instance``, by number."""
        ...

    def campaign(
        self, instance: str, replica: int, log_position: int, *, group_version: int
    ) -> Term | None:
        """Take the primary role for ``replica`` (registered by this process) if nobody
        holds it and the instance's group is still of ``group_version`` (as the caller
        read it: 0 for none): the new term, or ``None`` if another term is current or
        the group changed."""
        ...

    def take_over(
        self, instance: str, replica: int, seen: Term, log_position: int, *, group_version: int
    ) -> Term | None:
        """Take the role from ``seen``, found lost by the caller's own heartbeats: the
        new term (a higher epoch) if ``seen`` was still the current term and the group
        still of ``group_version``, else ``None``. Of several callers that saw the same
        term, at most one wins."""
        ...

    def renew(self, term: Term, log_position: int, *, group_version: int) -> Term | None:
        """A new term for the holder of ``term`` (begun by this object, still current),
        from ``log_position``, in the group of ``group_version`` (the store's now): its
        replica keeps the role under a higher epoch, so that a term of a changed group
        begins without a failover. ``None`` if ``term`` is no longer current or the group
        is not of that version."""
        ...

    def group(self, instance: str) -> Group | None:
        """The instance's replica group as the store holds it (its version the store's),
        or ``None`` before any was stored (:mod:`.groups`)."""
        ...

    def found_group(self, instance: str, group: Group) -> Group:
        """The instance's group: the one stored, or ``group`` (settled), stored now if
        none is."""
        ...

    def change_group(
        self, instance: str, replicas: frozenset[int], k: int | None, *, from_version: int
    ) -> Group:
        """Begin a change of the stored group, which must be of ``from_version`` and
        settled, to ``replicas`` committing on ``k`` (default: a majority): the group
        stored, changing. A :class:`RegistryError` says why not."""
        ...

    def settle_group(self, term: Term, group: Group) -> Group | None:
        """Settle the change ``group`` is (the term's), the primary of ``term`` having
        committed the term's start: the new members alone, stored; ``None`` if the term
        is no longer current or the stored group is no longer ``group``."""
        ...

    def current(self, instance: str) -> Term | None:
        """The current term of ``instance``, or ``None`` if nobody holds the role."""
        ...

    def watch_primary(self, instance: str) -> AsyncGenerator[Term | None, None]:
        """The current term now, then again each time it changes (``None``: nobody holds
        it), until the caller stops iterating (``aclose()`` it). A store that goes away
        and comes back is reconnected to; meanwhile nothing is yielded."""
        ...

    def resign(self, term: Term) -> None:
        """End ``term``, begun by this object, if it is still current; a term already
        superseded is left alone, and so is the term after it (and any term begun
        elsewhere: only its holder ends a term)."""
        ...

    def still_primary(self, term: Term) -> bool:
        """Whether ``term`` is the current term now, as the store says after every write
        it has acknowledged (linearizable): the check a primary fences itself with."""
        ...


def open_election(registry: InstanceRegistry) -> PrimaryElection:
    """The :class:`PrimaryElection` in ``registry``'s store (it stays the caller's to
    close, after the election)."""
    from .sqlite import SqliteRegistry

    if isinstance(registry, SqliteRegistry):
        from .sqlite_primary import SqlitePrimaryElection

        return SqlitePrimaryElection(registry)
    from .etcd import EtcdRegistry  # only for etcd, as in backends.open_registry

    if isinstance(registry, EtcdRegistry):
        from .etcd_primary import EtcdPrimaryElection

        return EtcdPrimaryElection(registry)
    raise RegistryError(f"the registry {registry.where} keeps no primary role")
