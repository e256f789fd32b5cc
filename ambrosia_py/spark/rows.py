"""Rows from records: the data source's columns, built in pure Python.

The Spark reader and :func:`read_rows` share this code: records (:mod:`.scan`) become
columns here, and :mod:`.arrow` turns the columns into Arrow record batches.

Per message (``level=message``, the default), batches flattened, ``msg_index`` counting
the flattened messages of the record:

* ``RPC`` calls: ``method_id``, ``rpc_type`` (``async``, ``fork``, ``impulse``), the
  arguments as ``payload``; an async call also has ``sender`` and ``call_seq``.
* ``RPC`` return values: ``rpc_type`` ``return``, ``sender`` (who ran the call),
  ``call_seq`` (the caller's number for it), the value or exception as ``payload``
  (empty for "no value").
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
from .scan import Record, read_span
from .schema import MESSAGE_COLUMNS, MSG_TYPE_NAMES, RECORD_COLUMNS, RPC_TYPE_NAMES

__all__ = ["LEVELS", "Columns", "columns_of", "read_rows"]

LEVELS = ("message", "record")
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_IncomingRpc = wire.IncomingRpc
_RPC = MSG_TYPE_NAMES[0]
_BATCHES = (wire.RpcBatch, wire.CountReplayableRpcBatch)
_DATA = (wire.InitialMessage, wire.Ping, wire.PingReturn)


class Columns:
    """Rows of one log file under construction, column by column.

    ``instance``, ``version`` and ``log_file`` are the same for every row and kept once;
    the other columns are lists (payloads as views into the bytes read).
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
        self.lists: dict[str, list[Any]] = {name: [] for name in self.names[3:]}
        self.payload_bytes = 0

    def __len__(self) -> int:
        return len(self.lists["offset"])

    def add(self, record: Record) -> None:
        """Add the rows of one record."""
        if self.level == "record":
            self._add_record(record)
        elif not record.check_ok:
            self._add_damaged(record)
        else:
            index = 0
            for msg in record.messages:
                if isinstance(msg, _BATCHES):
                    for inner in msg.messages:
                        self._add_message(record, index, inner)
                        index += 1
                else:
                    self._add_message(record, index, msg)
                    index += 1

    def _head(self, record: Record) -> None:
        c = self.lists
        c["offset"].append(record.offset)
        c["seq"].append(record.seq)
        c["committer"].append(record.committer)
        t = record.commit_time_ns
        c["commit_time"].append(None if t is None else t // 1000)
        c["check_ok"].append(record.check_ok)

    def _add_record(self, record: Record) -> None:
        self._head(record)
        c = self.lists
        c["size"].append(record.size)
        if record.check_ok:
            count = sum(len(m.messages) if isinstance(m, _BATCHES) else 1 for m in record.messages)
            c["msg_count"].append(count)
        else:
            c["msg_count"].append(None)
        c["body"].append(record.body)
        self.payload_bytes += 0 if record.body is None else len(record.body)

    def _add_damaged(self, record: Record) -> None:
        self._head(record)
        for name in self.names[8:]:
            self.lists[name].append(None)

    def _add_message(self, record: Record, index: int, msg: wire.Message) -> None:
        self._head(record)
        c = self.lists
        c["msg_index"].append(index)
        method: int | None = None
        rpc_type: str | None = None
        sender: str | None = None
        destination: str | None = None
        call_seq: int | None = None
        payload: wire.Payload | None = None
        if type(msg) is _IncomingRpc:
            name = _RPC
            method = msg.method_id
            rpc_type = RPC_TYPE_NAMES[msg.rpc_type]
            if rpc_type == "async":
                sender = msg.sender
                call_seq = msg.call_seq
            destination = self.instance
            payload = msg.args
        elif isinstance(msg, wire.IncomingReturnValue):
            name = _RPC
            rpc_type = "return"
            sender = msg.sender
            call_seq = msg.call_seq
            destination = self.instance
            payload = msg.value
        else:
            name = MSG_TYPE_NAMES[msg.TYPE]
            if isinstance(msg, wire.AttachTo):
                destination = msg.destination
            elif isinstance(msg, _DATA):
                payload = msg.data
            elif isinstance(msg, wire.Checkpoint):
                payload = msg.blob
        c["msg_type"].append(name)
        c["method_id"].append(method)
        c["rpc_type"].append(rpc_type)
        c["sender"].append(sender)
        c["destination"].append(destination)
        c["call_seq"].append(call_seq)
        if payload is None:
            c["payload_size"].append(None)
        else:
            c["payload_size"].append(len(payload))
            self.payload_bytes += len(payload)
        c["payload"].append(payload)

    def rows(self) -> Iterator[dict[str, Any]]:
        """The rows as dicts (payloads as ``bytes``, ``commit_time`` as UTC datetimes)."""
        lists = [self.lists[name] for name in self.names[3:]]
        for values in zip(*lists, strict=True):
            row: dict[str, Any] = {
                "instance": self.instance,
                "version": self.version,
                "log_file": self.log_file,
            }
            for name, value in zip(self.names[3:], values, strict=True):
                if isinstance(value, memoryview):
                    value = bytes(value)
                elif name == "commit_time" and value is not None:
                    value = _EPOCH + datetime.timedelta(microseconds=value)
                row[name] = value
            yield row


def columns_of(
    piece: Piece, level: str, *, fail_on_damage: bool, max_rows: int, max_bytes: int
) -> Iterator[Columns]:
    """The rows of one piece, in batches of at most about ``max_rows`` rows or
    ``max_bytes`` payload bytes."""
    log = piece.log

    def fresh() -> Columns:
        return Columns(level, log.instance, log.version, log.path)

    columns = fresh()
    for record in read_span(log.path, piece.span, piece.entries, fail_on_damage=fail_on_damage):
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
) -> Iterator[dict[str, Any]]:
    """The data source's rows, in pure Python: the same rows, in the same order, as
    ``spark.read.format("ambrosia").load(path)`` (see :mod:`.source` for the options)."""
    fail = damage_mode(on_damage)
    for piece in plan(find_logs(path), split_bytes):
        for columns in columns_of(
            piece, level, fail_on_damage=fail, max_rows=1 << 16, max_bytes=64 << 20
        ):
            yield from columns.rows()


def damage_mode(on_damage: str) -> bool:
    """Whether ``on_damage`` asks to fail (``fail``) rather than report (``report``)."""
    if on_damage not in ("report", "fail"):
        raise ValueError(f"on_damage must be report or fail, not {on_damage!r}")
    return on_damage == "fail"
