"""Publishing where a running instance can be reached: which host to publish, and the
ingress address kept in the registry for as long as the ingress serves.

**Which host.** An address published for a listener must be one other processes can
dial: a listener on a loopback address is published as that address (reachable from
this machine only, which is all it serves); one on a wildcard (``0.0.0.0``, ``::``, or
empty) as this machine's name (:func:`socket.gethostname`), which the other machines
must resolve to it; one on a specific address as that address. ``--advertise-host``
overrides all three (a name or address the others reach this machine by: behind NAT, or
where the host name does not resolve) (:func:`advertised_host`).

**For as long as it serves.** With etcd, addresses live under the publishing process's
lease, which ends when that registry is closed: so the run process keeps one registry
open while its ingress serves (:class:`IngressPublisher`), and its address vanishes at
once when the ingress stops cleanly, within the lease's TTL if the process dies.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
from pathlib import Path

from .backends import open_registry
from .interface import DEFAULT_CLUSTER, InstanceRegistry, RegistryError

__all__ = ["IngressPublisher", "advertised_host", "is_loopback"]

log = logging.getLogger("ambrosia_py.coordinator")

_WILDCARDS = ("", "0.0.0.0", "::", "*")


def advertised_host(listen_host: str, advertise_host: str | None = None) -> str:
    """The host to publish for a listener on ``listen_host`` (module docstring)."""
    if advertise_host:
        return advertise_host
    if listen_host in _WILDCARDS:
        return socket.gethostname()
    return listen_host


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class IngressPublisher:
    """The ingress address of ``instance`` in the registry ``spec`` names, published by
    :meth:`publish` and withdrawn by :meth:`close`, through one registry kept open in
    between. Best effort: the ingress serves whether or not its address is published
    (a failure is logged). Blocking: call it from a worker thread on an event loop."""

    def __init__(
        self,
        data_dir: Path,
        instance: str,
        spec: str | None = None,
        cluster: str = DEFAULT_CLUSTER,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.instance = instance
        self.spec = spec
        self.cluster = cluster
        self._registry: InstanceRegistry | None = None
        self._published: tuple[str, int] | None = None

    def publish(self, host: str, port: int) -> bool:
        """Publish ``host``:``port`` (the host as :func:`advertised_host` chose it);
        whether it is in the registry now."""
        try:
            if self._registry is None:
                self._registry = open_registry(self.spec, self.data_dir, self.cluster)
            self._registry.set_ingress_address(self.instance, host, port)
            self._published = (host, port)
        except (RegistryError, OSError) as exc:
            log.info("the ingress address of %r is not in the registry: %s", self.instance, exc)
            return False
        return True

    def close(self) -> None:
        """Withdraw the address, if it is still the one this published (a replica that
        took the primary role over publishes its own), and let go of the registry (etcd:
        its lease ends now)."""
        registry, self._registry = self._registry, None
        if registry is None:
            return
        try:
            if self._published is not None:
                registry.clear_ingress_address(self.instance, self._published)
        except (RegistryError, OSError) as exc:
            log.info("the ingress address of %r stays in the registry: %s", self.instance, exc)
        finally:
            registry.close()
