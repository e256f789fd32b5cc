"""Where logs are read from: one code path through ``pyarrow.fs`` for every kind of path.

A plain path (``data/``), a ``file://`` URI, ``hdfs://`` or ``s3://`` URIs (anything
``pyarrow.fs.FileSystem.from_uri`` takes, options such as ``?region=`` or
``?endpoint_override=`` included), or a path inside a ``pyarrow.fs.FileSystem`` given
explicitly: all are opened and listed through the same calls, so the reader that runs on
one machine runs unchanged on a Spark cluster whose executors read HDFS or object
storage.

A :class:`Location` pairs a file system with a path in it and says how a file is shown
(the ``log_file`` column, error messages): a local file as its absolute path, whether it
was named by a plain path, a ``file://`` URI or a local ``SubTreeFileSystem`` (so the
rows are the same whichever way it was named); another file system's file as a URI.
Locations pickle (pyarrow's file systems do), so they travel to Spark's workers with the
partitions.

PyArrow is imported only when a path is resolved: importing :mod:`ambrosia_py.spark`
needs neither PySpark nor PyArrow.
"""

from __future__ import annotations

import os
import posixpath
import re
from pathlib import Path
from typing import Any

import attrs

from ..extras import optional_import
from ..wire import logfile

__all__ = ["Location", "LogInput", "resolve"]

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _pafs() -> Any:
    return optional_import("pyarrow.fs", what="reading logs")


@attrs.frozen
class Location:
    """``path`` in ``filesystem``; ``prefix`` is put before it to show it (empty for local
    files, ``hdfs://host:port`` or ``s3://`` for others)."""

    filesystem: Any = attrs.field(repr=False, hash=False)  # compared by value, unhashable
    path: str
    prefix: str = ""

    @property
    def shown(self) -> str:
        """How the file is named in rows and errors (see the module docstring)."""
        local = _local_path(self.filesystem, self.path)
        return local if local is not None else self.prefix + self.path

    @property
    def name(self) -> str:
        return posixpath.basename(self.path.rstrip("/"))

    def child(self, name: str) -> Location:
        return attrs.evolve(self, path=posixpath.join(self.path, name))

    @property
    def parent(self) -> Location:
        return attrs.evolve(self, path=posixpath.dirname(self.path.rstrip("/")))

    def sibling(self, name: str) -> Location:
        return self.parent.child(name)

    def kind(self) -> str:
        """``file``, ``dir`` or ``missing`` (anything else reads as missing)."""
        ft = _pafs().FileType
        t = self.filesystem.get_file_info(self.path).type
        return "file" if t == ft.File else "dir" if t == ft.Directory else "missing"

    def data_size(self) -> int:
        """Where the records of the log file here end now (its size, less a live tail:
        :mod:`ambrosia_py.wire.logfile`)."""
        with self.open() as src:
            return src.data_size()

    def entries(self) -> list[tuple[str, str]]:
        """``(name, kind)`` of what the directory holds, by name; none if it is missing."""
        pafs = _pafs()
        selector = pafs.FileSelector(self.path, allow_not_found=True, recursive=False)
        try:
            infos = self.filesystem.get_file_info(selector)
        except (NotADirectoryError, FileNotFoundError):
            return []
        ft = pafs.FileType
        out = [
            (
                posixpath.basename(i.path.rstrip("/")),
                "file" if i.type == ft.File else "dir" if i.type == ft.Directory else "other",
            )
            for i in infos
        ]
        return sorted(out)

    def read_bytes(self) -> bytes | None:
        """The whole file, or ``None`` if it cannot be read (a missing sidecar index)."""
        try:
            with self.filesystem.open_input_file(self.path) as f:
                return bytes(f.read())
        except (OSError, ValueError):
            return None

    def open(self) -> LogInput:
        return LogInput(self)


class LogInput:
    """A file open for reads at offsets (``pread`` semantics: short at the end)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self._file = location.filesystem.open_input_file(location.path)

    def pread(self, size: int, at: int) -> bytes:
        if size <= 0:
            return b""
        return bytes(self._file.read_at(size, at))

    def size(self) -> int:
        return int(self._file.size())

    def data_size(self) -> int:
        """Where the records end (:meth:`Location.data_size`)."""
        return logfile.settled_data_end(self.pread, self._size_now)[0]

    def _size_now(self) -> int:
        """The size on disk now (an open file's ``size()`` is the one at open): a
        coordinator may be closing the log while it is read (``wire.logfile``)."""
        loc = self.location
        return int(loc.filesystem.get_file_info(loc.path).size)

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> LogInput:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _local_path(fs: Any, path: str) -> str | None:
    """The local absolute path of ``path`` in ``fs`` if ``fs`` is the local file system or
    a subtree of it; else ``None``."""
    pafs = _pafs()
    if isinstance(fs, pafs.LocalFileSystem):
        return path
    if isinstance(fs, pafs.SubTreeFileSystem):
        base = _local_path(fs.base_fs, fs.base_path)
        if base is not None:
            return posixpath.join(base, path.lstrip("/"))
    return None


def resolve(path: str | Path | Location, filesystem: Any = None) -> Location:
    """Where ``path`` is: in ``filesystem`` if given (a ``pyarrow.fs.FileSystem``), else a
    URI for ``FileSystem.from_uri``, else a local path (made absolute). A
    :class:`Location` is where it is already."""
    if isinstance(path, Location):
        return path
    pafs = _pafs()
    text = os.fspath(path)
    if filesystem is not None:
        if isinstance(filesystem, pafs.LocalFileSystem):
            text = os.path.abspath(text)
        return Location(filesystem, text, f"{filesystem.type_name}://")
    if _SCHEME.match(text):
        fs, inner = pafs.FileSystem.from_uri(text)
        if isinstance(fs, pafs.LocalFileSystem):
            return Location(fs, inner)
        scheme, rest = text.split("://", 1)
        authority = rest.split("/", 1)[0] if inner.startswith("/") else ""
        return Location(fs, inner, f"{scheme}://{authority}")
    return Location(pafs.LocalFileSystem(), os.path.abspath(text))
