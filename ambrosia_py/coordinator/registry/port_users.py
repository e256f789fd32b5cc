"""A port that could not be listened on, said in one line: which, who holds it, what to do.

The kernel says only "Address already in use". The registry of the data dir knows which
ports its instances use (their receive and send ports, and where running ones accept
links and ingress calls), and an instance's lock says whether it runs
(:func:`.data_dir.running_pid`); so when a running instance of this data dir holds the
port, the line names it and its coordinator's pid. A port held by another program, or
by an instance of another data dir, is said to be so.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from ..storage.data_dir import running_pid
from ..storage.files import InstanceFiles
from .store import REGISTRY_FILE, Registry, RegistryError

__all__ = ["PortTakenError", "cannot_listen", "holder", "publish_ingress"]

log = logging.getLogger("ambrosia_py.coordinator")


class PortTakenError(OSError):
    """Listening on ``host``:``port`` (the ``what``: "receive port", ...) failed."""

    def __init__(self, what: str, host: str, port: int, cause: OSError) -> None:
        why = cause.strerror or str(cause)
        super().__init__(cause.errno, f"cannot listen on the {what} {host}:{port}: {why}")
        self.what = what
        self.host = host
        self.port = port


def holder(
    data_dir: Path, port: int, registry: Registry | None = None, instance: str | None = None
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
            with Registry(data_dir) as reg:
                return _running_user(reg, data_dir, port, instance)
        return _running_user(registry, data_dir, port, instance)
    except (RegistryError, OSError):  # the error being reported matters more
        return None


def _running_user(
    registry: Registry, data_dir: Path, port: int, instance: str | None
) -> str | None:
    for name, what, host in registry.port_users(port):
        info = registry.get(name)
        if info is None:
            continue
        pid = running_pid(InstanceFiles(Path(data_dir), name, info.current_version))
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
    registry: Registry | None = None,
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


def publish_ingress(data_dir: Path, instance: str, address: tuple[str, int] | None) -> None:
    """Record where ``instance``'s ingress listens (None: that it stopped), for
    :func:`holder`. Best effort: the ingress serves whether or not it is recorded."""
    try:
        with Registry(data_dir) as registry:
            if address is None:
                registry.clear_ingress_address(instance)
            else:
                registry.set_ingress_address(instance, *address)
    except (RegistryError, OSError) as exc:
        log.info("the ingress address of %r is not in the registry: %s", instance, exc)
