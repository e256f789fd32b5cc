"""A group of replicas of one instance on this machine, for the replication figures:
started, its primary found, its primary's "machine" lost, the lost replica brought back.

Each replica is its own ``ambrosia-py run SERVICE --instance NAME --replica N`` with a
data dir of its own (its "machine"), all naming one registry (a shared SQLite file, or
etcd) and one cluster secret, with free loopback ports for the binding and the ingress
(docs/replication.md, "Running replicas"). A group of one without ``--replica`` is the
standalone instance the replicated ones are measured against.

Each replica runs as a :class:`~.compare_peer_process.PeerProcess`: the service process
and the coordinator it starts share a process group of their own, so losing the
machine is one ``SIGKILL`` to that group (both processes at once, as a power cut would),
and a Ctrl-C typed at the bench reaches the bench alone (whose ``finally`` stops the
group). Stopping is a ``SIGKILL`` too: the data is thrown away, and a clean stop of a
secondary would only cost time.

A bench that is itself killed (SIGKILL, or a SIGTERM from ``timeout``) runs no
``finally``. The group then goes with it through a small leader process,
:data:`GROUP_LEADER`, that starts the ``run`` command as its child: the kernel sends the
leader SIGTERM when the bench dies (``PR_SET_PDEATHSIG``), and the leader SIGKILLs its
group. Not the service process's own parent-death signal alone: that ends the service
process, but the coordinator of a secondary does not stop when its binding goes (it
goes on campaigning for the role), so it would be left running.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import sys
import time
from pathlib import Path
from types import TracebackType

from ..coordinator.links.config import DEFAULT_SECRET_NAME
from ..coordinator.registry.backends import open_registry
from ..coordinator.registry.interface import DEFAULT_CLUSTER, InstanceRegistry
from ..coordinator.registry.primary import PrimaryElection, Term, open_election
from ..testing import ServiceProcess, wait_for
from ..testing.ports import free_ports
from .compare_peer_process import PeerProcess, group_gone

__all__ = ["GROUP_LEADER", "SERVICE", "ReplicaGroup", "ReplicaMachine", "could_lead"]

# The durable counter every caller of ``bench compare`` calls (``add(b"x")`` adds one).
SERVICE = "ambrosia_py.bench.ingress:IngressBench"
INSTANCE = "counter"
READY = "ingress listening on"  # what a primary (or a standalone instance) prints
# What a secondary prints once it holds a checkpoint the primary sent; one started empty
# once the instance was founded says so, and that it has caught up after (it counts
# toward a new term only then: docs/replication.md, "A machine lost with its disk").
INSTALLED = "installed a shipped checkpoint"
RECOVERS = "starts empty after"
CAUGHT_UP = "caught up (its log is durable"


def could_lead(output: str) -> bool:
    """Whether a secondary's ``output`` (of one start) says it holds a checkpoint the
    primary sent and counts toward a new term (it does not recover, or caught up)."""
    caught_up = RECOVERS not in output or CAUGHT_UP in output
    return INSTALLED in output and caught_up


GONE_TIMEOUT = 10.0
# ``python -c GROUP_LEADER BENCH_PID ARGV...``: run ARGV, and SIGKILL the whole process
# group when the bench dies (also if it died before the signal was asked for).
GROUP_LEADER = """
import ctypes, os, signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    os.killpg(0, signal.SIGKILL)
sys.exit(subprocess.Popen(sys.argv[2:]).wait())
"""


class ReplicaMachine:
    """One replica's "machine": its data dir under ``root``, and its ``run`` process
    (``replica`` None: the standalone instance)."""

    def __init__(self, group: ReplicaGroup, replica: int | None) -> None:
        self.group = group
        self.replica = replica
        self.name = "standalone" if replica is None else f"replica{replica}"
        self.data_dir = group.root / self.name
        self.ingress = ""  # host:port of this start's ingress
        self.process: PeerProcess | None = None
        self._log_start = 0

    def start(self) -> None:
        """Run the replica (again: with whatever its data dir holds), on fresh ports."""
        ingress, receive, send = free_ports(3)
        self.ingress = f"127.0.0.1:{ingress}"
        args = [
            *self.group.replica_args(self.replica),
            *("--secret-file", str(self.group.secret)),
            *("--ingress", self.ingress),
            *("--receive-port", str(receive), "--send-port", str(send)),
        ]
        run = ServiceProcess(SERVICE, self.group.instance, self.data_dir, args).argv
        argv = [sys.executable, "-c", GROUP_LEADER, str(os.getpid()), *run]
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.process = PeerProcess(self.name, argv, self.group.root)
        self._log_start = self.process.log.stat().st_size if self.process.log.exists() else 0
        self.process.start()

    def output(self) -> str:
        """What this start has printed so far."""
        if self.process is None or not self.process.log.exists():
            return ""
        with self.process.log.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    def says(self, text: str) -> bool:
        """Whether this start printed ``text``; raises, with its last line, if it exited."""
        if text in self.output():
            return True
        if self.process is not None and self.process.proc is not None:
            code = self.process.proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"{self.name} of {self.group.instance} exited ({code}): "
                    f"{self.process.last_line()}"
                )
        return False

    def kill(self) -> None:
        """SIGKILL every process of this machine at once; return once they are gone."""
        process, self.process = self.process, None
        if process is None or process.proc is None:
            return
        group = process.proc.pid  # the session leader's pid is its group's id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGKILL)
        process.proc.wait()
        wait_for(f"the processes of {self.name} to end", lambda: group_gone(group), GONE_TIMEOUT)

    def lose(self) -> float:
        """Lose the machine: SIGKILL its processes, then its disk. Returns when the
        signal was sent (``time.perf_counter``)."""
        process = self.process
        if process is None or process.proc is None:
            raise RuntimeError(f"{self.name} is not running")
        killed_at = time.perf_counter()
        self.kill()
        shutil.rmtree(self.data_dir)
        return killed_at


class ReplicaGroup:
    """``replicas`` replicas of ``instance`` under ``root`` meeting in ``registry``
    (default: a SQLite file in ``root``), committing once ``ack`` hold a record
    (default: the coordinator's, a majority); ``replicas`` None: one standalone
    instance. Use it as a context manager: every process is gone after the block."""

    def __init__(
        self,
        root: Path,
        replicas: int | None,
        *,
        ack: int | None = None,
        registry: str | None = None,
        cluster: str = DEFAULT_CLUSTER,
        instance: str = INSTANCE,
    ) -> None:
        self.root = root
        self.replicas = replicas
        self.ack = ack
        self.instance = instance
        self.cluster = cluster
        self.registry = registry or str(root / "registry.sqlite3")
        self.secret = root / DEFAULT_SECRET_NAME  # clients find it with data_dir=root
        numbers: list[int | None] = [None] if replicas is None else list(range(replicas))
        self.machines = [ReplicaMachine(self, n) for n in numbers]
        self._registry: InstanceRegistry | None = None
        self._election: PrimaryElection | None = None

    @property
    def quorum(self) -> int:
        """How many replicas hold a record before it commits: ``--replication-ack``,
        else the coordinator's default, a majority (1 for a standalone instance)."""
        return self.ack or (self.replicas or 1) // 2 + 1

    def replica_args(self, replica: int | None) -> list[str]:
        """The options that make ``run`` a replica of this group (none: standalone)."""
        if replica is None:
            return []
        args = [*("--registry", self.registry, "--cluster", self.cluster)]
        args += ["--replica", str(replica), "--replicas", str(self.replicas)]
        if self.ack is not None:
            args += ["--replication-ack", str(self.ack)]
        return args

    def start(self, timeout: float) -> None:
        """Start every replica; return once a primary serves and every secondary holds
        a checkpoint (could take over)."""
        self.root.mkdir(parents=True, exist_ok=True)
        if not self.secret.exists():
            fd = os.open(self.secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.write(fd, secrets.token_bytes(32))
            finally:
                os.close(fd)
        for machine in self.machines:
            machine.start()
        if self.replicas is None:
            standalone = self.machines[0]
            wait_for("the standalone instance to serve", lambda: standalone.says(READY), timeout)
            return
        wait_for(f"a primary of {self.instance}", lambda: self.current() is not None, timeout)
        primary = self.primary()
        wait_for(f"{primary.name} to serve as primary", lambda: primary.says(READY), timeout)
        for machine in self.machines:
            if machine is not primary:
                self.wait_caught_up(machine, timeout)

    def wait_caught_up(self, machine: ReplicaMachine, timeout: float) -> None:
        """Wait until ``machine``, a secondary, holds a checkpoint the primary sent and,
        if it recovers, has caught up: it counts toward a new term."""

        def counts() -> bool:
            machine.says(INSTALLED)  # raises if it exited
            return could_lead(machine.output())

        wait_for(f"{machine.name} to catch up", counts, timeout)

    def election(self) -> PrimaryElection:
        """The primary role in the group's registry (opened once, by this process)."""
        if self._election is None:
            self._registry = open_registry(self.registry, self.root, self.cluster)
            self._election = open_election(self._registry)
        return self._election

    def current(self) -> Term | None:
        """The current term, as the registry says now."""
        return self.election().current(self.instance)

    def primary(self) -> ReplicaMachine:
        """The machine of the current term (the standalone instance's own)."""
        if self.replicas is None:
            return self.machines[0]
        term = self.current()
        if term is None:
            raise RuntimeError(f"no replica of {self.instance} holds the primary role")
        return self.machines[term.replica]

    def listed(self, machine: ReplicaMachine) -> bool:
        """Whether the registry lists ``machine`` as a live replica (a lost one is listed
        until its lease runs out, with etcd)."""
        return any(r.replica == machine.replica for r in self.election().replicas(self.instance))

    def rejoin(self, machine: ReplicaMachine, timeout: float) -> None:
        """Start a lost machine again with its empty disk, once the registry no longer
        lists it, and wait until it has caught up."""
        wait_for(f"{machine.name} to be unlisted", lambda: not self.listed(machine), timeout)
        machine.start()
        self.wait_caught_up(machine, timeout)

    def stop(self) -> None:
        """Kill every replica's processes; let go of the registry."""
        errors: list[BaseException] = []
        try:
            for machine in self.machines:  # every one, even after one failed to end
                try:
                    machine.kill()
                except Exception as exc:
                    errors.append(exc)
        finally:
            election, registry = self._election, self._registry
            self._election = self._registry = None
            try:
                if election is not None:
                    election.close()
            finally:
                if registry is not None:
                    registry.close()
        if errors:
            raise errors[0]

    def __enter__(self) -> ReplicaGroup:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
