"""The errors of the log reader; each names the file and, when known, the offset and seq."""

from __future__ import annotations

from pathlib import Path

__all__ = ["LogDamageError", "LogFormatError", "LogReadError", "NoLogsError"]


class LogReadError(ValueError):
    """A log could not be read as asked. ``path``, ``offset`` and ``seq`` say where."""

    def __init__(
        self, path: Path | str, reason: str, *, offset: int | None = None, seq: int | None = None
    ) -> None:
        where = [str(path)]
        if offset is not None:
            where.append(f"offset {offset}")
        if seq is not None:
            where.append(f"seq {seq}")
        super().__init__(f"{', '.join(where)}: {reason}")
        self.path = str(path)
        self.reason = reason
        self.offset = offset
        self.seq = seq


class LogDamageError(LogReadError):
    """A damaged record or region, with ``on_damage=fail`` (by default it becomes a row with
    ``check_ok`` false)."""


class LogFormatError(LogReadError):
    """Bytes that verify but do not read as AMBROSIA messages, or a split that does not fall
    on a record: not damage, a log this reader does not understand."""


class NoLogsError(LogReadError):
    """The path holds no log files."""
