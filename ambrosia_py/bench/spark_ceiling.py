"""The ceiling of ``bench spark``: Spark's Python data source path with nothing to read.

A data source with the ``ambrosia`` schema whose reader does no work: each partition
yields one Arrow batch of real rows (the first of the logs, read once per worker) over
and over, until it has made its share of the rows. What it takes is what Spark itself
costs per row on this machine (the worker's Arrow stream to the JVM, the JVM's rows),
measured in the same run as the ``ambrosia`` reader: the most any Python data source
with these columns can move here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    InputPartition,
)

from ..spark.schema import MESSAGE_COLUMNS, ddl

__all__ = ["CeilingSource"]

_batch: list[Any] = []  # per worker process: the batch, made once


class CeilingSource(DataSource):
    """Options: ``path`` (logs to take the batch from), ``partitions``, ``rows``."""

    @classmethod
    def name(cls) -> str:
        return "ambrosia_ceiling"

    def schema(self) -> str:
        return ddl(MESSAGE_COLUMNS)

    def reader(self, schema: Any) -> _CeilingReader:
        return _CeilingReader(dict(self.options))


class _CeilingReader(DataSourceReader):
    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.count = int(options["partitions"])
        self.rows = int(options["rows"])

    def partitions(self) -> Sequence[InputPartition]:
        share, extra = divmod(self.rows, self.count)
        return [InputPartition(share + (i < extra)) for i in range(self.count)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not _batch:
            _batch.append(_first_batch(self.path))
        batch = _batch[0]
        rows: int = partition.value
        while rows > 0:
            piece = batch if rows >= batch.num_rows else batch.slice(0, rows)
            yield piece
            rows -= piece.num_rows


def _first_batch(path: str) -> Any:
    from ..spark.arrow import to_batch
    from ..spark.layout import find_logs
    from ..spark.plan import plan
    from ..spark.rows import columns_of

    first = plan(find_logs(path))[0]
    columns = columns_of(
        first, "message", fail_on_damage=True, max_rows=1 << 16, max_bytes=32 << 20
    )
    return to_batch(next(iter(columns)))
