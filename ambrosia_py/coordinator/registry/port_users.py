"""A port that could not be listened on, said in one line: which, who holds it, what to do.

The kernel says only "Address already in use". The registry knows which ports its
instances use (their receive and send ports, and where running ones accept links and
ingress calls) and whether each runs: with the SQLite registry, an instance's lock says
so (:func:`..storage.running.running_pid`), and the line names its coordinator's pid;
with etcd, an instance runs while its addresses live, and a port counts as held here
when they were published from this machine. A port held by another program, or by an
instance of another data dir or registry, is said to be so.
"""

from __future__ import annotations

import errno
import os
import socket
from pathlib import Path

from ..storage.files import InstanceFiles
from ..storage.running import running_pid
from .interface import InstanceRegistry
from .sqlite import SqliteRegistry
from .store import REGISTRY_FILE, Registry, RegistryError

__all__ = ["PortTakenError", "cannot_listen", "holder"]


class PortTakenError(OSError):
    """Listening on ``host``:``port`` (the ``what``: "receive port", ...) failed."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        why = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot listen on the {what} {host}:{port}: {why}")
        self.what = what
        self.host = host
        self.port = port


def holder(
    data_dir: Path,
    port: int,
    registry: InstanceRegistry | None = None,
    instance: str | None = None,
) -> str | None:
    """The running instance of ``data_dir``'s registry that uses ``port``, in words, or
    None if none does or the registry cannot tell; ``instance`` is the one starting
    (said so if it is the holder: it runs already). The calling process itself, a
    coordinator holding its own instance's lock, is never the holder. Opens no registry
    that is not there (creates nothing)."""
    try:
        if registry is None:
            if not (Path(data_dir) / REGISTRY_FILE).is_file():
                return None
            with SqliteRegistry(data_dir) as reg:
                return _running_user(reg, data_dir, port, instance)
        return _running_user(registry, data_dir, port, instance)
    except (RegistryError, OSError):  # the error being reported matters more
        return None


def _running_user(
    registry: InstanceRegistry, data_dir: Path, port: int, instance: str | None
) -> str | None:
    for name, what, host in registry.port_users(port):
        info = registry.get(name)
        if info is None:
            continue
        if isinstance(registry, Registry):  # SQLite: the instance's lock says it runs
            pid = running_pid(InstanceFiles(Path(data_dir), name, info.current_version))
        else:  # etcd: its addresses live, published from this machine
            live = registry.addresses(name)
            here = not live.empty and live.host_name == socket.gethostname()
            pid = 0 if here else None
        if pid is None or pid == os.getpid():  # stopped (its ports reserved), or us
            continue
        who = f"coordinator pid {pid}" if pid else "running"
        if name == instance:
            return f"instance {name!r} runs already ({who}; its {what} is there)"
        return f"instance {name!r} ({who}) has its {what} there ({host}:{port})"
    return None


# What to do about each port in use, by the option that sets it.
_FIX = {
    "receive port": "stop it, or give --receive-port another port",
    "send port": "stop it, or give --send-port another port",
    "link port": "stop it, or give --link-port another port (or none: any free one)",
    "ingress": "stop it, or give --ingress another port (0: any free one)",
}


def cannot_listen(
    exc: PortTakenError,
    data_dir: Path,
    registry: InstanceRegistry | None = None,
    instance: str | None = None,
) -> str:
    """One line for a listener of ``instance`` that failed: the address, the kernel's
    reason, and for a port in use who holds it and what to do. (``registry``: the one of
    ``data_dir`` the caller has open already.)"""
    why = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.what == "ingress":  # the run process's
        line = f"the ingress cannot listen on {exc.host}:{exc.port}: {why}"
    else:
        line = f"the coordinator cannot listen on its {exc.what} {exc.host}:{exc.port}: {why}"
    if exc.errno != errno.EADDRINUSE:
        return line
    holding = holder(data_dir, exc.port, registry, instance)
    if holding is None:
        holding = (
            f"no running instance of the data dir {data_dir} uses it (another program "
            "does, or an instance of another data dir)"
        )
    return f"{line}; {holding}: {_FIX.get(exc.what, 'stop it, or choose another port')}"
