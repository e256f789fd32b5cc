"""The strict walk over one replication frame's fields, sans-IO: each read checks its
bounds and names the message, the field and the offset of what is wrong
(:class:`~.errors.ReplicationProtocolError`). :mod:`.messages` decodes each kind with it.
"""

from __future__ import annotations

from typing import Final

from ...wire import records as wrecords
from ...wire.errors import ProtocolError
from ...wire.varint import decode_uvarint
from .errors import ReplicationProtocolError
from .group import MAX_REPLICA_NUMBER, MAX_REPLICAS, Group
from .history import MAX_POSITION, EpochStart, History

__all__ = ["MAX_HISTORY", "MAX_NAME_BYTES", "MAX_RECORDS", "MAX_TRIMS", "MAX_VARINT", "Fields"]

MAX_HISTORY: Final = 1 << 16
"""Entries in one history: one per term that wrote to the log."""
MAX_RECORDS: Final = 1 << 16
"""Records in one APPEND."""
MAX_TRIMS: Final = 1 << 12
"""Destinations in one TRIM."""
MAX_NAME_BYTES: Final = 1 << 10
"""The longest instance name a TRIM carries, in UTF-8 bytes."""
MAX_VARINT: Final = 10
"""The bytes of the longest varint a field may take."""


class Fields:
    """A walk over one frame's fields; errors name the message, field and offset."""

    def __init__(self, body: memoryview, base: int, what: str) -> None:
        self.body = body
        self.pos = 0
        self.base = base
        self.what = what

    def fail(self, reason: str, at: int | None = None, seq: int | None = None) -> None:
        where = self.base + (self.pos if at is None else at)
        raise ReplicationProtocolError(f"{self.what}: {reason}", offset=where, seq=seq)

    def uint(self, name: str) -> int:
        start = self.pos
        try:
            value, self.pos = decode_uvarint(self.body, start, None, MAX_VARINT)
        except ProtocolError as exc:
            raise ReplicationProtocolError(
                f"{self.what}: field {name}: {exc.reason}", offset=self.base + start
            ) from None
        if value > MAX_POSITION:
            self.fail(f"field {name} is {value}, over {MAX_POSITION}", start)
        return value

    def flag(self, name: str) -> bool:
        start = self.pos
        value = self.uint(name)
        if value > 1:
            self.fail(f"field {name} is {value}, not 0 or 1", start)
        return value == 1

    def group(self) -> Group:
        """A group: ``version | members | ack | changing``, then, if changing (1), the
        group it changes from: ``members | ack``; ``members`` is a count then each
        replica number, in increasing order."""
        version = self.uint("group version")
        current = self._members("group", version)
        start = self.pos
        if not self.flag("changing"):
            return current
        previous = self._members("previous group", 0)
        try:
            return Group.of(current.replicas, current.k, version=version, previous=previous)
        except ValueError as exc:
            self.fail(str(exc), start)
            raise AssertionError("unreachable") from None

    def _members(self, name: str, version: int) -> Group:
        start = self.pos
        count = self.count(f"{name} members", MAX_REPLICAS)
        members: list[int] = []
        for _ in range(count):
            at = self.pos
            r = self.uint(f"{name} member")
            if r > MAX_REPLICA_NUMBER or (members and r <= members[-1]):
                self.fail(f"{name} member {r} out of order or over {MAX_REPLICA_NUMBER}", at)
            members.append(r)
        ack = self.uint(f"{name} ack")
        if not 1 <= ack <= count:
            self.fail(f"a {name} of {count} replicas committing on {ack}", start)
        return Group.of(members, ack, version=version)

    def count(self, name: str, limit: int) -> int:
        start = self.pos
        n = self.uint(name)
        if n > limit:
            self.fail(f"field {name} is {n}, over {limit}", start)
        return n

    def history(self, name: str) -> History:
        n = self.count(f"{name} count", MAX_HISTORY)
        entries: list[EpochStart] = []
        for i in range(n):
            start = self.pos
            epoch = self.uint(f"{name}[{i}].epoch")
            seq = self.uint(f"{name}[{i}].start")
            if epoch == 0:
                self.fail(f"{name}[{i}].epoch is 0", start)
            if entries and (epoch <= entries[-1].epoch or seq < entries[-1].start):
                self.fail(f"{name}[{i}] ({epoch}, {seq}) does not follow {entries[-1]}", start)
            entries.append(EpochStart(epoch, seq))
        return History(tuple(entries))

    def records(self, first_seq: int) -> tuple[memoryview, ...]:
        n = self.count("record count", MAX_RECORDS)
        out: list[memoryview] = []
        for i in range(n):
            seq = first_seq + i
            size_at = self.pos
            size = self.uint(f"records[{i}].size")
            if size > len(self.body) - self.pos:
                self.fail(f"records[{i}] of {size} bytes runs past the frame", size_at, seq)
            record = self.body[self.pos : self.pos + size]
            _check_record(record, seq, i, self)
            out.append(record)
            self.pos += size
        return tuple(out)

    def trims(self) -> tuple[tuple[str, int], ...]:
        n = self.count("trim count", MAX_TRIMS)
        out: dict[str, int] = {}
        for i in range(n):
            start = self.pos
            size = self.uint(f"trims[{i}].name size")
            if not 0 < size <= MAX_NAME_BYTES:
                self.fail(f"trims[{i}].name of {size} bytes, not 1..{MAX_NAME_BYTES}", start)
            if size > len(self.body) - self.pos:
                self.fail(f"trims[{i}].name runs past the frame", start)
            try:
                name = bytes(self.body[self.pos : self.pos + size]).decode()
            except UnicodeDecodeError:
                self.fail(f"trims[{i}].name is not UTF-8", self.pos)
            if name in out:
                self.fail(f"trims[{i}] names {name!r} a second time", start)
            self.pos += size
            out[name] = self.uint(f"trims[{i}].seq")
        return tuple(out.items())

    def rest(self) -> memoryview:
        data = self.body[self.pos :]
        self.pos = len(self.body)
        return data

    def end(self) -> None:
        if self.pos != len(self.body):
            self.fail(f"{len(self.body) - self.pos} trailing bytes")


def _check_record(record: memoryview, seq: int, i: int, fields: Fields) -> None:
    """A shipped record must be a whole, verified on-disk record numbered ``seq``."""
    at = fields.pos
    try:
        header = wrecords.parse_header(record, 0, on_disk=True)
        if header.seq != seq:
            fields.fail(f"records[{i}] has seq {header.seq}, expected {seq}", at + 16, seq)
        if header.length > len(record):
            fields.fail(
                f"records[{i}] states {header.length} bytes, has {len(record)}", at + 4, seq
            )
        _, tail_end = wrecords.decode_disk_tail(record, header.length)
        if tail_end != len(record):
            fields.fail(
                f"records[{i}]: {len(record) - tail_end} bytes after its watermarks",
                at + tail_end,
                seq,
            )
        wrecords.verify_check(header, record[wrecords.HEADER_SIZE : header.length])
    except ReplicationProtocolError:
        raise
    except ProtocolError as exc:
        offset = 0 if exc.offset is None else exc.offset
        raise ReplicationProtocolError(
            f"{fields.what}: records[{i}]: {exc.reason}", offset=fields.base + at + offset, seq=seq
        ) from None
