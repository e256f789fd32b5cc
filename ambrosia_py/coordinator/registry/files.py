"""The registry and the instance files must agree: refuse to start when they cannot, rebuild.

The registry is the only record of which checkpoint is committed; an instance it does
not know looks new, and a new instance's first start clears its directory. So a lost
registry (deleted, emptied, unreadable) must never be taken for "no instances": before
a coordinator starts, :func:`open_registry_for_start` compares the registry with the
instance directories in the data directory and refuses, naming the files it would
otherwise have put at risk and the command that rebuilds the registry. The registry may
live elsewhere (etcd, or a SQLite file shared by data dirs:
:func:`.backends.open_registry`), and then it can hold history the data dir lacks: an
instance with a committed checkpoint but none of its files here is refused too, as it
would otherwise start afresh (it belongs where its files are, or with a copy of them).

``ambrosia-py registry rebuild`` (:func:`rebuild_registry`) recovers the registry from
the files: each ``<instance>_<version>`` directory holding logs or checkpoints names an
instance and a version; the newest checkpoint that reads as a coordinator checkpoint is
the last committed one, and its committer id is the instance's. What the files do not
hold is made anew: ports are allocated again, link addresses are published again by
each coordinator as it starts. A checkpoint file is written whole (temporary file, then
rename) and only then committed, so the newest whole one is safe to recover from even
if the crash came between the two.

Start-up also checks owners and tightens modes (:func:`prepare_start`): a data directory,
registry file or instance file another user owns is refused (:mod:`..storage.ownership`); then the
data directory, the registry files and the instance's directories and files lose group
and other permissions, logged once, before anything is read.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import time
from pathlib import Path

import attrs

from ..core.checkpoint import IcState, StateFormatError
from ..storage.errors import StorageError
from ..storage.files import InstanceFiles, log_data_size, log_numbers_in
from ..storage.modes import own_data_dir, tighten
from ..storage.ownership import OwnershipError, Trusted, check_owned
from .backends import open_registry, registry_file
from .interface import DEFAULT_CLUSTER, InstanceRegistry
from .store import RegistryError, registry_file_paths

__all__ = [
    "RebuiltInstance",
    "RegistryRefusal",
    "clear_interrupted_first_start",
    "instance_directories",
    "open_registry_for_start",
    "prepare_start",
    "rebuild_registry",
]

log = logging.getLogger("ambrosia_py.coordinator")

_VERSIONED = re.compile(r"(.+)_(0|[1-9][0-9]*)")
_HAS_STATE = re.compile(r"server(?:log|chkpt)[1-9][0-9]*")
_SHOWN = 6  # files named in a refusal; the rest are counted


class RegistryRefusal(RegistryError):
    """The registry cannot be trusted with the instance files present: start refused."""


def instance_directories(data_dir: Path) -> dict[str, dict[int, Path]]:
    """Per instance name, its version directories that hold logs or checkpoints."""
    found: dict[str, dict[int, Path]] = {}
    try:
        entries = sorted(os.scandir(data_dir), key=lambda e: e.name)
    except FileNotFoundError:
        return found
    for entry in entries:
        m = _VERSIONED.fullmatch(entry.name)
        if m is None or not entry.is_dir(follow_symlinks=False):
            continue
        if any(_HAS_STATE.fullmatch(name) for name in os.listdir(entry.path)):
            found.setdefault(m.group(1), {})[int(m.group(2))] = Path(entry.path)
    return found


def _state_files(dirs: list[Path]) -> list[Path]:
    return [d / name for d in dirs for name in sorted(os.listdir(d)) if _HAS_STATE.fullmatch(name)]


def _named(files: list[Path]) -> str:
    shown = ", ".join(str(f) for f in files[:_SHOWN])
    more = len(files) - _SHOWN
    return shown + (f" and {more} more" if more > 0 else "")


def _rebuild_hint(data_dir: Path, spec: str | None = None, cluster: str = DEFAULT_CLUSTER) -> str:
    where = "" if spec is None else f" --registry {spec}"
    if spec is not None and cluster != DEFAULT_CLUSTER:
        where += f" --cluster {cluster}"
    return (
        f"nothing was changed; recover the registry with "
        f"`ambrosia-py registry rebuild --data-dir {data_dir}{where}`"
    )


def _refuse_others(data_dir: Path, files: list[Path]) -> None:
    """Refuse a data dir another user owns (or could replace), or ``files`` in it of
    another user (:mod:`..storage.ownership`): their registry and checkpoints are not ours to
    read, their modes not ours to change. A missing data dir is made first, as the
    registry would make it."""
    try:
        own_data_dir(data_dir)
        check_owned(files, Trusted.DATA_FILE)
    except OwnershipError as exc:
        raise RegistryRefusal(str(exc)) from None


def _file_paths(data_dir: Path, spec: str | None) -> list[Path]:
    """The SQLite registry ``spec`` names and its side files; none for etcd."""
    try:
        path = registry_file(spec, data_dir)
    except RegistryError as exc:
        raise RegistryRefusal(str(exc)) from None
    return [] if path is None else registry_file_paths(path)


def open_registry_for_start(
    data_dir: Path,
    instance: str,
    spec: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
    *,
    replica: bool = False,
) -> InstanceRegistry:
    """The registry ``spec`` names (:func:`.backends.open_registry`; ``None``: the data
    dir's own), for starting ``instance`` with ``data_dir``; or a :class:`RegistryRefusal`.

    Refused: a data dir or registry file another user owns (:func:`_refuse_others`); a
    missing registry file while any instance's files are present (every instance sharing
    the directory is known only to it); a registry that cannot be read or reached; a
    registry that does not know ``instance`` while that instance's files are present;
    and a registry that holds a committed checkpoint of ``instance`` while this data dir
    has none of its current version's files (its history is elsewhere: a start here
    would not recover it, and must never begin it afresh). A replica (``replica``) is
    exempt from the last: a new one starts empty, and is sent a checkpoint by the others.
    """
    data_dir = Path(data_dir)
    paths = _file_paths(data_dir, spec)
    _refuse_others(data_dir, paths)
    present = instance_directories(data_dir)
    hint = _rebuild_hint(data_dir, spec, cluster)
    if paths and not paths[0].exists() and present:
        files = _state_files([d for versions in present.values() for d in versions.values()])
        raise RegistryRefusal(
            f"no registry {paths[0]}, but instance files are present: {_named(files)}; {hint}"
        )
    try:
        registry = open_registry(spec, data_dir, cluster)
        try:
            known = registry.get(instance)
        except BaseException:
            registry.close()
            raise
    except RegistryError as exc:
        if not paths:  # etcd: not reached, or refused us; nothing here is damaged
            raise RegistryRefusal(f"{exc}; nothing was changed") from None
        files = _state_files([d for versions in present.values() for d in versions.values()])
        where = f"; instance files present: {_named(files)}" if files else ""
        raise RegistryRefusal(
            f"{exc}{where}; move the damaged registry aside or rebuild it with "
            f"`ambrosia-py registry rebuild --data-dir {data_dir}"
            f"{'' if spec is None else f' --registry {spec}'}`"
        ) from None
    try:
        if known is None and instance in present:
            files = _state_files(list(present[instance].values()))
            raise RegistryRefusal(
                f"instance {instance!r} is not in the registry {registry.where}, but its "
                f"files are present: {_named(files)}; starting it would take it for a new "
                f"instance; {hint}"
            )
        if (
            not replica
            and known is not None
            and known.last_checkpoint is not None
            and known.current_version not in present.get(instance, {})
        ):
            here = data_dir / f"{instance}_{known.current_version}"
            raise RegistryRefusal(
                f"instance {instance!r} has history in the registry {registry.where} "
                f"(version {known.current_version}, checkpoint {known.last_checkpoint}) but "
                f"no logs or checkpoints in {here}: start it with the data dir that holds "
                f"them, or a copy of it; it is never started afresh over its history"
            )
    except BaseException:
        registry.close()
        raise
    return registry


def prepare_start(
    data_dir: Path,
    instance: str,
    spec: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
    *,
    replica: bool = False,
) -> InstanceRegistry:
    """Refuse what another user owns, tighten the modes of what ``instance``'s coordinator
    owns, then open the registry ``spec`` names for its start (:func:`open_registry_for_start`).

    Refusing comes first: another user's data dir is never made ours by changing its
    mode, and its registry and checkpoints (pickled state) are never read.
    """
    data_dir = Path(data_dir)
    _refuse_others(data_dir, [])  # before anything in it is listed
    paths = [data_dir, *_file_paths(data_dir, spec)]
    for name in sorted(os.listdir(data_dir)):
        m = _VERSIONED.fullmatch(name)
        if m is not None and m.group(1) == instance:
            paths += InstanceFiles(data_dir, instance, int(m.group(2))).owned_paths()
    _refuse_others(data_dir, paths[1:])
    changed, failed = tighten(paths)
    if changed:
        listed = ", ".join(f"{p} ({mode:o})" for p, mode in changed[:_SHOWN])
        more = f" and {len(changed) - _SHOWN} more" if len(changed) > _SHOWN else ""
        log.warning(
            "took group and other permissions off %d paths (files are 0600, directories "
            "0700): %s%s",
            len(changed),
            listed,
            more,
        )
    if failed:
        log.warning("could not tighten the modes of: %s", "; ".join(failed))
    return open_registry_for_start(data_dir, instance, spec, cluster, replica=replica)


def clear_interrupted_first_start(
    files: InstanceFiles,
    committer_id: int | None,
    spec: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> None:
    """Before a first start: remove what an interrupted first start left, refuse the rest.

    A first start writes log 1 (record 0) and checkpoint 1 under the committer id it put
    in the registry, and commits checkpoint 1 last; a crash before the commit leaves those
    two files, which nothing was told about and the next first start replaces. Anything
    else (other numbers, another committer, a registry with no committer id) is history
    of an instance the registry lost track of: refused, naming the files, never removed.
    """
    logs, checkpoints = files.log_numbers(), files.checkpoint_numbers()
    if not logs and not checkpoints:
        return
    present = _state_files([files.path])
    why = None
    if committer_id is None:
        why = "the registry has no committer id for it"
    elif set(logs) - {1} or set(checkpoints) - {1}:
        why = "they are more than an interrupted first start leaves (log 1, checkpoint 1)"
    elif logs and _log_committer(files) not in (None, committer_id):
        why = f"log 1 was written by committer {_log_committer(files)}, not {committer_id}"
    elif checkpoints:
        try:
            state = IcState.decode(files.read_checkpoint(1), str(files.checkpoint_path(1)))
        except (StateFormatError, StorageError) as exc:
            why = f"checkpoint 1 does not read ({exc})"
        else:
            if state.committer_id != committer_id:
                why = f"checkpoint 1 is committer {state.committer_id}'s, not {committer_id}'s"
    if why is not None:
        raise RegistryRefusal(
            f"instance {files.instance!r} version {files.version} has no committed checkpoint "
            f"in the registry, but files are present ({_named(present)}) and {why}; "
            f"{_rebuild_hint(files.data_dir, spec, cluster)}"
        )
    for path in present:
        path.unlink()
    log.info("removed what an interrupted first start left: %s", _named(present))


@attrs.frozen
class RebuiltInstance:
    """What ``registry rebuild`` registered for one instance."""

    name: str
    version: int
    checkpoint: int | None
    committer_id: int | None
    receive_port: int
    send_port: int
    skipped: tuple[str, ...]  # checkpoints that did not read, with why


def _newest_checkpoint(files: InstanceFiles) -> tuple[int | None, int | None, list[str]]:
    """The newest checkpoint that reads as a coordinator checkpoint, its committer id, and
    the newer ones that did not read."""
    skipped = []
    for n in reversed(files.checkpoint_numbers()):
        path = files.checkpoint_path(n)
        try:
            state = IcState.decode(files.read_checkpoint(n), str(path))
        except (StateFormatError, StorageError) as exc:
            skipped.append(str(exc))
            continue
        return n, state.committer_id, skipped
    return None, None, skipped


def _log_committer(files: InstanceFiles) -> int | None:
    """The committer id in the first record header of the first log, if it has one."""
    numbers = log_numbers_in(files.path)
    if not numbers:
        return None
    path = files.log_path(numbers[0])
    if log_data_size(path) < 4:  # no record yet, perhaps only a live tail
        return None
    with path.open("rb") as f:
        head = f.read(4)
    return int(struct.unpack("<i", head)[0]) if len(head) == 4 else None


def _move_aside(paths: list[Path]) -> list[Path]:
    """Rename the registry and its side files to ``...damaged-<time>``; return the new names."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    moved = []
    for path in paths:
        if path.exists():
            target = path.with_name(f"{path.name}.damaged-{stamp}")
            os.replace(path, target)
            moved.append(target)
    return moved


def rebuild_registry(
    data_dir: Path, spec: str | None = None, cluster: str = DEFAULT_CLUSTER
) -> tuple[list[RebuiltInstance], list[Path]]:
    """Register every instance whose files are in ``data_dir`` and the registry ``spec``
    names (``None``: the data dir's own) lacks.

    Instances the registry knows are left as they are. An unreadable registry file is
    first moved aside (its bytes are kept, renamed ``registry.sqlite3.damaged-<UTC
    time>``); an etcd that cannot be reached is an error. Each instance version's lock is
    taken while its files are read, so this refuses to run beside a coordinator, and on a
    data dir another user owns (:mod:`..storage.ownership`).
    Returns the instances registered and the moved files.
    """
    data_dir = Path(data_dir)
    paths = _file_paths(data_dir, spec)
    _refuse_others(data_dir, paths)
    moved: list[Path] = []
    try:
        registry = open_registry(spec, data_dir, cluster)
    except RegistryError:
        if not paths:
            raise
        moved = _move_aside(paths)
        registry = open_registry(spec, data_dir, cluster)
    else:
        try:
            registry.instances()
        except RegistryError:
            registry.close()
            if not paths:
                raise
            moved = _move_aside(paths)
            registry = open_registry(spec, data_dir, cluster)
    rebuilt = []
    try:
        for name, versions in instance_directories(data_dir).items():
            if registry.get(name) is not None:
                continue
            found: dict[int, int] = {}
            committers: dict[int, int | None] = {}
            skipped: list[str] = []
            for version in sorted(versions):
                files = InstanceFiles(data_dir, name, version)
                files.acquire_lock()
                try:
                    checkpoint, committer, bad = _newest_checkpoint(files)
                    skipped += bad
                    if checkpoint is not None:
                        found[version] = checkpoint
                    committers[version] = committer or _log_committer(files)
                finally:
                    files.release_lock()
            # The current version: the newest with a checkpoint (an upgrade commits the
            # new version's checkpoint 1 before it moves the instance over), else the
            # newest there is (a first start that never committed one).
            current = max(found) if found else max(versions)
            info = registry.restore(name, current, committers[current], found)
            rebuilt.append(
                RebuiltInstance(
                    name,
                    current,
                    found.get(current),
                    info.committer_id,
                    info.receive_port,
                    info.send_port,
                    tuple(skipped),
                )
            )
    finally:
        registry.close()
    return rebuilt, moved
