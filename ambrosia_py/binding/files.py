"""Files beside an instance's checkpoints, for state too large to pickle whole.

An immortal whose state grows without bound (a stream hub holding millions of messages)
must not pickle all of it into every checkpoint. It can instead keep *sealed*, immutable
pieces of its state in content-addressed files: while a checkpoint is pickled, a sealed
piece writes its file once (``fsync``, then an atomic rename) and pickles as a reference
(its hash); a restored reference reads its file back when it is first used. A checkpoint
then costs what changed since the last one, plus a few bytes per sealed piece.

The place of those files is not state: it is set for the running binding by whoever
starts it (``ambrosia-py run``, the pytest runner, ``ambrosia-py replay``) with
:func:`use_state_files`, and read by the pieces with :func:`current_state_files`.
``ambrosia-py replay`` sets it read-only: replay reads the files and writes nothing.
Without a place set, sealed pieces pickle their bytes inline (correct, only larger).
Handlers never write these files; pickling does, outside the determinism boundary.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

from ..coordinator.storage.modes import fsync_dir

__all__ = [
    "StateFiles",
    "current_state_files",
    "state_files_dir",
    "sync_written",
    "use_state_files",
]


@attrs.frozen
class StateFiles:
    """Where sealed state lives for one instance, and whether this process may write it."""

    path: Path
    writable: bool = True

    def file(self, name: str) -> Path:
        return self.path / name

    def read(self, name: str) -> bytes:
        """The bytes of a sealed file (a missing file is an error naming it)."""
        try:
            return (self.path / name).read_bytes()
        except FileNotFoundError:
            raise FileNotFoundError(
                f"sealed state file {self.path / name} is missing: the checkpoint refers to it"
            ) from None

    def write_once(self, name: str, data: bytes | bytearray | memoryview) -> bool:
        """Write ``name`` durably unless it exists (content-addressed: same name, same bytes).

        Returns whether it was written. The file is written under a temporary name,
        fsynced, then renamed, so a crash leaves either no file or the whole file (mode
        0600, directory 0700). The directory is fsynced by :func:`sync_written`, once
        for all the files a checkpoint wrote, before the checkpoint leaves the binding.
        """
        target = self.path / name
        if target.exists():
            return False
        if not self.writable:
            raise PermissionError(f"sealed state files in {self.path} are read-only here")
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path / f".{name}.{os.getpid()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
        _unsynced.add(self.path)  # the rename is durable once the directory is synced
        return True


_current: contextvars.ContextVar[StateFiles | None] = contextvars.ContextVar(
    "ambrosia_state_files", default=None
)


_unsynced: set[Path] = set()  # directories with renames not yet made durable


def sync_written() -> None:
    """Make the files written since the last call durable: fsync their directories."""
    while _unsynced:
        fsync_dir(_unsynced.pop())


def state_files_dir(data_dir: Path, instance: str) -> Path:
    """The one place an instance's sealed state lives inside a data directory."""
    return data_dir / f"{instance}.files"


def current_state_files() -> StateFiles | None:
    """The sealed-state files of the binding running in this context, if any."""
    return _current.get()


@contextmanager
def use_state_files(files: StateFiles | None) -> Iterator[None]:
    """Set the sealed-state files for code run in this context (and tasks it starts)."""
    token = _current.set(files)
    try:
        yield
    finally:
        _current.reset(token)
