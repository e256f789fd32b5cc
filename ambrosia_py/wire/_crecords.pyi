"""Typed stub of the C accelerator for reading log records (see _crecords.c)."""

from collections.abc import Callable

from .messages import Buffer, Message
from .reader import RawRecord

def configure(header: type, raw: type, tail: type, watermark: type, trim: type, /) -> None: ...
def take_raws(
    data: Buffer,
    pos: int,
    consumed: int,
    on_disk: bool,
    verify: bool,
    committer: int | None,
    next_seq: int | None,
    max_record: int,
    limit: int,
    out: list[RawRecord],
    /,
) -> tuple[int, int | None, int | None]: ...
def take_calls(
    data: Buffer,
    pos: int,
    consumed: int,
    on_disk: bool,
    verify: bool,
    committer: int | None,
    next_seq: int | None,
    max_record: int,
    limit: int,
    decode: Callable[[memoryview, int, int, list[Message]], int],
    out: list[tuple[int, list[Message]]],
    /,
) -> tuple[int, int | None, int | None]: ...
def disk_to_wire(raw: Buffer, length: int, /) -> bytes: ...
