"""Rows from records: the data source's columns.

The Spark reader and :func:`read_rows` share this code: records (:mod:`.scan`) become
columns here, and :mod:`.arrow` turns the columns into Arrow record batches (so
:func:`read_rows` gives what Spark gets). Records of calls and return values are kept
as they are and read with numpy when the batch is made (:mod:`.calls`); the rest (other
messages, and the calls and return values the numpy path leaves: a very long call seq, a
sender that is not UTF-8) are read here into lists from the wire decoder's objects.

Per message (``level=message``, the default), batches flattened, ``msg_index`` counting
the flattened messages of the record:

* ``RPC`` calls: ``method_id``, ``rpc_type`` (``async``, ``fork``, ``impulse``), the
  arguments as ``payload``; an async call also has ``sender`` and ``call_seq``.
* ``RPC`` return values: ``rpc_type`` ``return``, ``sender`` (who ran the call),
  ``call_seq`` (the caller's number for it), the value or exception as ``payload``
  (empty for "no value"), and which of the three as ``return_type`` (``value``,
  ``no_value``, ``exception``; null for every other row).
* ``destination`` of an RPC is the log's instance (the coordinator strips it: the log
  belongs to the receiver); of an ``AttachTo``, the name attached to.
* ``InitialMessage``, ``Ping``, ``PingReturn``: their data as ``payload``;
  ``Checkpoint``: its blob. Other types carry no payload (``payload`` null).
* A damaged record or region is one row with ``check_ok`` false and no message columns;
  a damaged record keeps the committer and seq its header states, a region has neither.

Sender names of fork and impulse calls are not in the log (the wire carries them only
for async calls), so ``sender`` is null for them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import wire
from .layout import find_logs
from .plan import DEFAULT_SPLIT_BYTES, Piece, plan
from .scan import Record, messages_of, read_span
from .schema import (
    MESSAGE_COLUMNS,
    MSG_TYPE_NAMES,
    RECORD_COLUMNS,
    RETURN_TYPE_NAMES,
    RPC_TYPE_NAMES,
)

__all__ = ["LEVELS", "Columns", "columns_of", "read_rows"]

LEVELS = ("message", "record")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_IncomingRpc = wire.IncomingRpc
_RPC = MSG_TYPE_NAMES[0]
_BATCHES = (wire.RpcBatch, wire.CountReplayableRpcBatch)
_DATA = (wire.InitialMessage, wire.Ping, wire.PingReturn)


_RECORD_FIELDS = ("offset", "seq", "committer", "commit_time", "check_ok")
_ASYNC = wire.RpcType.ASYNC_AWAIT


class FastPart:
    """Consecutive records whose messages end at ``Record.ends`` in one buffer ``raw``:
    read with numpy (:mod:`.calls`) when the batch is made (records holding a message
    that does not read there are then read as lists)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self.records: list[Record] = []


Part = FastPart | dict[str, list[Any]]


class Columns:
    """Rows of one log file under construction, column by column.

    ``instance``, ``version`` and ``log_file`` are the same for every row and kept once.
    The columns of a record (``offset`` ... ``check_ok``) are kept once per record in
    :attr:`per_record`, with :attr:`counts` saying how many rows each record has. The
    other columns come in :attr:`parts`, in row order: a :class:`FastPart` (records read
    later with numpy), or lists of values per column (payloads as views into the bytes
    read; ``payload_size`` is not kept: it is the length of ``payload``).
    """

    def __init__(self, level: str, instance: str | None, version: int | None, log_file: str):
        if level not in LEVELS:
            raise ValueError(f"level must be one of {', '.join(LEVELS)}, not {level!r}")
        self.level = level
        self.instance = instance
        self.version = version
        self.log_file = log_file
        spec = MESSAGE_COLUMNS if level == "message" else RECORD_COLUMNS
        self.names = tuple(name for name, _, _ in spec)
        self.per_record: dict[str, list[Any]] = {name: [] for name in _RECORD_FIELDS}
        self.counts: list[int] = []
        self.parts: list[Part] = []
        self.rows_count = 0
        self.payload_bytes = 0  # about: the bodies of the records added

    def __len__(self) -> int:
        return self.rows_count

    def lists(self) -> dict[str, list[Any]]:
        """Empty lists, one per column a part keeps (see the class docstring)."""
        return {name: [] for name in self.names[8:] if name != "payload_size"}

    def _listed(self) -> dict[str, list[Any]]:
        last = self.parts[-1] if self.parts else None
        if isinstance(last, dict):
            return last
        lists = self.lists()
        self.parts.append(lists)
        return lists

    def add(self, record: Record) -> None:
        """Add the rows of one record."""
        r = self.per_record
        r["offset"].append(record.offset)
        r["seq"].append(record.seq)
        r["committer"].append(record.committer)
        t = record.commit_time_ns
        r["commit_time"].append(None if t is None else t // 1000)
        r["check_ok"].append(record.check_ok)
        if record.body is not None:
            self.payload_bytes += len(record.body)
        if self.level == "record":
            count = 1
            c = self._listed()
            c["size"].append(record.size)
            c["msg_count"].append(
                sum(
                    len(m.messages) if isinstance(m, _BATCHES) else 1
                    for m in messages_of(self.log_file, record)
                )
                if record.check_ok
                else None
            )
            c["body"].append(record.body)
        elif not record.check_ok:
            count = 1
            for values in self._listed().values():
                values.append(None)
        elif record.messages is None and record.ends is not None and len(record.ends):
            count = len(record.ends)
            last = self.parts[-1] if self.parts else None
            if not isinstance(last, FastPart) or last.raw is not record.raw:
                last = FastPart(record.raw)
                self.parts.append(last)
            last.records.append(record)
        else:
            count = self.add_listed(self._listed(), record)
        self.counts.append(count)
        self.rows_count += count

    def add_listed(self, c: dict[str, list[Any]], record: Record) -> int:
        """Add the rows of a record whose check bytes verify to lists ``c``; return how
        many. Its messages are the wire decoder's: the records read here are the few
        the numpy path leaves (:mod:`.calls`)."""
        return self._add_messages(c, messages_of(self.log_file, record))

    def _add_messages(self, c: dict[str, list[Any]], messages: list[wire.Message]) -> int:
        """Add one row per message (batches flattened) to ``c``; return how many."""
        index, msg_type, method_id = c["msg_index"], c["msg_type"], c["method_id"]
        rpc_type, sender, call_seq = c["rpc_type"], c["sender"], c["call_seq"]
        destination, payload = c["destination"], c["payload"]
        return_type = c["return_type"]
        instance = self.instance
        n = 0
        for outer in messages:
            for msg in outer.messages if isinstance(outer, _BATCHES) else (outer,):
                index.append(n)
                n += 1
                if type(msg) is _IncomingRpc:  # the common case, kept short
                    msg_type.append(_RPC)
                    method_id.append(msg.method_id)
                    rpc_type.append(RPC_TYPE_NAMES[msg.rpc_type])
                    if msg.rpc_type == _ASYNC:
                        sender.append(msg.sender)
                        call_seq.append(msg.call_seq)
                    else:
                        sender.append(None)
                        call_seq.append(None)
                    destination.append(instance)
                    payload.append(msg.args)
                    return_type.append(None)
                    continue
                values = _other(msg, instance)
                msg_type.append(values[0])
                method_id.append(None)
                rpc_type.append(values[1])
                sender.append(values[2])
                call_seq.append(values[3])
                destination.append(values[4])
                payload.append(values[5])
                return_type.append(
                    RETURN_TYPE_NAMES[msg.return_type]
                    if isinstance(msg, wire.IncomingReturnValue)
                    else None
                )
        return n


def _other(msg: wire.Message, instance: str | None) -> tuple[Any, ...]:
    """(msg_type, rpc_type, sender, call_seq, destination, payload) of a message that is
    not an incoming call."""
    if isinstance(msg, wire.IncomingReturnValue):
        return _RPC, "return", msg.sender, msg.call_seq, instance, msg.value
    name = MSG_TYPE_NAMES[msg.TYPE]
    if isinstance(msg, wire.AttachTo):
        return name, None, None, None, msg.destination, None
    if isinstance(msg, _DATA):
        return name, None, None, None, None, msg.data
    if isinstance(msg, wire.Checkpoint):
        return name, None, None, None, None, msg.blob
    return name, None, None, None, None, None


def columns_of(
    piece: Piece, level: str, *, fail_on_damage: bool, max_rows: int, max_bytes: int
) -> Iterator[Columns]:
    """The rows of one piece, in batches of at most about ``max_rows`` rows or
    ``max_bytes`` payload bytes."""
    log = piece.log

    def fresh() -> Columns:
        return Columns(level, log.instance, log.version, log.path)

    columns = fresh()
    spans = read_span(log.location, piece.span, piece.entries, fail_on_damage=fail_on_damage)
    for record in spans:
        columns.add(record)
        if len(columns) >= max_rows or columns.payload_bytes >= max_bytes:
            yield columns
            columns = fresh()
    if len(columns):
        yield columns


def read_rows(
    path: str | Path,
    *,
    level: str = "message",
    on_damage: str = "report",
    split_bytes: int = DEFAULT_SPLIT_BYTES,
    filesystem: Any = None,
) -> Iterator[dict[str, Any]]:
    """The data source's rows, in pure Python: the same rows, in the same order, as
    ``spark.read.format("ambrosia").load(path)`` (see :mod:`.source` for the options).

    ``path`` is a local path or a URI, or a path in ``filesystem`` (a
    ``pyarrow.fs.FileSystem``): files are read through ``pyarrow.fs`` (:mod:`.fs`)."""
    fail = damage_mode(on_damage)
    for piece in plan(find_logs(path, filesystem), split_bytes):
        for columns in columns_of(
            piece, level, fail_on_damage=fail, max_rows=1 << 16, max_bytes=64 << 20
        ):
            yield from _rows(columns)


def _rows(columns: Columns) -> Iterator[dict[str, Any]]:
    """The rows as dicts, made from the Arrow batch Spark gets (payloads as ``bytes``,
    ``commit_time`` as UTC datetimes)."""
    from .arrow import to_batch

    batch = to_batch(columns)
    data = batch.to_pydict()
    times = batch.column("commit_time").cast("int64").to_pylist()
    data["commit_time"] = [
        None if t is None else _EPOCH + datetime.timedelta(microseconds=t) for t in times
    ]
    names = list(data)
    for values in zip(*data.values(), strict=True):
        yield dict(zip(names, values, strict=True))


def damage_mode(on_damage: str) -> bool:
    """Whether ``on_damage`` asks to fail (``fail``) rather than report (``report``)."""
    if on_damage not in ("report", "fail"):
        raise ValueError(f"on_damage must be report or fail, not {on_damage!r}")
    return on_damage == "fail"
