"""Running one coordinator as a process: the command line that starts one, start-up
checks, the signals that stop it (SIGINT and SIGTERM flush pending input first), the exit
status."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ...allocator import prime_allocator
from ..links.config import load_secret, tls_contexts
from ..registry.files import clear_interrupted_first_start, prepare_start
from ..registry.interface import DEFAULT_CLUSTER, InstanceRegistry
from ..registry.port_users import PortTakenError, cannot_listen
from ..registry.publish import advertised_host, is_loopback
from ..registry.store import Registry
from ..storage.files import CorruptLogError, InstanceFiles
from .config import (
    BindingLeftError,
    CoordinatorConfig,
    CoordinatorError,
    print_ready,
    resolve_start,
)
from .server import Coordinator

if TYPE_CHECKING:
    from ..replicas.node import ReplicaNode
    from ..replication import Group

__all__ = ["coordinator_argv", "run_coordinator"]

log = logging.getLogger("ambrosia_py.coordinator")


def coordinator_argv(
    instance: str,
    data_dir: Path,
    *options: str,
    registry: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> list[str]:
    """The command line that runs ``ambrosia-py coordinator`` in a child process, with
    the registry ``registry`` names (None: the data dir's own) in ``cluster``."""
    where = [] if registry is None else ["--registry", registry]
    if cluster != DEFAULT_CLUSTER:
        where += ["--cluster", cluster]
    return [
        sys.executable,
        "-m",
        "ambrosia_py.cli",
        "coordinator",
        "--instance",
        instance,
        "--data-dir",
        str(data_dir),
        *where,
        *options,
    ]


async def _with_signals(main: asyncio.Task[int], coordinator: Coordinator | None = None) -> int:
    """Stop on SIGINT/SIGTERM: once processing, by flushing pending input first."""
    loop = asyncio.get_running_loop()

    def on_signal() -> None:
        if coordinator is not None and coordinator.stop():
            log.info("stopping on a signal: making pending input durable first")
        else:
            main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        return await main
    except asyncio.CancelledError:
        log.info("stopped by signal")
        return 0


async def run_coordinator(
    config: CoordinatorConfig, ready: Callable[[str], None] = print_ready
) -> int:
    """Run one coordinator until its binding disconnects; return the exit status."""
    prime_allocator()  # every read asks for 256 KiB: from the heap, not a fresh mapping
    # Refuses when the registry has lost track of the instance's files (never a first
    # start over existing history), before anything is listened on or written.
    registry = prepare_start(
        config.data_dir,
        config.instance,
        config.registry,
        config.cluster,
        replica=config.replica is not None,
    )
    try:
        # Read now, so a bad secret or TLS file stops start-up, not links after recovery.
        load_secret(config.link_settings, config.data_dir)
        tls_contexts(config.link_settings)
        version, _, _ = resolve_start(config, registry)
        files = InstanceFiles(config.data_dir, config.instance, version)
        files.create()
        files.acquire_lock()
        if not isinstance(registry, Registry) and is_loopback(config.link_host):
            log.info(
                "links are accepted on %s only: instances on other machines cannot reach "
                "this one (--link-host 0.0.0.0 to accept them)",
                config.link_host,
            )
        # An earlier incarnation's ingress address is dead (its run process publishes the
        # new one once serving): left, it would name this instance for another's port.
        if config.replica is None:  # a replica's primary may be live elsewhere
            registry.clear_ingress_address(config.instance)
        coordinator = Coordinator(config, registry, files)
        node = None
        if config.replica is not None:
            node = await _start_replica(config, registry, files)
            coordinator.replicas = node
        try:
            info = registry.get(config.instance)
            # A first start, or replica 0 founding the instance again: what an attempt
            # that never committed its checkpoint left goes first.
            founding = node is not None and node.replica == 0 and node.disk.state.checkpoint is None
            if info is not None and info.last_checkpoint is None and (node is None or founding):
                clear_interrupted_first_start(
                    files, info.committer_id, config.registry, config.cluster
                )
            return await _with_signals(asyncio.create_task(coordinator.run(ready)), coordinator)
        except CorruptLogError as exc:
            raise CoordinatorError(f"recovery stopped: {exc}") from None
        except PortTakenError as exc:  # its receive, send or link port
            why = cannot_listen(exc, config.data_dir, registry, config.instance)
            raise CoordinatorError(why) from None
        except BindingLeftError as exc:
            # Not the coordinator's error to report: a line of its own here would come
            # before the binding's, which names the cause, and read as the cause.
            log.info("%s; stopping", exc)
            return 1
        finally:
            if node is not None:
                await node.close()
                node.election.close()
            coordinator.files.release_lock()
    finally:
        registry.close()


def _say_group(config: CoordinatorConfig, flags: Group, group: Group) -> None:
    """Say where the group the replica runs in differs from what its flags say: the
    registry's counts (the flags, at an instance's first start only)."""
    assert config.replica is not None
    if (group.replicas, group.k) != (flags.replicas, flags.k):
        log.info(
            "the group of %r is %s, as the registry holds it (--replicas and "
            "--replication-ack count at its first start only; ambrosia-py group changes it)",
            config.instance,
            group.describe(),
        )
    if config.replica not in group.members:
        log.info(
            "replica %d is not of the group of %r: it waits, taking no part, until a change "
            "adds it (ambrosia-py group --instance %s --members ...)",
            config.replica,
            config.instance,
            config.instance,
        )


async def _start_replica(
    config: CoordinatorConfig, registry: InstanceRegistry, files: InstanceFiles
) -> ReplicaNode:
    """This replica's side of the replicated log, listening and registered."""
    from ..registry.primary import open_election
    from ..replicas.node import ReplicaNode
    from ..replication import Group
    from ..storage.replica_state import ReplicaState, load_replica_state

    assert config.replica is not None
    try:
        flags = Group.of(set(range(config.replicas)), config.replication_ack)
    except ValueError as exc:
        raise CoordinatorError(str(exc)) from None
    state = load_replica_state(files, replica=config.replica)
    election = open_election(registry)
    try:
        # The registry's group; a first start stores it, from the flags (or from the
        # group a replica-state file of an earlier release recorded).
        earlier = None if state is None else state.group
        first = flags if earlier is None else Group.of(set(range(earlier[0])), earlier[1])
        group = election.found_group(config.instance, first)
    except BaseException:
        election.close()
        raise
    _say_group(config, flags, group)
    if state is None:
        # An empty data dir. Once the instance was founded (the registry holds its first
        # checkpoint), it is a new machine or one that lost its disk: it may have
        # acknowledged records it no longer holds, so it recovers (new terms do not
        # count it) until it has caught up. Before, it is one of the replicas replica 0
        # waits for to found it: nothing was committed yet.
        info = registry.get(config.instance)
        founded = info is not None and info.last_checkpoint is not None
        state = ReplicaState(config.replica, 0, (), recovering=founded)
        if founded:
            log.info(
                "replica %d starts empty after %r was founded: it recovers (no new term "
                "counts it) until it has caught up",
                config.replica,
                config.instance,
            )
    node = ReplicaNode(
        instance=config.instance,
        group=group,
        files=files,
        state=state,
        election=election,
        settings=config.link_settings,
        upgrade_to=config.upgrade_version,
    )
    published = advertised_host(config.link_host, config.advertise_host)
    await node.start(config.link_host, config.replication_port, published)
    return node
