"""The rules every registry backend keeps, in one place: ports, versions, checkpoints.

Ports: a port given explicitly must not be used by another registered instance. A port
not given is allocated from :data:`PORT_RANGE`, which sits below Linux's default
ephemeral range (32768-60999) so outgoing connections never take it later; candidates are
tried from a random start (registries in other data directories cannot see ours), must be
unused by any registered instance, and must be bindable on 127.0.0.1 right now.

Each backend reads what it needs, applies these, and writes the result in one atomic
step (a SQLite transaction, an etcd transaction that fails if anything it read changed).
"""

from __future__ import annotations

import random
import socket

from .interface import RegistryError

__all__ = [
    "PORT_RANGE",
    "allocate",
    "bindable",
    "check_checkpoint",
    "check_committer_id",
    "check_port",
    "check_register",
    "check_version",
    "choose_ports",
]

PORT_RANGE = range(20000, 32768)


def bindable(port: int) -> bool:
    """Whether a listener could take ``port`` on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_port(port: int, what: str) -> None:
    if not 1 <= port <= 65535:
        raise RegistryError(f"{what} {port} is not a TCP port (1-65535)")


def check_version(version: int) -> None:
    if version < 0:
        raise RegistryError(f"version {version} is negative")


def check_committer_id(committer_id: int) -> None:
    if not -(2**31) <= committer_id < 2**31:
        raise RegistryError(f"committer id {committer_id} does not fit in 32 bits")


def check_checkpoint(
    name: str, version: int, checkpoint: int, log: int, recorded: int | None
) -> None:
    """Checkpoint numbers start at 1 and only grow: recording an older one than the
    registry has (``recorded``) is refused, since recovery would start from stale state."""
    if checkpoint < 1 or log < 1:
        raise RegistryError(f"checkpoint {checkpoint} / log {log}: numbers start at 1")
    if recorded is not None and recorded > checkpoint:
        raise RegistryError(
            f"instance {name!r} version {version} already committed checkpoint "
            f"{recorded}; refusing to go back to {checkpoint}"
        )


def allocate(taken: set[int], port_range: range) -> int:
    """A port from ``port_range`` not in ``taken`` and bindable on 127.0.0.1 now."""
    start = random.SystemRandom().randrange(len(port_range))
    for i in range(len(port_range)):
        port = port_range[(start + i) % len(port_range)]
        if port not in taken and bindable(port):
            return port
    raise RegistryError(f"no free loopback port left in {port_range.start}-{port_range.stop - 1}")


def choose_ports(
    name: str,
    existing: tuple[int, int] | None,
    receive_port: int | None,
    send_port: int | None,
    used: dict[int, str],
    port_range: range,
) -> tuple[int, int]:
    """The (receive, send) ports ``name`` registers with.

    ``existing``: its ports if registered; ``used``: every port of the *other* instances,
    to the instance using it. Explicit ports replace existing ones and must be free of
    other instances; missing ones are kept (existing instance) or allocated (new one).
    """
    for port, what in ((receive_port, "receive port"), (send_port, "send port")):
        if port is not None and port in used:
            raise RegistryError(
                f"{what} {port} for {name!r} is already used by instance "
                f"{used[port]!r}: give another --{what.replace(' ', '-')}, or none "
                "(a free one is allocated)"
            )
    if existing is not None:
        receive_port = existing[0] if receive_port is None else receive_port
        send_port = existing[1] if send_port is None else send_port
    taken = set(used) | {p for p in (receive_port, send_port) if p is not None}
    if receive_port is None:
        receive_port = allocate(taken, port_range)
        taken.add(receive_port)
    if send_port is None:
        send_port = allocate(taken, port_range)
    if receive_port == send_port:
        raise RegistryError(f"receive and send port of {name!r} must differ (both {receive_port})")
    return receive_port, send_port


def check_register(
    name: str, receive_port: int | None, send_port: int | None, version: int
) -> None:
    """The arguments of ``register``, before anything is read."""
    if not name:
        raise RegistryError("an instance needs a name")
    for port, what in ((receive_port, "receive port"), (send_port, "send port")):
        if port is not None:
            check_port(port, what)
    check_version(version)
