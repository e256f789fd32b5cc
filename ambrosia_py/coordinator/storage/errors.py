"""The errors of the coordinator's on-disk storage: one :class:`StorageError` hierarchy.

Shared by :mod:`.files` (files, writer, lock) and :mod:`.scan` (log verification).
They live here, not in storage, because storage imports logscan: the scan must not import
storage back.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CorruptLogError", "InstanceLockedError", "StorageError"]


class StorageError(Exception):
    """A failure of the coordinator's on-disk storage."""


class CorruptLogError(StorageError):
    """A log record that fails verification and is not a torn tail.

    ``offset`` is where the bad record starts in ``path``; ``seq`` the sequence id its header
    states, or (when its header is incomplete) the one expected there.
    """

    def __init__(self, path: Path, offset: int, seq: int | None, reason: str) -> None:
        where = f"{path} at offset {offset}"
        if seq is not None:
            where += f", record seq {seq}"
        super().__init__(f"corrupt log {where}: {reason}")
        self.path = path
        self.offset = offset
        self.seq = seq
        self.reason = reason


class InstanceLockedError(StorageError):
    """Another process (a running coordinator) holds the instance version's lock."""

    def __init__(self, instance: str, version: int, pid: int | None, path: Path) -> None:
        holder = f"pid {pid}" if pid is not None else "a process whose pid is not recorded"
        super().__init__(f"instance {instance!r} version {version} is locked by {holder} ({path})")
        self.instance = instance
        self.version = version
        self.pid = pid
        self.path = path
