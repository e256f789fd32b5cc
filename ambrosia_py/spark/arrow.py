"""Columns to Arrow record batches, in the schema Spark's Python data source checks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]

from .rows import Columns
from .schema import MESSAGE_COLUMNS, RECORD_COLUMNS, arrow_schema

__all__ = ["to_batch"]

_SCHEMAS = {"message": arrow_schema(MESSAGE_COLUMNS), "record": arrow_schema(RECORD_COLUMNS)}


def to_batch(columns: Columns) -> Any:
    """The rows of ``columns`` as one ``pyarrow.RecordBatch``."""
    schema = _SCHEMAS[columns.level]
    n = len(columns)
    arrays = [
        pa.repeat(pa.scalar(columns.instance, pa.string()), n),
        pa.repeat(pa.scalar(columns.version, pa.int32()), n),
        pa.repeat(pa.scalar(columns.log_file, pa.string()), n),
    ]
    for field in list(schema)[3:]:
        arrays.append(pa.array(columns.lists[field.name], type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)
