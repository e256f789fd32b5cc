"""Machines on one Linux host, as network namespaces on two or three bridges, whose
cables can be pulled.

Each machine is a network namespace with ``lo`` up and two interfaces: ``front`` on the
*front* bridge, which the root namespace (the test, its callers, etcd) shares with every
machine, and ``repl`` on the *replication* bridge, which the machines use among
themselves. Asked for, a third, ``etcd`` on the *etcd* bridge, gives the registry a
network of its own, so that a machine can be cut off from etcd and still be reached by
its callers. Each bridge has a private /24 of its own, the root namespace holding ``.1``
on each, machine ``i`` holding ``.(i + 2)``. A machine has no route but to its own
subnets, so it reaches another's replication address through the replication bridge
only, and etcd through the etcd bridge only, whatever the root namespace forwards.

:meth:`Machine.cut` pulls a machine's cables at the switch (by default its replication
cable): the bridge's end of each pair goes down, so the machine's interface loses its
carrier and what either side sends is dropped, as on a real partition; the networks not
named are untouched. :meth:`Machine.heal` plugs them back in.

Names carry the test process's pid, so runs side by side do not meet; the subnets are
the first free ones in ``10.213.0.0/16``. Creating any of this needs root: see
:func:`unavailable`. :meth:`Network.close` removes it all, killing what still runs in the
namespaces first, whatever state a failed test left them in.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs

from ambrosia_py.testing import ServiceProcess

__all__ = [
    "ETCD",
    "FRONT",
    "REPLICATION",
    "Machine",
    "NetnsProcess",
    "Network",
    "network",
    "unavailable",
]

FRONT = "front"
REPLICATION = "repl"
ETCD = "etcd"
_SPACE = "10.213"  # the /16 the subnets are taken from


def ip(*args: str) -> str:
    """Run ``ip ARGS``; its output, or a RuntimeError saying what ``ip`` said."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be made here (not root, or ``ip netns add`` fails), or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    probe = f"ambprobe{os.getpid()}"
    try:
        ip("netns", "add", probe)
    except (OSError, RuntimeError) as exc:
        return f"cannot make a network namespace: {exc}"
    ip("netns", "del", probe)
    return None


def _free_subnets(count: int) -> list[str]:
    """The first ``count`` ``10.213.N`` prefixes no address of this host is in."""
    used = set(re.findall(rf"inet {re.escape(_SPACE)}\.(\d+)\.", ip("-4", "-o", "addr")))
    free = [f"{_SPACE}.{n}" for n in range(1, 255) if str(n) not in used]
    if len(free) < count:
        raise RuntimeError(f"no {count} free /24s left in {_SPACE}.0.0/16")
    return free[:count]


def kill_processes_in(namespace: str) -> None:
    """SIGKILL whatever still runs in ``namespace`` (this test's processes only: nothing
    else enters a namespace it made)."""
    with contextlib.suppress(RuntimeError):
        for pid in ip("netns", "pids", namespace).split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


@attrs.frozen
class Machine:
    """One namespace: its addresses on the networks, and the root namespace's ends of
    its cables."""

    namespace: str
    front_ip: str
    link_ip: str
    front_port: str  # the bridge's end of the front cable
    link_port: str  # the bridge's end of the replication cable
    etcd_port: str | None = None  # the bridge's end of the etcd cable, if etcd has a network

    def _port(self, network: str) -> str:
        ports = {FRONT: self.front_port, REPLICATION: self.link_port, ETCD: self.etcd_port}
        port = ports.get(network)
        if port is None:
            raise ValueError(f"{self.namespace} has no cable to a network {network!r}")
        return port

    def cut(self, *networks: str) -> None:
        """Pull the cables to ``networks`` (by default the replication cable: nothing
        passes to or from the other machines)."""
        for network in networks or (REPLICATION,):
            ip("link", "set", self._port(network), "down")

    def heal(self, *networks: str) -> None:
        """Plug them back in (they stayed on their bridges)."""
        for network in networks or (REPLICATION,):
            ip("link", "set", self._port(network), "up")


class Network:
    """The bridges and ``n`` machines on them; :meth:`close` removes everything.

    With ``etcd_network`` etcd gets a bridge of its own, every machine a cable to it:
    :attr:`etcd_ip` is the root namespace's address there, where etcd listens (without,
    the front one, as :attr:`root_ip`)."""

    def __init__(self, n: int, *, etcd_network: bool = False) -> None:
        tag = f"amb{os.getpid()}"  # interface names are at most 15 characters
        names = (FRONT, REPLICATION, ETCD) if etcd_network else (FRONT, REPLICATION)
        self.bridges = {name: f"{tag}{name[0].upper()}" for name in names}
        subnets = dict(zip(names, _free_subnets(len(names)), strict=True))
        self.root_ip = f"{subnets[FRONT]}.1"  # the root namespace on the front network
        self.etcd_ip = f"{subnets.get(ETCD, subnets[FRONT])}.1"  # where etcd listens
        self.machines: list[Machine] = []
        self._namespaces: list[str] = []
        self._bridges: list[str] = []  # made so far, for close()
        self._ports: list[str] = []
        try:
            for name, subnet in subnets.items():
                bridge = self.bridges[name]
                ip("link", "add", bridge, "type", "bridge")
                self._bridges.append(bridge)
                ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
                ip("link", "set", bridge, "up")
            for i in range(n):
                self.machines.append(self._machine(tag, i, subnets))
        except BaseException:
            self.close()
            raise

    def _machine(self, tag: str, i: int, subnets: dict[str, str]) -> Machine:
        namespace = f"{tag}m{i}"
        ip("netns", "add", namespace)
        self._namespaces.append(namespace)
        ip("-n", namespace, "link", "set", "lo", "up")
        ports: dict[str, str] = {}
        for name, subnet in subnets.items():
            port = f"{tag}{name[0]}{i}"
            ip("link", "add", port, "type", "veth", "peer", "name", name, "netns", namespace)
            self._ports.append(port)
            ip("link", "set", port, "master", self.bridges[name], "up")
            ip("-n", namespace, "addr", "add", f"{subnet}.{i + 2}/24", "dev", name)
            ip("-n", namespace, "link", "set", name, "up")
            ports[name] = port
        return Machine(
            namespace,
            f"{subnets[FRONT]}.{i + 2}",
            f"{subnets[REPLICATION]}.{i + 2}",
            ports[FRONT],
            ports[REPLICATION],
            ports.get(ETCD),
        )

    def close(self) -> None:
        """Kill what runs in the namespaces, delete the cables, the namespaces and the
        bridges; carries on past what is already gone.

        The cables are deleted by name: a namespace outlives its deletion while any
        socket made in it lives on (a TCP connection closed towards a peer that was cut
        off goes on retransmitting its end for minutes), and its cables with it."""
        for namespace in self._namespaces:
            kill_processes_in(namespace)
        for port in self._ports:
            with contextlib.suppress(RuntimeError):
                ip("link", "del", port)  # the pair's other end, in the namespace, with it
        for namespace in self._namespaces:
            with contextlib.suppress(RuntimeError):
                ip("netns", "del", namespace)
        for bridge in self._bridges:
            with contextlib.suppress(RuntimeError):
                ip("link", "del", bridge)


@contextlib.contextmanager
def network(n: int, *, etcd_network: bool = False) -> Iterator[Network]:
    """A :class:`Network` of ``n`` machines for the ``with`` block, removed after it."""
    made = Network(n, etcd_network=etcd_network)
    try:
        yield made
    finally:
        made.close()


class NetnsProcess(ServiceProcess):
    """A :class:`ServiceProcess` run inside a namespace (``ip netns exec`` execs the
    command in place, so the pid and the coordinator child are the same as without it)."""

    def __init__(
        self,
        namespace: str,
        service: str,
        instance: str,
        data_dir: Path,
        args: Sequence[str],
        *,
        log: Path,
    ) -> None:
        super().__init__(service, instance, data_dir, args, log=log)
        self.namespace = namespace

    @property
    def argv(self) -> list[str]:
        return ["ip", "netns", "exec", self.namespace, *super().argv]
