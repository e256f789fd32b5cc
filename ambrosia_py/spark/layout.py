"""Finding log files: a data dir, one instance's log directory, or one log file.

The layout is the released AMBROSIA's (reference ambrosia.md, Files on disk), which is
also ours: ``<data dir>/<instance>_<version>/serverlog<N>``. The instance and version are
read from the directory's name; a log file outside such a directory still reads, with the
directory's name as instance and no version.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs

from .errors import NoLogsError
from .fs import Location, resolve

__all__ = ["LogFile", "find_logs"]

_LOG_NAME = re.compile(r"serverlog([1-9][0-9]*)")
_VERSIONED = re.compile(r"(.+)_(0|[1-9][0-9]*)")


@attrs.frozen
class LogFile:
    """One log file. ``last``: it is the newest log of its instance version, the one a
    running coordinator may still be appending to. ``path`` is how rows name it (the
    ``log_file`` column: an absolute local path, or a URI); ``location`` is where it is
    read (:mod:`.fs`)."""

    path: str
    instance: str | None
    version: int | None
    number: int  # N of serverlog<N>; 0 for a file named otherwise
    last: bool
    location: Location = attrs.field(eq=False, repr=False)


def _identity(name: str) -> tuple[str | None, int | None]:
    m = _VERSIONED.fullmatch(name)
    if m is None:
        return (name or None), None
    return m.group(1), int(m.group(2))


def _logs_in(directory: Location) -> list[LogFile]:
    names = [name for name, kind in directory.entries() if kind == "file"]
    numbers = sorted(int(m.group(1)) for n in names if (m := _LOG_NAME.fullmatch(n)))
    instance, version = _identity(directory.name)
    out = []
    for n in numbers:
        where = directory.child(f"serverlog{n}")
        out.append(LogFile(where.shown, instance, version, n, n == numbers[-1], where))
    return out


def find_logs(path: str | Path | Location, filesystem: Any = None) -> list[LogFile]:
    """The log files under ``path``, by instance, version and number.

    ``path`` is a log file, a directory holding ``serverlog<N>`` files, or a data dir whose
    ``<instance>_<version>`` directories hold them: a local path, a URI
    (``file://``, ``hdfs://``, ``s3://``, ...), or a path in ``filesystem`` (a
    ``pyarrow.fs.FileSystem``), all read through ``pyarrow.fs`` (:mod:`.fs`).
    """
    root = resolve(path, filesystem)
    kind = root.kind()
    if kind == "file":
        m = _LOG_NAME.fullmatch(root.name)
        if m is not None:
            for log in _logs_in(root.parent):
                if log.number == int(m.group(1)):
                    return [log]
        instance, version = _identity(root.parent.name)
        return [LogFile(root.shown, instance, version, 0, True, root)]
    if kind != "dir":
        raise NoLogsError(root.shown, "no such file or directory")
    found = _logs_in(root)
    if found:
        return found
    for name, entry_kind in root.entries():
        if entry_kind == "dir" and _VERSIONED.fullmatch(name):
            found += _logs_in(root.child(name))
    if not found:
        raise NoLogsError(
            root.shown, "no log files (serverlog<N>) here or in its <instance>_<version> dirs"
        )
    found.sort(key=lambda f: (f.instance or "", f.version or 0, f.number))
    return found
