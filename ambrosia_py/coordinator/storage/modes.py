"""File and directory modes: everything the coordinator keeps is for its owner alone.

Logs hold every call's arguments and checkpoints a service's whole state, so the files
the coordinator creates are 0600 and its directories 0700. The modes are set explicitly
at creation (``os.open``/``mkdir`` with the mode, then ``fchmod``/``chmod``), so a
permissive umask cannot loosen them; :func:`tighten` repairs data directories written
before this rule (or by hand) and reports what it changed, so the caller can log it once.
It changes only what we own (:mod:`.ownership` refuses the rest first).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from .ownership import Trusted, check_data_dir, check_way, owner_name

__all__ = [
    "PRIVATE_DIR",
    "PRIVATE_FILE",
    "create_private",
    "fsync_dir",
    "make_private_dir",
    "own_data_dir",
    "tighten",
]

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
# A FIFO opens at once and a link not at all (ELOOP); the file is only fstat'ed and fchmod'ed.
_NO_FOLLOW_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def make_private_dir(path: Path) -> bool:
    """Create ``path`` and any missing parents, each 0700; return whether it was created.

    The parent of each created directory is fsynced, so the new entry survives a crash.
    An existing directory is left as it is (see :func:`tighten`).
    """
    if path.is_dir():
        return False
    missing = []
    at = path
    while not at.exists():
        missing.append(at)
        if at.parent == at:
            break
        at = at.parent
    for directory in reversed(missing):
        try:
            directory.mkdir(PRIVATE_DIR)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # created meanwhile by another process sharing the data dir
        os.chmod(directory, PRIVATE_DIR)  # mkdir's mode is filtered by the umask
        fsync_dir(directory.parent)
    return True


def own_data_dir(path: Path) -> None:
    """Make the data dir ``path`` if it is missing (0700), but never under a directory
    another user controls, and check that it is ours; an existing one is checked and
    never changed. :class:`~.ownership.OwnershipError` says what is wrong."""
    if not os.path.lexists(path):
        check_way(path, Trusted.DATA_DIR)
        make_private_dir(path)
    check_data_dir(path)


def create_private(path: Path, flags: int) -> int:
    """``os.open(path, flags | O_CREAT, 0o600)``, the mode forced with ``fchmod``.

    The kernel filters a new file's mode through the umask, which can only take bits away;
    ``fchmod`` makes the mode exactly 0600 whatever the umask. An existing file with group
    or other bits loses them too.
    """
    fd = os.open(path, flags | os.O_CREAT, PRIVATE_FILE)
    try:
        if stat.S_IMODE(os.fstat(fd).st_mode) & 0o077:
            os.fchmod(fd, PRIVATE_FILE)
    except BaseException:
        os.close(fd)
        raise
    return fd


def tighten(paths: Iterable[Path]) -> tuple[list[tuple[Path, int]], list[str]]:
    """Take group and other permissions off each existing path (files 0600, dirs 0700).

    Returns the paths changed with their old modes, and the failures as readable lines.
    Only our own paths are changed: each is opened without following a link and its
    owner checked on the open file before ``fchmod``, so another user's file (which
    :func:`.registry_files.prepare_start` refuses before this) is never made ours, even
    if it took a name's place meanwhile.
    """
    changed: list[tuple[Path, int]] = []
    failed: list[str] = []
    me = os.geteuid()
    for path in paths:
        try:
            fd = os.open(path, _NO_FOLLOW_FLAGS)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno != errno.ELOOP:  # ELOOP: a link, never followed out of the data dir
                failed.append(f"{path}: {exc.strerror}")
            continue
        try:
            st = os.fstat(fd)
            if st.st_uid != me:
                failed.append(f"{path}: owned by {owner_name(st.st_uid)}, left as it is")
                continue
            mode = stat.S_IMODE(st.st_mode)
            want = PRIVATE_DIR if stat.S_ISDIR(st.st_mode) else PRIVATE_FILE
            if mode & ~want & 0o777 == 0:
                continue
            os.fchmod(fd, mode & want)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
            continue
        finally:
            os.close(fd)
        changed.append((path, mode))
    return changed, failed


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (a created, renamed or removed file) durable."""
    fd = os.open(path, _DIR_FLAGS)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
