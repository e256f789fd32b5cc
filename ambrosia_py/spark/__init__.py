"""Spark over the recorded logs: the ``ambrosia`` PySpark data source.

``register(spark)`` adds the data source to a session, ``local_session()`` makes a
configured local one and ``cluster_session(master)`` one on a cluster; then
``spark.read.format("ambrosia").load(PATH)`` reads logs as rows (batch) and
``spark.readStream.format("ambrosia").load(DATA_DIR)`` follows them as they grow.
:func:`read_rows` gives the same rows in Python alone (no Spark). Importing this package
needs neither PySpark nor PyArrow; reading logs needs PyArrow (files are read through
``pyarrow.fs``), Spark needs both (``pip install 'ambrosia-py[spark]'``).
``decoded(df, Service)`` adds the calls' method names and arguments as columns (opt-in:
it unpickles, so only for logs you trust). See ``docs/spark.md``.
"""

from .decode import decoded
from .errors import LogDamageError, LogFormatError, LogReadError, NoLogsError
from .layout import LogFile, find_logs
from .rows import read_rows
from .schema import MESSAGE_COLUMNS, MSG_TYPE_NAMES, RECORD_COLUMNS
from .session import cluster_session, java_problem, local_session, register

__all__ = [
    "MESSAGE_COLUMNS",
    "MSG_TYPE_NAMES",
    "RECORD_COLUMNS",
    "LogDamageError",
    "LogFile",
    "LogFormatError",
    "LogReadError",
    "NoLogsError",
    "cluster_session",
    "decoded",
    "find_logs",
    "java_problem",
    "local_session",
    "read_rows",
    "register",
]
