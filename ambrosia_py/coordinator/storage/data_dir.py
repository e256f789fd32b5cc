"""The data directory as the commands see it: the checks that keep it from being a trap.

Every command that works on a data directory takes ``--data-dir``, else
``$AMBROSIA_DATA_DIR``, else ``./ambrosia-data`` (the option: ``cli/options.py``). A
relative default means a service run from another directory, or with a misspelled path,
finds no history and starts from empty state; so ``run`` says on every start which
directory it uses and where the choice came from, and says loudly when an instance
starts for the first time. Commands that only read (``instances``, ``debug``) refuse a
data directory that does not exist and create nothing in it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import attrs

from ...hashseed import DATA_DIR_ENV, DEFAULT_DATA_DIR
from ..registry.backends import open_registry, registry_file
from ..registry.files import open_registry_for_start
from ..registry.interface import DEFAULT_CLUSTER, InstanceInfo, RegistryError
from .files import InstanceFiles
from .modes import own_data_dir
from .ownership import OwnershipError, check_data_dir
from .running import running_pid

__all__ = [
    "DATA_DIR_ENV",
    "DEFAULT_DATA_DIR",
    "DataDirError",
    "History",
    "debuggable_instance",
    "earlier_history",
    "existing_data_dir",
    "running_pid",
    "writable_data_dir",
]


class DataDirError(Exception):
    """A data directory a command cannot use; the message names it and says why."""


def writable_data_dir(data_dir: Path) -> None:
    """Create ``data_dir`` if missing (0700), check it is ours (:mod:`.ownership`) and
    prove it can be written, or raise :class:`DataDirError` saying which directory and why."""
    try:
        own_data_dir(data_dir)
        fd, probe = tempfile.mkstemp(prefix=".ambrosia-write-test-", dir=data_dir)
        os.close(fd)
        os.unlink(probe)
    except OwnershipError as exc:
        raise DataDirError(str(exc)) from None
    except OSError as exc:
        why = exc.strerror or str(exc)
        where = f" ({exc.filename})" if exc.filename and Path(exc.filename) != data_dir else ""
        raise DataDirError(
            f"cannot write to the data dir {data_dir}: {why}{where}; give a directory you "
            f"can write with --data-dir or ${DATA_DIR_ENV}"
        ) from exc


def existing_data_dir(
    data_dir: Path, *, need_registry: bool = True, spec: str | None = None
) -> None:
    """Refuse a data directory that does not exist, is not ours (:mod:`.ownership`), or
    (``need_registry``) has no registry file (the data dir's own, or the SQLite file
    ``spec`` names; etcd has none to look for); creating nothing."""
    if not os.path.lexists(data_dir):
        raise DataDirError(
            f"no data dir {data_dir} (from {Path.cwd()}): nothing has run with it; give the "
            f"one the service runs with, with --data-dir or ${DATA_DIR_ENV}"
        )
    try:  # before following it: its checkpoints are unpickled, so it must be ours
        check_data_dir(data_dir)
    except OwnershipError as exc:
        raise DataDirError(str(exc)) from None
    if not need_registry:
        return
    try:
        path = registry_file(spec, data_dir)
    except RegistryError as exc:
        raise DataDirError(str(exc)) from None
    if path is not None and not path.exists():
        if spec is None:
            raise DataDirError(f"no registry in {data_dir}: no instance has run with this data dir")
        raise DataDirError(f"no registry {path}: no instance has run with it")


@attrs.frozen
class History:
    """What an instance has in a data directory before a start."""

    version: int
    checkpoint: int  # the last committed checkpoint: recovery starts there


def earlier_history(
    data_dir: Path, instance: str, spec: str | None = None, cluster: str = DEFAULT_CLUSTER
) -> History | None:
    """The instance's committed history in the registry ``spec`` names (``None``: the data
    dir's own), or None when there is none (a start would be its first). Creates no
    registry file; a registry that cannot be read or reached counts as none here (the
    coordinator refuses it with its own message)."""
    try:
        path = registry_file(spec, data_dir)
        if path is not None and not path.is_file():
            return None
        with open_registry(spec, data_dir, cluster) as reg:
            info = reg.get(instance)
    except RegistryError:
        return None
    if info is None or info.last_checkpoint is None:
        return None
    return History(info.current_version, info.last_checkpoint)


def debuggable_instance(
    data_dir: Path, instance: str, spec: str | None = None, cluster: str = DEFAULT_CLUSTER
) -> InstanceInfo:
    """The registry's entry for ``instance``, which ``debug`` may replay: the data dir
    exists, the registry ``spec`` names reads and knows it, and no coordinator runs it
    from this data dir (its port would be taken, and its log may grow under the
    replay). Creates nothing."""
    existing_data_dir(data_dir, spec=spec)
    try:
        registry = open_registry_for_start(data_dir, instance, spec, cluster)
    except RegistryError as exc:
        raise DataDirError(str(exc)) from None
    try:
        info = registry.get(instance)
        names = sorted(i.name for i in registry.instances())
    finally:
        registry.close()
    if info is None:
        raise DataDirError(
            f"no instance {instance!r} in {data_dir} (it has {', '.join(names) or 'none'})"
        )
    pid = running_pid(InstanceFiles(data_dir, instance, info.current_version))
    if pid is not None:
        holder = f"pid {pid}" if pid else "a process whose pid is not recorded"
        raise DataDirError(
            f"instance {instance!r} is running (its coordinator is {holder}): debug replays "
            "the history of a stopped instance; stop the service first"
        )
    return info
