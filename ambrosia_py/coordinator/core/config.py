"""How a coordinator is run: its settings, what it stops with, and its version and ports."""

from __future__ import annotations

from pathlib import Path

import attrs

from ..links.config import LinkSettings
from ..registry.interface import DEFAULT_CLUSTER, InstanceRegistry
from ..registry.store import Registry
from .binding_auth import BindingAuth

__all__ = [
    "print_ready",
    "DEFAULT_LOG_TRIGGER_MB",
    "DEFAULT_MAX_PENDING_MB",
    "DEFAULT_MAX_RECORD_BYTES",
    "CoordinatorConfig",
    "CoordinatorError",
    "resolve_start",
]

DEFAULT_LOG_TRIGGER_MB = 1000  # the released coordinator's default
DEFAULT_MAX_RECORD_BYTES = 16 * 1024 * 1024
# Input pending for the log past which its readers wait (TCP then slows the senders): a
# bound on memory, independent of the largest record, since a message read whole still
# goes in past it.
DEFAULT_MAX_PENDING_MB = 8.0


class CoordinatorError(Exception):
    """A condition that stops the coordinator; the message says what and where."""


class BindingLeftError(CoordinatorError):
    """The binding went away during start-up, before this start's first checkpoint: it
    failed (and says why itself: a state that cannot be pickled, ...) or was killed.
    Nothing of this start is committed; the coordinator just stops."""


@attrs.frozen
class CoordinatorConfig:
    """How to run one coordinator."""

    data_dir: Path
    instance: str
    version: int | None = None
    receive_port: int | None = None
    send_port: int | None = None
    log_trigger_mb: float = DEFAULT_LOG_TRIGGER_MB
    upgrade_version: int | None = None
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
    max_pending_mb: float = DEFAULT_MAX_PENDING_MB
    host: str = "127.0.0.1"
    # How the binding proves it was started for this coordinator (binding_auth.py).
    binding_auth: BindingAuth = BindingAuth.TOKEN
    # Links to other instances' coordinators: where this one accepts them (port 0: any
    # free port), and addresses of instances the registry does not know (other machines).
    link_host: str = "127.0.0.1"
    link_port: int = 0
    link_to: tuple[tuple[str, str, int], ...] = ()
    # The host published for the link address (registry/publish.py; None: chosen from
    # link_host).
    advertise_host: str | None = None
    # The links' secret, TLS and limits (link_config.py).
    link_settings: LinkSettings = LinkSettings()
    # The registry (registry/backends.py: None for the data dir's own SQLite file, a
    # file path, or etcd:// endpoints) and the cluster, its etcd key prefix.
    registry: str | None = None
    cluster: str = DEFAULT_CLUSTER
    # Replicas (coordinator/replicas): this one's number (None: standalone), how many the
    # instance has, the replication ack (None: a majority), and where the others reach it.
    replica: int | None = None
    replicas: int = 3
    replication_ack: int | None = None
    replication_port: int = 0


def resolve_start(
    config: CoordinatorConfig, registry: InstanceRegistry | Registry
) -> tuple[int, int, int]:
    """Version and ports: the registry's, registering the instance on first use."""
    info = registry.get(config.instance)
    if info is None:
        info = registry.register(
            config.instance,
            receive_port=config.receive_port,
            send_port=config.send_port,
            version=config.version or 0,
        )
    if config.version is not None and config.version != info.current_version:
        raise CoordinatorError(
            f"instance {config.instance!r} is at version {info.current_version}, not "
            f"{config.version}; use --upgrade-version to move to a new version"
        )
    upgrade = config.upgrade_version
    if upgrade is not None and upgrade <= info.current_version:
        # Its binding would replay the records of that version with the old code.
        raise CoordinatorError(
            f"instance {config.instance!r} is at version {info.current_version} already: "
            f"--upgrade-version {upgrade} is done (or older); start it without "
            "--upgrade-version and --upgrade-from"
        )
    return (
        info.current_version,
        config.receive_port or info.receive_port,
        config.send_port or info.send_port,
    )


def print_ready(line: str) -> None:
    """How a coordinator says it is ready, by default: the line on stdout, flushed."""
    print(line, flush=True)
