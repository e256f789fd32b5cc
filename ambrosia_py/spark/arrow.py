"""Columns to Arrow record batches, in the schema Spark's Python data source checks.

Built column by column in C where it counts: a record's columns are converted once per
record and repeated with ``take``; the rows of calls and return values are read with numpy
straight from the record bytes (:mod:`.calls`); listed binary columns are one joined
buffer plus offsets (converting a list of ``memoryview``s value by value is many times
slower). A batch's parts (:attr:`.rows.Columns.parts`) are made one by one and joined.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from .calls import call_rows
from .rows import Columns, FastPart
from .schema import MESSAGE_COLUMNS, RECORD_COLUMNS, arrow_schema

__all__ = ["to_batch"]

_SCHEMAS = {"message": arrow_schema(MESSAGE_COLUMNS), "record": arrow_schema(RECORD_COLUMNS)}
_MAX_BINARY = (1 << 31) - 1  # Arrow's binary type: 32-bit offsets


def _binary(values: list[Any]) -> tuple[Any, Any]:
    """A binary array of ``values`` (buffers or ``None``) and its value lengths (-1: null)."""
    n = len(values)
    lengths = np.fromiter((-1 if v is None else len(v) for v in values), np.int64, n)
    valid = lengths >= 0
    sizes = np.where(valid, lengths, 0)
    if int(sizes.sum()) > _MAX_BINARY:  # a huge checkpoint blob: let Arrow say what is wrong
        return pa.array([None if v is None else bytes(v) for v in values], pa.binary()), lengths
    offsets = np.zeros(n + 1, np.int32)
    np.cumsum(sizes, out=offsets[1:])
    data = b"".join(v for v in values if v is not None)
    nulls = n - int(valid.sum())
    bitmap = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    buffers = [bitmap, pa.py_buffer(offsets), pa.py_buffer(data)]
    return pa.Array.from_buffers(pa.binary(), n, buffers, null_count=nulls), lengths


def _listed(values: dict[str, list[Any]], schema: Any) -> dict[str, Any]:
    arrays: dict[str, Any] = {}
    for name, column in values.items():
        if schema.field(name).type == pa.binary():
            arrays[name], lengths = _binary(column)
            if name == "payload":
                arrays["payload_size"] = pa.array(lengths, pa.int64(), mask=lengths < 0)
        else:
            arrays[name] = pa.array(column, type=schema.field(name).type)
    return arrays


def _fast(part: FastPart, columns: Columns, schema: Any) -> list[dict[str, Any]]:
    """The rows of ``part``: with numpy for runs of records whose calls and return values
    read there, as lists for the other records."""
    records = part.records
    counts = np.fromiter((len(r.ends) for r in records), np.int64, len(records))
    ends = np.concatenate([np.asarray(r.ends, np.int64) for r in records])
    firsts = np.zeros(len(records), np.int64)
    np.cumsum(counts[:-1], out=firsts[1:])
    starts = np.empty_like(ends)
    starts[1:] = ends[:-1]
    starts[firsts] = [r.body_start for r in records]
    lo, hi = records[0].body_start, records[-1].body_start + len(records[-1].body or b"")
    rows = call_rows(part.raw, lo, hi, starts, ends)
    n = len(ends)
    if isinstance(rows, dict):
        rows["msg_index"] = pa.array(
            (np.arange(n, dtype=np.int64) - np.repeat(firsts, counts)).astype(np.int32)
        )
        rows["destination"] = pa.repeat(pa.scalar(columns.instance, pa.string()), n)
        return [rows]
    # Some records hold other messages: read those as lists, the runs between them again.
    bad = np.add.reduceat(rows, firsts) > 0
    out: list[dict[str, Any]] = []
    run = FastPart(part.raw)
    for record, listed in zip(records, bad.tolist(), strict=True):
        if not listed:
            run.records.append(record)
            continue
        if run.records:
            out += _fast(run, columns, schema)
            run = FastPart(part.raw)
        lists = columns.lists()
        columns.add_listed(lists, record)
        out.append(_listed(lists, schema))
    if run.records:
        out += _fast(run, columns, schema)
    return out


def to_batch(columns: Columns) -> Any:
    """The rows of ``columns`` as one ``pyarrow.RecordBatch``."""
    schema = _SCHEMAS[columns.level]
    n = len(columns)
    repeat = pa.array(np.repeat(np.arange(len(columns.counts)), columns.counts))
    arrays: dict[str, Any] = {
        "instance": pa.repeat(pa.scalar(columns.instance, pa.string()), n),
        "version": pa.repeat(pa.scalar(columns.version, pa.int32()), n),
        "log_file": pa.repeat(pa.scalar(columns.log_file, pa.string()), n),
    }
    for name, values in columns.per_record.items():
        arrays[name] = pa.array(values, type=schema.field(name).type).take(repeat)
    parts: list[dict[str, Any]] = []
    for part in columns.parts:
        if isinstance(part, FastPart):
            parts += _fast(part, columns, schema)
        else:
            parts.append(_listed(part, schema))
    for field in schema:
        if field.name in arrays:
            continue
        pieces = [p[field.name] for p in parts]
        if len(pieces) == 1:
            arrays[field.name] = pieces[0]
        elif pieces:
            arrays[field.name] = pa.concat_arrays(pieces)
        else:
            arrays[field.name] = pa.nulls(0, field.type)
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in schema], schema=schema)
