"""What every registry backend offers: the one interface the coordinator and the commands
are written against.

Two backends implement :class:`InstanceRegistry`: the embedded SQLite database
(:mod:`.store`, :mod:`.sqlite`: one machine, the data dir's file or one shared file) and
etcd (:mod:`.etcd`: instances on many machines finding each other by name).
:func:`.backends.open_registry` chooses one from a spec.

Besides what an instance is (ports, versions, checkpoints, committer id), a registry
holds where its running coordinator can be reached: its link and ingress addresses and
the name of its machine (:class:`Addresses`). Those are *live* facts, kept only while
their owner lives: in etcd they sit under a lease the owning process keeps alive, so a
dead coordinator's addresses vanish within the lease's TTL; in SQLite they are rows that
count only while the instance's lock is held (:func:`..storage.running.running_pid`).
:meth:`InstanceRegistry.watch` follows them as they change.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Protocol, runtime_checkable

import attrs

__all__ = [
    "DEFAULT_CLUSTER",
    "Addresses",
    "Endpoint",
    "InstanceInfo",
    "InstanceRegistry",
    "RegistryError",
    "RegistryUnavailable",
]

# The cluster (etcd key prefix, ``/<cluster>/``) when none is given.
DEFAULT_CLUSTER = "ambrosia"


class RegistryError(Exception):
    """A registry request that cannot be met (unknown instance, port clash, ...)."""


class RegistryUnavailable(RegistryError):
    """The store cannot be reached now (etcd down, or cut off from it): the request may
    succeed if tried again later. Every other :class:`RegistryError` is an answer."""


@attrs.frozen
class InstanceInfo:
    """One registered instance; ``last_checkpoint``/``last_log`` are for its current version."""

    name: str
    receive_port: int
    send_port: int
    current_version: int
    last_checkpoint: int | None
    last_log: int | None
    committer_id: int | None


@attrs.frozen
class Endpoint:
    """A host and TCP port a coordinator (or its ingress) listens on."""

    host: str
    port: int


@attrs.frozen
class Addresses:
    """Where an instance's running coordinator can be reached now; ``None`` where nothing
    is published or its owner is gone. ``host_name`` names the publisher's machine."""

    link: Endpoint | None = None
    ingress: Endpoint | None = None
    host_name: str | None = None

    @property
    def empty(self) -> bool:
        """Nothing is reachable: not running, or not published yet."""
        return self.link is None and self.ingress is None


@runtime_checkable
class InstanceRegistry(Protocol):
    """The instance registry, whichever store holds it. Thread-safe; one per process.

    Every failure is a :class:`RegistryError` that names the store (file or etcd
    endpoints) and, for malformed contents, the key or row and the field.
    """

    @property
    def where(self) -> str:
        """The store, in words for messages (a file path, or etcd endpoints and prefix)."""
        ...

    def close(self) -> None:
        """Release the store (idempotent). etcd: this process's lease is revoked, so
        what it published goes at once; SQLite: published rows stay, and count while
        the instance's lock is held."""
        ...

    def __enter__(self) -> InstanceRegistry: ...

    def __exit__(self, *exc: object) -> None: ...

    # --- what an instance is ---------------------------------------------------------

    def get(self, name: str) -> InstanceInfo | None:
        """The instance called ``name``, or ``None``."""
        ...

    def instances(self) -> list[InstanceInfo]:
        """Every registered instance, by name."""
        ...

    def register(
        self,
        name: str,
        *,
        receive_port: int | None = None,
        send_port: int | None = None,
        version: int = 0,
    ) -> InstanceInfo:
        """Register ``name`` (or return it unchanged if it exists and no port is given);
        the port rules are :func:`.rules.choose_ports`'."""
        ...

    def set_current_version(self, name: str, version: int) -> None:
        """Make ``version`` the instance's current version (after an upgrade)."""
        ...

    def commit_checkpoint(self, name: str, version: int, checkpoint: int, log: int) -> None:
        """Record checkpoint ``checkpoint`` (and log ``log``) of ``version`` as durable;
        an older checkpoint than the one recorded is refused."""
        ...

    def set_committer_id(self, name: str, committer_id: int) -> None:
        """Record the instance's committer id (a 32-bit signed integer)."""
        ...

    def restore(
        self, name: str, version: int, committer_id: int | None, checkpoints: dict[int, int]
    ) -> InstanceInfo:
        """Register ``name`` afresh from what its files say (``registry rebuild``)."""
        ...

    # --- where it runs -----------------------------------------------------------------

    def set_link_address(self, name: str, host: str, port: int) -> None:
        """Publish where the instance's coordinator accepts links now (etcd: under this
        process's lease, kept alive until :meth:`close`)."""
        ...

    def clear_link_address(self, name: str) -> None:
        """Withdraw the link address: the coordinator accepts no links (yet)."""
        ...

    def link_address(self, name: str) -> tuple[str, int] | None:
        """The link address last published for ``name``, or ``None``."""
        ...

    def set_ingress_address(self, name: str, host: str, port: int) -> None:
        """Publish where the instance's ingress listens now (as :meth:`set_link_address`)."""
        ...

    def clear_ingress_address(self, name: str, address: tuple[str, int] | None = None) -> None:
        """Withdraw the ingress address; with ``address``, only while that is the one
        published (one another process published since, a replica that took the primary
        role over, is left alone)."""
        ...

    def port_users(self, port: int) -> list[tuple[str, str, str]]:
        """Who registered or published ``port``, as (instance, what, host)."""
        ...

    def addresses(self, name: str) -> Addresses:
        """Where ``name`` can be reached now: only addresses whose owner is alive."""
        ...

    def watch(self, name: str) -> AsyncGenerator[Addresses, None]:
        """``name``'s live addresses now, then again each time they change, until the
        caller stops iterating (``aclose()`` it: that lets go of its connection). A store
        that goes away and comes back is reconnected to; meanwhile nothing is yielded."""
        ...
