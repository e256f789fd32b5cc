"""Finding log files: a data dir, one instance's log directory, or one log file.

The layout is the released AMBROSIA's (reference ambrosia.md, Files on disk), which is
also ours: ``<data dir>/<instance>_<version>/serverlog<N>``. The instance and version are
read from the directory's name; a log file outside such a directory still reads, with the
directory's name as instance and no version.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import attrs

from .errors import NoLogsError

__all__ = ["LogFile", "find_logs"]

_LOG_NAME = re.compile(r"serverlog([1-9][0-9]*)")
_VERSIONED = re.compile(r"(.+)_(0|[1-9][0-9]*)")


@attrs.frozen
class LogFile:
    """One log file. ``last``: it is the newest log of its instance version, the one a
    running coordinator may still be appending to."""

    path: str
    instance: str | None
    version: int | None
    number: int  # N of serverlog<N>; 0 for a file named otherwise
    last: bool


def _identity(directory: Path) -> tuple[str | None, int | None]:
    m = _VERSIONED.fullmatch(directory.name)
    if m is None:
        return (directory.name or None), None
    return m.group(1), int(m.group(2))


def _logs_in(directory: Path) -> list[LogFile]:
    try:
        names = os.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    numbers = sorted(int(m.group(1)) for n in names if (m := _LOG_NAME.fullmatch(n)))
    instance, version = _identity(directory)
    return [
        LogFile(
            str((directory / f"serverlog{n}").absolute()),
            instance,
            version,
            n,
            n == numbers[-1],
        )
        for n in numbers
    ]


def find_logs(path: str | Path) -> list[LogFile]:
    """The log files under ``path``, by instance, version and number.

    ``path`` is a log file, a directory holding ``serverlog<N>`` files, or a data dir whose
    ``<instance>_<version>`` directories hold them.
    """
    root = Path(path)
    if root.is_file():
        m = _LOG_NAME.fullmatch(root.name)
        if m is not None:
            for log in _logs_in(root.absolute().parent):
                if log.number == int(m.group(1)):
                    return [log]
        instance, version = _identity(root.absolute().parent)
        return [LogFile(str(root.absolute()), instance, version, 0, True)]
    if not root.is_dir():
        raise NoLogsError(root, "no such file or directory")
    found = _logs_in(root)
    if found:
        return found
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir(follow_symlinks=False) and _VERSIONED.fullmatch(entry.name):
            found += _logs_in(Path(entry.path))
    if not found:
        raise NoLogsError(
            root, "no log files (serverlog<N>) here or in its <instance>_<version> dirs"
        )
    found.sort(key=lambda f: (f.instance or "", f.version or 0, f.number))
    return found
