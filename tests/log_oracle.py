"""An AMBROSIA log reader for tests, written from the reference alone: the oracle.

The Spark reader's rows (test_spark_rows.py and the Spark tests that import its
``reference_rows``) are checked against what this module reads. It imports nothing from
``ambrosia_py``: every layout is written here again from reference/ambrosia.md
(*Primitives*, *Log record header*, *Message types*, *RPC layouts*, *Files on disk*) and
seed 002 (*Message Formats*), and test_log_oracle.py holds it to hand-laid bytes, the
reference's own examples among them. It is small and slow on purpose, and strict:
anything it does not expect raises :class:`OracleError`, since it only ever reads logs
the tests wrote.

Where the reference leaves a choice open, the oracle follows the project's documented
reading (docs/protocol.md, docs/spark.md), each said where it is used:

- a return value's ``zigzag length + bytes`` is there for ``value`` and ``exception``
  and absent for ``no value`` (the reference writes it in brackets);
- Ping and PingReturn (no layout in the reference) carry opaque data, the frame's rest;
- on disk, each Checkpoint's blob follows its record *after* the watermarks (the
  reference: the blob "follows after the framed message and is not counted in the
  message size nor in the record length"; on disk the watermarks come first, since they
  belong to the record).

A log is read at rest, as the released coordinator leaves it: records back to back. A
last record cut short (its header, the length it states, its watermarks or blobs running
past the end) is a torn tail and ends the log (reference: recovery "stops at the last good
record"); a whole record whose check bytes fail is an error here, not a tail.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any, NamedTuple

import xxhash

HEADER_BYTES = 24  # reference ambrosia.md, Log record header: "24 bytes, all little-endian"
INT_BYTES = 5  # "A 32-bit value takes at most 5 bytes,
LONG_BYTES = 10  # a 64-bit value at most 10. Anything longer is malformed input."

# reference ambrosia.md, Message types: type byte -> name.
TYPE_NAMES = {
    0: "RPC",
    1: "AttachTo",
    2: "TakeCheckpoint",
    3: "Commit",
    4: "ReplayFrom",
    5: "RPCBatch",
    6: "Ping",
    7: "PingReturn",
    8: "Checkpoint",
    9: "InitialMessage",
    10: "UpgradeTakeCheckpoint",
    11: "TakeBecomingPrimaryCheckpoint",
    12: "UpgradeService",
    13: "CountReplayableRPCBatch",
    14: "TrimTo",
    15: "BecomingPrimary",
}
NO_DATA = frozenset({2, 10, 11, 12, 15})  # "none" in the data column
RPC_TYPES = {0: "async", 1: "fork", 2: "impulse"}  # RPC layouts: "0 async/await, 1 fork, 2 impulse"
RETURN_TYPES = {1: "value", 2: "no_value", 3: "exception"}  # "1 value, 2 no value, 3 exception"
_LONGS = {  # types whose data is zigzag longs: Commit, ReplayFrom, TrimTo, Checkpoint
    3: ("seq", "replayable_seq"),
    4: ("seq", "replayable_seq"),
    14: ("seq",),
    8: ("blob_length",),
}


class OracleError(AssertionError):
    """The bytes are not what the oracle expects of a log the tests wrote."""


class Message(NamedTuple):
    """One framed message: its type byte, its name and its fields by name.

    Fields: RPC calls ``call`` (True), ``method_id``, ``rpc_type``, ``sender`` and
    ``call_seq`` (async only, else None), ``args``; return values ``call`` (False),
    ``return_type``, ``sender``, ``call_seq``, ``value``; AttachTo ``destination``;
    InitialMessage, Ping, PingReturn ``data``; Checkpoint ``blob_length``, then ``blob``;
    batches ``messages`` (and ``replayable``); Commit and ReplayFrom ``seq`` and
    ``replayable_seq``; TrimTo ``seq``.
    """

    type: int
    name: str
    fields: dict[str, Any]


class Record(NamedTuple):
    """One record: where it starts and ends, its header and what follows it."""

    offset: int
    end: int  # after the watermarks and any checkpoint blobs
    committer: int
    length: int  # the header's length: header and messages
    check: int
    seq: int
    body: bytes  # the framed messages
    messages: list[Message]
    watermarks: list[tuple[str, int, int]]
    trims: list[tuple[str, int]]


class _Short(Exception):
    """The bytes end inside a field: a torn tail when it is the last record's."""


def zigzag(data: bytes, pos: int, max_bytes: int, end: int | None = None) -> tuple[int, int]:
    """A ZigZag value written as a little-endian base-128 varint at ``pos`` (reference
    ambrosia.md, Primitives); returns it and the position after it."""
    end = len(data) if end is None else end
    raw = shift = 0
    for i in range(max_bytes):
        if pos + i >= end:
            raise _Short(f"varint at {pos} runs past {end}")
        byte = data[pos + i]
        raw |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos + i + 1
    raise OracleError(f"varint at {pos} longer than {max_bytes} bytes")


def _utf8(raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OracleError(f"{what} is not UTF-8: {exc}") from None


def _name(data: bytes, pos: int, end: int, what: str) -> tuple[str, int]:
    """A ZigZagInt length and that many UTF-8 bytes."""
    n, pos = zigzag(data, pos, INT_BYTES, end)
    if n < 0:
        raise OracleError(f"{what} of {n} bytes at {pos}")
    if pos + n > end:
        raise _Short(f"{what} of {n} bytes at {pos} runs past {end}")
    return _utf8(data[pos : pos + n], what), pos + n


def _rpc(data: bytes, pos: int, end: int) -> dict[str, Any]:
    """An incoming RPC's data (reference ambrosia.md, RPC layouts: a log holds what the
    receiver gets, the destination stripped)."""
    if pos >= end:
        raise OracleError(f"an RPC with no data at {pos}")
    kind = data[pos]
    pos += 1
    if kind == 0:  # a call
        method_id, pos = zigzag(data, pos, INT_BYTES, end)
        if pos >= end or data[pos] not in RPC_TYPES:
            raise OracleError(f"no RPC type byte (0, 1 or 2) at {pos}")
        rpc_type = RPC_TYPES[data[pos]]
        pos += 1
        sender = call_seq = None
        if rpc_type == "async":  # "[async/await only: sender length, sender, long seq]"
            sender, pos = _name(data, pos, end, "sender")
            call_seq, pos = zigzag(data, pos, LONG_BYTES, end)
        return {
            "call": True,
            "method_id": method_id,
            "rpc_type": rpc_type,
            "sender": sender,
            "call_seq": call_seq,
            "args": data[pos:end],
        }
    if kind not in RETURN_TYPES:
        raise OracleError(f"RPC return-type byte {kind} at {pos - 1}")
    sender, pos = _name(data, pos, end, "sender")
    call_seq, pos = zigzag(data, pos, LONG_BYTES, end)
    value = b""
    if RETURN_TYPES[kind] != "no_value":  # the project's reading: no length for no value
        n, pos = zigzag(data, pos, INT_BYTES, end)
        if n < 0:
            raise OracleError(f"return value of {n} bytes at {pos}")
        if pos + n > end:
            raise _Short(f"return value of {n} bytes at {pos} runs past {end}")
        value, pos = data[pos : pos + n], pos + n
    if pos != end:
        raise OracleError(f"{end - pos} bytes after a return value at {pos}")
    return {
        "call": False,
        "return_type": RETURN_TYPES[kind],
        "sender": sender,
        "call_seq": call_seq,
        "value": value,
    }


def _data(kind: int, data: bytes, pos: int, end: int) -> dict[str, Any]:
    """The fields of a message of type ``kind`` whose data is ``data[pos:end]``."""
    if kind == 0:
        return _rpc(data, pos, end)
    if kind == 1:  # "destination instance name, UTF-8, no length prefix"
        return {"destination": _utf8(data[pos:end], "AttachTo name")}
    if kind in NO_DATA:
        if pos != end:
            raise OracleError(f"{TYPE_NAMES[kind]} with {end - pos} bytes of data at {pos}")
        return {}
    if kind in (5, 13):  # "zigzag count, [zigzag count of non-impulse messages,] messages"
        count, pos = zigzag(data, pos, INT_BYTES, end)
        fields: dict[str, Any] = {}
        if kind == 13:
            fields["replayable"], pos = zigzag(data, pos, INT_BYTES, end)
        inner, pos = _frames(data, pos, end)
        if len(inner) != count or any(m.type != 0 for m in inner):
            raise OracleError(f"batch of {count} RPCs holds {[m.name for m in inner]}")
        return fields | {"messages": inner}
    if kind in (6, 7, 9):  # Ping, PingReturn (the project's reading), InitialMessage
        return {"data": data[pos:end]}
    fields = {}
    for field in _LONGS[kind]:
        fields[field], pos = zigzag(data, pos, LONG_BYTES, end)
    if pos != end:
        raise OracleError(f"{end - pos} bytes after a {TYPE_NAMES[kind]} at {pos}")
    return fields


def _frames(data: bytes, pos: int, end: int) -> tuple[list[Message], int]:
    """Messages framed ``zigzag size | type byte | data`` from ``pos`` up to ``end``."""
    out = []
    while pos < end:
        size, pos = zigzag(data, pos, INT_BYTES, end)
        if size < 1:
            raise OracleError(f"message size {size} at {pos}")
        if pos + size > end:
            raise _Short(f"message of {size} bytes at {pos} runs past {end}")
        kind = data[pos]
        if kind not in TYPE_NAMES:
            raise OracleError(f"unknown message type {kind} at {pos}")
        out.append(Message(kind, TYPE_NAMES[kind], _data(kind, data, pos + 1, pos + size)))
        pos += size
    return out, pos


def messages(body: bytes) -> list[Message]:
    """The framed messages of a record's body (Checkpoints without their blobs)."""
    try:
        return _frames(body, 0, len(body))[0]
    except _Short as exc:
        raise OracleError(f"a message runs past the body: {exc}") from None


def flatten(msgs: list[Message]) -> list[Message]:
    """Batches replaced by the calls they hold (the rows' ``msg_index`` order)."""
    return [inner for m in msgs for inner in (m.fields["messages"] if m.type in (5, 13) else [m])]


def _record(data: bytes, offset: int, on_disk: bool) -> Record:
    if offset + HEADER_BYTES > len(data):
        raise _Short("header")
    committer, stored, check, seq = struct.unpack_from("<iiQq", data, offset)
    if on_disk:  # Files on disk: "the length is stored as -length-1"
        if stored >= 0:
            raise OracleError(f"on-disk length field {stored} at {offset} is not negative")
        length = -stored - 1
    else:
        length = stored
    if length < HEADER_BYTES:
        raise OracleError(f"record length {length} at {offset}")
    if offset + length > len(data):
        raise _Short("messages")
    body = data[offset + HEADER_BYTES : offset + length]
    want = 0 if seq == -2 else xxhash.xxh64_intdigest(body)  # "-2 ... its check bytes are 0"
    if check != want:
        raise OracleError(f"check bytes {check:#x} of the record at {offset}, not {want:#x}")
    msgs = messages(body)
    pos = offset + length
    watermarks: list[tuple[str, int, int]] = []
    trims: list[tuple[str, int]] = []
    if on_disk:  # "a zigzag count, then per entry (name length, name, i64, i64)", then trims
        count, pos = zigzag(data, pos, INT_BYTES)
        for _ in range(count):
            name, pos = _name(data, pos, len(data), "watermark name")
            if pos + 16 > len(data):
                raise _Short("watermark")
            watermarks.append((name, *struct.unpack_from("<qq", data, pos)))
            pos += 16
        count, pos = zigzag(data, pos, INT_BYTES)
        for _ in range(count):
            name, pos = _name(data, pos, len(data), "trim watermark name")
            if pos + 8 > len(data):
                raise _Short("trim watermark")
            trims.append((name, *struct.unpack_from("<q", data, pos)))
            pos += 8
    for m in msgs:  # each blob behind the record, in the order of its Checkpoint
        if m.type == 8:
            n = m.fields["blob_length"]
            if n < 0:
                raise OracleError(f"checkpoint blob length {n} in the record at {offset}")
            if pos + n > len(data):
                raise _Short("checkpoint blob")
            m.fields["blob"], pos = data[pos : pos + n], pos + n
    return Record(offset, pos, committer, length, check, seq, body, msgs, watermarks, trims)


def records(data: bytes, *, on_disk: bool = True) -> Iterator[Record]:
    """The records of a log file's bytes (``on_disk``) or of a stream of wire-form
    records, up to a torn tail."""
    offset = 0
    while offset < len(data):
        try:
            record = _record(data, offset, on_disk)
        except _Short:
            return  # a record cut short by the end: a torn tail
        yield record
        offset = record.end
