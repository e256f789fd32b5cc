"""The columns of the data source, defined once for Spark (DDL) and for Arrow.

Names are fixed: queries written against them must keep working. ``MESSAGE_COLUMNS``
are the default rows (one per message, batches flattened); ``RECORD_COLUMNS`` the rows
of ``level=record`` (one per record). Types are given as Spark SQL type names; the
matching Arrow types are what Spark's Python data source expects for them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "MESSAGE_COLUMNS",
    "MSG_TYPE_NAMES",
    "RECORD_COLUMNS",
    "RETURN_TYPE_NAMES",
    "RPC_TYPE_NAMES",
    "arrow_schema",
    "ddl",
]

# (name, Spark SQL type, nullable)
MESSAGE_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("instance", "STRING", True),
    ("version", "INT", True),
    ("log_file", "STRING", False),
    ("offset", "BIGINT", False),  # of the record in its log file
    ("seq", "BIGINT", True),
    ("committer", "INT", True),
    ("commit_time", "TIMESTAMP", True),
    ("check_ok", "BOOLEAN", False),
    ("msg_index", "INT", True),  # within the record, batches flattened
    ("msg_type", "STRING", True),
    ("method_id", "INT", True),
    ("rpc_type", "STRING", True),
    ("sender", "STRING", True),
    ("destination", "STRING", True),
    ("call_seq", "BIGINT", True),
    ("payload_size", "BIGINT", True),
    ("payload", "BINARY", True),
    ("return_type", "STRING", True),  # added last, so the columns before keep their places
)

# return_type by the return type byte of a return value (reference ambrosia.md, RPC layouts).
RETURN_TYPE_NAMES = {1: "value", 2: "no_value", 3: "exception"}

RECORD_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    *MESSAGE_COLUMNS[:8],
    ("size", "BIGINT", False),  # on-disk bytes: header, messages, watermarks, blobs
    ("msg_count", "INT", True),  # messages, batches flattened
    ("body", "BINARY", True),  # the framed messages
)

# The reference's names for the message types (reference ambrosia.md, Message types).
MSG_TYPE_NAMES = {
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

# rpc_type by the RPC type byte of a call; a return value is "return".
RPC_TYPE_NAMES = ("async", "fork", "impulse")


def ddl(columns: tuple[tuple[str, str, bool], ...]) -> str:
    """The Spark DDL schema string of ``columns``."""
    return ", ".join(
        f"`{name}` {kind}{'' if nullable else ' NOT NULL'}" for name, kind, nullable in columns
    )


def arrow_schema(columns: tuple[tuple[str, str, bool], ...]) -> Any:
    """The ``pyarrow.Schema`` of ``columns``, as Spark's data source checks it."""
    import pyarrow as pa  # type: ignore[import-untyped]

    types = {
        "STRING": pa.string(),
        "INT": pa.int32(),
        "BIGINT": pa.int64(),
        "BOOLEAN": pa.bool_(),
        "TIMESTAMP": pa.timestamp("us", tz="UTC"),
        "BINARY": pa.binary(),
    }
    return pa.schema(
        [pa.field(name, types[kind], nullable=nullable) for name, kind, nullable in columns]
    )
