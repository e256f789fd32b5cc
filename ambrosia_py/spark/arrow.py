"""Columns to Arrow record batches, in the schema Spark's Python data source checks.

Built column by column in C where it counts: a record's columns are converted once per
record and repeated with ``take``; binary columns are one joined buffer plus offsets
(converting a list of ``memoryview``s value by value is many times slower).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]

from .rows import Columns
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
    for name, values in columns.per_row.items():
        if schema.field(name).type == pa.binary():
            arrays[name], lengths = _binary(values)
            if name == "payload":
                arrays["payload_size"] = pa.array(lengths, pa.int64(), mask=lengths < 0)
        else:
            arrays[name] = pa.array(values, type=schema.field(name).type)
    return pa.RecordBatch.from_arrays([arrays[f.name] for f in schema], schema=schema)
