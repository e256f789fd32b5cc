"""The ``ambrosia`` PySpark data source: recorded logs as DataFrames, batch and streaming.

``spark.read.format("ambrosia").load(PATH)`` reads a data dir, one instance's log
directory or one log file (:mod:`.layout`), given as a local path or a URI (``file://``,
``hdfs://``, ``s3://``: files are read through ``pyarrow.fs``, :mod:`.fs`); rows are
described in :mod:`.rows`, columns in :mod:`.schema`. Options:

* ``level``: ``message`` (default, one row per message) or ``record``.
* ``on_damage``: ``report`` (default: a damaged record or region is a row with
  ``check_ok`` false) or ``fail`` (it raises, naming file, offset and seq). A torn tail
  ends a file's rows either way (:mod:`.scan`).
* ``split_bytes``: about how many bytes one partition reads (default 64 MiB). Logs with a
  sidecar index split at verified indexed offsets; logs without one are one piece each.
* ``decode`` (a service as ``run`` takes it: ``module:Class``, ``file.py[:Class]``) and
  ``decode_method``: the decoded columns of :mod:`.decode` added to message rows. Off
  by default: it unpickles logged arguments (trusted logs only).

``spark.readStream.format("ambrosia").load(DATA_DIR)`` follows a live data dir. Its
offset is, per log file (by path under DATA_DIR), the end of what was read: for the newest
log of an instance version, the end of its whole records (a record being written waits
for the next trigger); for older logs, the end of the file. Each record is read once.

``partitions()`` and ``read()`` run in Spark's Python workers: every class here lives in
the installed package (pickled by reference) and holds only plain values.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

import attrs
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from .arrow import to_batch
from .errors import LogReadError, NoLogsError
from .fs import Location, resolve
from .layout import LogFile, find_logs
from .plan import DEFAULT_SPLIT_BYTES, Piece, pack, pieces_of, plan
from .rows import LEVELS, columns_of, damage_mode
from .scan import whole_end
from .schema import MESSAGE_COLUMNS, RECORD_COLUMNS, ddl

__all__ = ["AmbrosiaDataSource", "Options"]

_BATCH_ROWS = 1 << 16
_BATCH_BYTES = 32 << 20


@attrs.frozen
class Options:
    """The data source's options, checked (each error names the option)."""

    path: str
    level: str = "message"
    fail_on_damage: bool = False
    split_bytes: int = DEFAULT_SPLIT_BYTES
    decode: str | None = None  # a service, as run takes it (module:Class, file.py)
    decode_method: str | None = None

    @classmethod
    def parse(cls, options: Any) -> Options:
        path = options.get("path")
        if not path:
            raise ValueError('the ambrosia data source needs a path: .load("DATA_DIR")')
        level = options.get("level", "message")
        if level not in LEVELS:
            raise ValueError(f"option level must be one of {', '.join(LEVELS)}, not {level!r}")
        try:
            fail = damage_mode(options.get("on_damage", "report"))
        except ValueError as exc:
            raise ValueError(f"option {exc}") from None
        raw = options.get("split_bytes", str(DEFAULT_SPLIT_BYTES))
        try:
            split = int(raw)
        except ValueError:
            raise ValueError(f"option split_bytes must be a number of bytes, not {raw!r}") from None
        if split < 1:
            raise ValueError(f"option split_bytes must be at least 1, not {split}")
        decode, method = options.get("decode"), options.get("decode_method")
        if method is not None and decode is None:
            raise ValueError("option decode_method needs option decode (the service)")
        if decode is not None and level != "message":
            raise ValueError("option decode adds columns to message rows: not with level=record")
        return cls(str(path), level, fail, split, decode, method)

    def columns(self) -> tuple[tuple[str, str, bool], ...]:
        """The columns of the rows: the level's, and the decoded ones if asked for."""
        if self.level == "record":
            return RECORD_COLUMNS
        if self.decode is None:
            return MESSAGE_COLUMNS
        from .decode import CallDecoder

        return (*MESSAGE_COLUMNS, *CallDecoder(self.decode, self.decode_method).columns())


class AmbrosiaDataSource(DataSource):
    """Recorded AMBROSIA logs (ours or the released implementation's) as rows."""

    @classmethod
    def name(cls) -> str:
        return "ambrosia"

    def schema(self) -> str:
        return ddl(Options.parse(self.options).columns())

    def reader(self, schema: StructType) -> DataSourceReader:
        return AmbrosiaReader(Options.parse(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return AmbrosiaStreamReader(Options.parse(self.options))


def _read(options: Options, pieces: Sequence[Piece]) -> Iterator[Any]:
    decoder = None
    if options.decode is not None:
        from .decode import CallDecoder

        decoder = CallDecoder(options.decode, options.decode_method)
    for piece in pieces:
        for columns in columns_of(
            piece,
            options.level,
            fail_on_damage=options.fail_on_damage,
            max_rows=_BATCH_ROWS,
            max_bytes=_BATCH_BYTES,
        ):
            batch = to_batch(columns)
            yield batch if decoder is None else decoder.batch(batch)


class AmbrosiaReader(DataSourceReader):
    """Batch reads: every log under the path, to its end when planned."""

    def __init__(self, options: Options) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        pieces = plan(find_logs(self.options.path), self.options.split_bytes)
        groups = pack(pieces, self.options.split_bytes)
        return [InputPartition(tuple(group)) for group in groups] or [InputPartition(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, partition.value)


def _key(root: Location, log: LogFile) -> str:
    """A log's name in the offsets: its path under the data dir (or its file name)."""
    inside = log.location.path.startswith(root.path.rstrip("/") + "/")
    return posixpath.relpath(log.location.path, root.path) if inside else log.location.name


class AmbrosiaStreamReader(DataSourceStreamReader):
    """Streaming reads of a live data dir (see the module docstring for the offsets)."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.root = resolve(options.path)
        self._latest: dict[str, Any] = self.initialOffset()

    def _logs(self) -> dict[str, LogFile]:
        try:
            logs = find_logs(self.root)
        except NoLogsError:
            return {}  # a data dir whose instances have not written yet
        return {_key(self.root, log): log for log in logs}

    def initialOffset(self) -> dict[str, Any]:
        return {"files": {}}

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        # Spark 4.2+ passes the start offset (and a read limit: everything is read);
        # earlier versions pass nothing, and the last answer is the start.
        before: dict[str, int] = dict((start or self._latest)["files"])
        files = dict(before)
        for key, log in self._logs().items():
            at = before.get(key, 0)
            size = log.location.data_size()
            if size <= at:
                continue
            files[key] = whole_end(log.location, at, size) if log.last else size
        self._latest = {"files": files}
        return self._latest

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        logs = self._logs()
        pieces: list[Piece] = []
        for key, stop in sorted(end["files"].items()):
            at = start["files"].get(key, 0)
            if stop <= at:
                continue
            log = logs.get(key)
            if log is None:
                raise LogReadError(
                    self.root.child(key).shown,
                    f"log file vanished before bytes {at}..{stop} were read (pruned?)",
                )
            pieces += pieces_of(log, at, stop, final=log.last, split_bytes=self.options.split_bytes)
        return [InputPartition(tuple(g)) for g in pack(pieces, self.options.split_bytes)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self.options, partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the logs belong to their coordinators."""
