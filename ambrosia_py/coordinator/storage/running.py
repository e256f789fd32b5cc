"""Whether a coordinator runs an instance version now: its lock, tested without taking it.

Apart from :mod:`.data_dir` (which re-exports it) because the SQLite registry asks it too,
and :mod:`.data_dir` opens registries.
"""

from __future__ import annotations

import errno
import fcntl
import os

from .files import LOCK_FILE, InstanceFiles

__all__ = ["running_pid"]


def running_pid(files: InstanceFiles) -> int | None:
    """The pid of the coordinator running this instance version, or None if none runs.

    Tests the coordinator's lock without keeping it, and writes nothing: a shared lock
    is refused while a coordinator holds its exclusive one. 0: the lock is held but the
    file names no pid.
    """
    path = files.path / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            return int(text) if text.isdigit() else 0
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
