"""Finding a service's ingress by its instance name, in the registry its coordinator uses.

A running service publishes where its ingress listens (``run --ingress``) in the
registry: the data dir's own, a shared SQLite file, or etcd
(``coordinator/registry/backends.py``). A client made with ``connect(instance=...,
registry=...)`` asks the registry before every connection it makes, not once: after a
connection is lost, the instance may have restarted elsewhere, on another port or
machine, and the registry says where. What it publishes lives only as long as the
service does (etcd: under its lease), so a stale address is soon gone.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from ..coordinator.registry.backends import open_registry, registry_file
from ..coordinator.registry.interface import DEFAULT_CLUSTER, InstanceRegistry, RegistryError
from ..hashseed import DATA_DIR_ENV, DEFAULT_DATA_DIR
from ..ingress.errors import IngressError

__all__ = ["IngressLookup", "NotPublished", "lookup_for"]


class NotPublished(ConnectionError):
    """The registry names no live ingress for the instance now (not running, recovering,
    run without ``--ingress``), or cannot be read or reached: tried again, as a service
    that is down."""


class IngressLookup:
    """Where ``instance``'s ingress listens, as the registry ``spec`` says
    (``None``: ``data_dir``'s own ``registry.sqlite3``; ``data_dir`` default as ``run``'s).

    The registry is opened on the first lookup and kept until :meth:`close`; a SQLite
    file that does not exist yet is not created. A spec that cannot be a registry is an
    :class:`~ambrosia_py.client.IngressError` here, at once.
    """

    def __init__(
        self,
        instance: str,
        spec: str | Path | None = None,
        cluster: str = DEFAULT_CLUSTER,
        data_dir: str | Path | None = None,
    ) -> None:
        if not instance:
            raise IngressError("connect by name needs an instance name")
        self.instance = instance
        self.spec = None if spec is None else str(spec)
        self.cluster = cluster
        self.data_dir = Path(
            data_dir if data_dir is not None else os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR
        )
        try:
            self._file = registry_file(self.spec, self.data_dir)
        except RegistryError as exc:
            raise IngressError(str(exc)) from None
        self._registry: InstanceRegistry | None = None
        self._lock = threading.Lock()  # lookups run in worker threads

    @property
    def where(self) -> str:
        """The registry, in words."""
        if self._registry is not None:
            return self._registry.where
        return str(self._file) if self._file is not None else str(self.spec)

    async def resolve(self) -> tuple[str, int]:
        """The ingress's host and port now, or :class:`NotPublished`."""
        return await asyncio.to_thread(self._resolve)

    def _resolve(self) -> tuple[str, int]:
        with self._lock:
            try:
                if self._registry is None:
                    if self._file is not None and not self._file.is_file():
                        raise NotPublished(
                            f"no registry {self._file}: instance {self.instance!r} has not run "
                            "with it"
                        )
                    self._registry = open_registry(self.spec, self.data_dir, self.cluster)
                ingress = self._registry.addresses(self.instance).ingress
            except RegistryError as exc:
                raise NotPublished(f"the registry: {exc}") from None
        if ingress is None:
            raise NotPublished(
                f"instance {self.instance!r} publishes no ingress address in {self.where} "
                "(it is not running, is recovering, or runs without --ingress)"
            )
        return ingress.host, ingress.port

    def close(self) -> None:
        """Let go of the registry (blocking: from a worker thread on an event loop)."""
        with self._lock:
            registry, self._registry = self._registry, None
        if registry is not None:
            registry.close()


def lookup_for(
    instance: str, registry: str | Path | None, options: dict[str, Any]
) -> IngressLookup:
    """The lookup ``connect(instance=..., registry=..., **options)`` makes: ``cluster``
    is taken out of ``options`` (it is the lookup's alone); ``data_dir`` stays in them
    (the secret may be there too)."""
    cluster = options.pop("cluster", DEFAULT_CLUSTER)
    return IngressLookup(instance, registry, cluster, options.get("data_dir"))
