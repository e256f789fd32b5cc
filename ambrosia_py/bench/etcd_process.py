"""A real etcd for the replication figures: one member on free loopback ports, in a
directory of the bench's, gone when the measure ends.

Replicas that meet in etcd hold the primary role under a lease (docs/replication.md);
when the primary's machine is lost, its key vanishes within the lease's time to live,
and a secondary that heard nothing for 300 ms takes over sooner. etcd grants a 1 s lease
only with a short Raft timing (``--heartbeat-interval 50 --election-timeout 500``; with
its defaults the shortest is 2 s), so this member runs with it, and the registry spec
it gives asks for that lease (``?lease_ttl=1``): the figures are those of an etcd set up
for fast failover.

It runs as a :class:`~.compare_peer_process.PeerProcess`: in a process group of its own,
killed with the bench however the bench ends.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ..testing.ports import free_ports
from .compare_peer_process import PeerProcess, PeerUnavailableError

__all__ = ["RAFT_TIMING", "EtcdProcess", "etcd_unavailable"]

# Raft heartbeat and election timeout, ms: what etcd needs to grant 1 s leases.
RAFT_TIMING = ("--heartbeat-interval", "50", "--election-timeout", "500")
LEASE_TTL_S = 1
START_TIMEOUT = 30.0


def etcd_unavailable() -> str | None:
    """Why no etcd can run here, or ``None`` if it can."""
    if shutil.which("etcd") is None:
        return "no etcd command (Debian: apt-get install etcd-server)"
    return None


class EtcdProcess:
    """One etcd member in ``directory`` (its data and log there); ``with
    etcd.running():`` starts it, waits until it has a leader, and stops it."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.client_port, self.peer_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        argv = [
            *("etcd", "--name", "bench", "--data-dir", str(directory / "etcd-data")),
            *("--listen-client-urls", self.url, "--advertise-client-urls", self.url),
            *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
            *("--initial-cluster", f"bench={peer}"),
            *RAFT_TIMING,
        ]
        self.process = PeerProcess("etcd", argv, directory)

    @property
    def spec(self) -> str:
        """The registry spec replicas and callers name it by, with the 1 s lease."""
        return f"etcd://127.0.0.1:{self.client_port}?lease_ttl={LEASE_TTL_S}"

    def healthy(self) -> bool:
        """Whether etcd answers ``/health`` with a leader."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, ValueError):
            return False

    @contextlib.contextmanager
    def running(self) -> Iterator[EtcdProcess]:
        """Started and healthy for the ``with`` block (a
        :class:`~.compare_peer_process.PeerUnavailableError` if it is not installed or
        does not come up), stopped after it."""
        why = etcd_unavailable()
        if why is not None:
            raise PeerUnavailableError(why)
        with self.process.running():
            self.process.wait_until("a healthy etcd", self.healthy, START_TIMEOUT)
            yield self
