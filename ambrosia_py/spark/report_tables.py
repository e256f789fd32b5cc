"""The analytics report's tables: Spark queries over the message rows, as pandas frames.

Every function takes ``msgs``, the data source's message rows without ``payload``
(cached by :mod:`.analyze`: each table is a query over the same scan), and returns a
small pandas DataFrame, which the report draws, shows and writes as Parquet. What is
counted, once, for all of them:

* a **call** is an ``RPC`` row whose ``rpc_type`` is ``async``, ``fork`` or ``impulse``;
  a **return** one whose ``rpc_type`` is ``return``. **Replayable** calls are async and
  fork calls (instances calling instances); impulses come from outside (the released
  AMBROSIA's term: ``CountReplayableRPCBatch`` counts the others).
* a **record** is a distinct (log file, offset) among the rows, so records without
  messages (our coordinators write none) are not counted; a **damaged** row is one with
  ``check_ok`` false (a damaged record or region: no messages are read from it).
* **time**: ``commit_time``, which the sidecar index gives (docs/spark.md). An instance
  version with no commit time at all (logs without an index) is counted per record
  ``seq`` instead, and its rows say so (``axis``).
* a call's **method** is the one it runs: a client's call through the ingress counts
  under the method its envelope carries, not the ingress's reserved id, and an ingress
  BATCH impulse (one message) counts as each of its calls (``msgs`` has the ``ingress``,
  ``called_id`` and ``called_ids`` columns of :mod:`.report_ingress`).
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from typing import Any

from .layout import LogFile

__all__ = [
    "CALL_TYPES",
    "to_pandas",
    "NO_SENDER",
    "call_kinds",
    "calls_between",
    "calls_over_time",
    "control_messages",
    "instances",
    "logs",
    "message_sizes",
    "size_stats",
    "totals",
]

CALL_TYPES = ("async", "fork", "impulse")
NO_SENDER = "(not logged)"  # fork and impulse calls: the wire carries no sender
_MAX_BUCKETS = 300  # points per line in the calls-over-time chart, about
_CHECKPOINT = re.compile(r"serverchkpt([1-9][0-9]*)")
_TORN = re.compile(r"serverlog([1-9][0-9]*)\.torn-.*")


def _F() -> Any:
    from pyspark.sql import functions

    return functions


def _pd() -> Any:
    """pandas (the spark extra), imported where used: one place for the untyped import."""
    import pandas  # type: ignore[import-untyped]

    return pandas


def _calls(msgs: Any) -> Any:
    F = _F()
    return msgs.where((F.col("msg_type") == "RPC") & F.col("rpc_type").isin(*CALL_TYPES))


def to_pandas(df: Any) -> Any:
    """A small result as pandas, timestamps as naive UTC (the session's time zone), and
    integer columns holding nulls as pandas' nullable ``Int64`` (not floats)."""
    out = df.toPandas()
    for field in df.schema.fields:
        if field.dataType.typeName() in ("integer", "long") and out[field.name].dtype == float:
            out[field.name] = out[field.name].astype("Int64")
    return out


def totals(per_instance: Any, log_files: int) -> dict[str, int]:
    """The counts the report is built from, by name (see the module docstring), summed
    from the :func:`instances` table (a log file belongs to one instance version, so its
    records add up)."""
    out = {"log_files": log_files, "instance_versions": len(per_instance)}
    for name in ("records", "messages", "damaged", "calls", *CALL_TYPES, "returns", "other"):
        out[name] = int(per_instance[name].sum())
    out["payload_bytes"] = int(per_instance["payload_bytes"].sum())
    return out


def instances(msgs: Any) -> Any:
    """Per instance version: records, messages, calls by type, returns, time span."""
    F = _F()
    calls = F.size("called_ids")  # an ingress batch is one message and its calls
    counts = [
        F.sum(F.when(F.col("rpc_type") == t, calls if t != "return" else 1).otherwise(0)).alias(
            t.replace("return", "returns")
        )
        for t in (*CALL_TYPES, "return")
    ]
    df = msgs.groupBy("instance", "version").agg(
        F.countDistinct("log_file").alias("log_files"),
        F.countDistinct("log_file", "offset").alias("records"),
        F.count(F.lit(1)).alias("messages"),
        F.sum(F.when(F.col("rpc_type").isin(*CALL_TYPES), calls).otherwise(0)).alias("calls"),
        *counts,
        F.sum(F.when(F.col("msg_type") != "RPC", 1).otherwise(0)).alias("other"),
        F.sum(F.when(~F.col("check_ok"), 1).otherwise(0)).alias("damaged"),
        F.coalesce(F.sum("payload_size"), F.lit(0)).alias("payload_bytes"),
        F.min("commit_time").alias("first_time"),
        F.max("commit_time").alias("last_time"),
        F.min("seq").alias("first_seq"),
        F.max("seq").alias("last_seq"),
    )
    return to_pandas(df.orderBy("instance", "version"))


def calls_over_time(msgs: Any, names: dict[int, str], per_instance: Any) -> Any:
    """Calls per bucket per instance version, method called (``method_id``: an ingress
    call's carried id; ``ingress`` beside it), and ``rpc_type``: ``axis``
    ``commit_time`` (``bucket`` in seconds since the epoch, ``start`` the same as a UTC
    time, ``width`` seconds) or ``seq`` (``bucket`` the first seq, ``width`` seqs). Rows
    without a time in a timed instance version have a null ``bucket``, so the calls add
    up to all calls. Widths are the smallest of 1 ms, 10 ms, ... 1 s, 10 s, 1 min, 10 min,
    1 h, ... (seqs: 1, 10, 100, ...) that cut the instance version's span (from
    ``per_instance``, the :func:`instances` table) into at most about 300 buckets, so a
    short run is not one point and a long one not a blur."""
    F = _F()
    pd = _pd()
    calls = _calls(msgs).withColumn("t", F.unix_micros("commit_time") / 1e6)
    widths = []
    for r in per_instance.to_dict("records"):
        version = None if pd.isna(r["version"]) else int(r["version"])
        if pd.notna(r["first_time"]):
            span = (r["last_time"] - r["first_time"]).total_seconds()
            widths.append((r["instance"], version, "commit_time", _width(span)))
        else:
            span = 0.0 if pd.isna(r["first_seq"]) else float(r["last_seq"] - r["first_seq"])
            widths.append((r["instance"], version, "seq", _width(span, seqs=True)))
    schema = "instance STRING, version INT, axis STRING, width DOUBLE"
    spans = msgs.sparkSession.createDataFrame(widths, schema)
    joined = calls.join(
        spans,
        calls["instance"].eqNullSafe(spans["instance"])
        & calls["version"].eqNullSafe(spans["version"]),
        "left",
    ).drop(spans["instance"], spans["version"])
    value = F.when(F.col("axis") == "commit_time", F.col("t")).otherwise(F.col("seq"))
    # Rounded to the width's own precision: floor(x / w) * w leaves float noise.
    bucket = F.floor(value / F.col("width")) * F.col("width")
    keys = ("instance", "version", "method_id", "ingress", "rpc_type")
    df = (
        joined.withColumn("bucket", F.round(bucket, 3))
        .withColumn("method_id", F.explode("called_ids"))  # a row per call of a batch
        .groupBy(*keys, "axis", "width", "bucket")
        .agg(F.count(F.lit(1)).alias("calls"))
        .orderBy(*keys, "bucket")
    )
    out = to_pandas(df)
    methods = zip(out["method_id"], out["ingress"], strict=True)
    out.insert(3, "method", [method_name(i, names, via) for i, via in methods])
    # The bucket's start as a UTC time too, for people reading the table.
    timed = out["bucket"].where(out["axis"] == "commit_time")
    out.insert(out.columns.get_loc("bucket") + 1, "start", pd.to_datetime(timed, unit="s"))
    return out


_TIME_WIDTHS = (0.001, 0.01, 0.1, 1.0, 10.0, 60.0, 600.0, 3600.0, 6 * 3600.0, 86400.0)


def _width(span: float, *, seqs: bool = False) -> float:
    """The bucket width for a span (see :func:`calls_over_time`)."""
    if seqs:
        width = 1.0
        while (span + 1) / width > _MAX_BUCKETS:
            width *= 10
        return width
    for width in _TIME_WIDTHS:
        if span / width <= _MAX_BUCKETS:
            return width
    return math.ceil(span / _MAX_BUCKETS / 86400.0) * 86400.0


def method_name(method_id: Any, names: dict[int, str], ingress: Any = None) -> str:
    """A method's name from ``--service``, else ``#id``; an ingress impulse that is not a
    call (``ingress`` of :mod:`.report_ingress`) says what it is."""
    if ingress == "retention":
        return "(ingress retention setting)"
    if ingress == "undecodable":
        return "(ingress: not an envelope)"
    if method_id is None or (isinstance(method_id, float) and math.isnan(method_id)):
        return "(none)"
    return names.get(int(method_id), f"#{int(method_id)}")


def _kind() -> Any:
    F = _F()
    return F.when(F.col("msg_type") == "RPC", F.concat(F.lit("RPC "), F.col("rpc_type"))).otherwise(
        F.col("msg_type")
    )


def message_sizes(msgs: Any) -> Any:
    """The payload size distribution per message kind (``RPC async``, ...,
    ``InitialMessage``): powers-of-two bins ``[low, high]``, 0 alone. Messages of types
    without a payload are not in it."""
    F = _F()
    size = F.col("payload_size")
    # Bin b holds sizes in [2**(b-1), 2**b - 1]; bin 0 holds 0 (an empty payload).
    b = F.when(size == 0, 0).otherwise(F.floor(F.log2(size)).cast("int") + 1)
    df = (
        msgs.where(size.isNotNull())
        .withColumn("kind", _kind())
        .withColumn("bin", b)
        .groupBy("kind", "bin")
        .agg(F.count(F.lit(1)).alias("messages"), F.sum(size).alias("bytes"))
        .orderBy("kind", "bin")
    )
    out = to_pandas(df)
    out.insert(2, "low", [0 if b == 0 else 1 << (int(b) - 1) for b in out["bin"]])
    out.insert(3, "high", [0 if b == 0 else (1 << int(b)) - 1 for b in out["bin"]])
    return out.drop(columns=["bin"])


def size_stats(msgs: Any) -> Any:
    """Per message kind: messages, bytes, min, max, mean and approximate percentiles
    (Spark's ``percentile_approx``, within 0.01% of the rank)."""
    F = _F()
    size = F.col("payload_size")
    df = (
        msgs.where(size.isNotNull())
        .withColumn("kind", _kind())
        .groupBy("kind")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(size).alias("bytes"),
            F.min(size).alias("min"),
            F.percentile_approx(size, [0.5, 0.9, 0.99], 10000).alias("p"),
            F.max(size).alias("max"),
            F.mean(size).alias("mean"),
        )
        .select(
            "kind",
            "messages",
            "bytes",
            "min",
            F.col("p")[0].alias("p50"),
            F.col("p")[1].alias("p90"),
            F.col("p")[2].alias("p99"),
            "max",
            "mean",
        )
        .orderBy("kind")
    )
    return to_pandas(df)


def call_kinds(over_time: Any) -> Any:
    """Calls per instance, method, ``ingress`` and ``rpc_type``, with ``replayable``
    (async, fork): the :func:`calls_over_time` table summed over versions and buckets."""
    keys = ["instance", "method_id", "method", "ingress", "rpc_type"]
    out = over_time.groupby(keys, as_index=False, dropna=False)["calls"].sum()
    out["replayable"] = out["rpc_type"] != "impulse"
    return out.sort_values(keys, ignore_index=True)


def calls_between(msgs: Any) -> Any:
    """Calls and returns from ``sender`` to ``destination`` (the instance whose log holds
    them). A return's sender is the instance that ran the call, its destination the
    caller. Fork and impulse calls carry no sender on the wire: :data:`NO_SENDER`."""
    F = _F()
    df = (
        msgs.where((F.col("msg_type") == "RPC") & F.col("rpc_type").isNotNull())
        .withColumn("sender", F.coalesce(F.col("sender"), F.lit(NO_SENDER)))
        .groupBy("sender", "destination", "rpc_type")
        .agg(F.count(F.lit(1)).alias("messages"))
        .orderBy("sender", "destination", "rpc_type")
    )
    return to_pandas(df)


def control_messages(msgs: Any) -> Any:
    """The messages that are not calls or returns (``InitialMessage``, ``Checkpoint``,
    ``TakeCheckpoint``, ``BecomingPrimary``, ``TrimTo``, ...), per log and type, with
    where and when the first one is."""
    F = _F()
    df = (
        msgs.where(F.col("check_ok") & (F.col("msg_type") != "RPC"))
        .groupBy("instance", "version", "log_file", "msg_type")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.min("seq").alias("first_seq"),
            F.min("commit_time").alias("first_time"),
        )
        .orderBy("instance", "version", "log_file", "msg_type")
    )
    return to_pandas(df)


def logs(msgs: Any, files: list[LogFile]) -> Any:
    """One row per log file found (empty ones too): its rows' span, how it began, and the
    files beside it.

    ``start``: ``first start`` for log 1 of version 0 (or of a directory without a
    version), ``upgrade`` for log 1 of a later version, otherwise ``new log``. A
    coordinator opens log N+1 both when it takes a checkpoint while running and when it
    recovers after a restart, and writes checkpoint N+1 for it either way; no record
    says which (:func:`.report_starts.classify` tells them apart where the files do).
    ``checkpoint``: ``serverchkpt<N>`` (the state at the
    start of log N) is still on disk, and ``checkpoint_time`` its modification time;
    ``torn_copies``: tails a recovery cut from this log and kept beside it
    (``serverlog<N>.torn-*``), the traces a crash mid-write leaves.
    """
    pd = _pd()

    F = _F()
    per_log = to_pandas(
        msgs.groupBy("log_file").agg(
            F.countDistinct("offset").alias("records"),
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.when(~F.col("check_ok"), 1).otherwise(0)).alias("damaged"),
            F.min("seq").alias("first_seq"),
            F.max("seq").alias("last_seq"),
            F.min("commit_time").alias("first_time"),
            F.max("commit_time").alias("last_time"),
        )
    )
    by_file = {r["log_file"]: r for r in per_log.to_dict("records")}
    beside = _files_beside(files)
    rows = []
    for log in files:
        r = by_file.get(log.path, {})
        directory = str(Path(log.path).parent)
        chkpt = beside.get((directory, "checkpoint", log.number))
        if log.number != 1:
            start = "new log"
        else:
            start = "upgrade" if (log.version or 0) > 0 else "first start"
        rows.append(
            {
                "instance": log.instance,
                "version": log.version,
                "log_number": log.number,
                "log_file": log.path,
                "file_bytes": os.stat(log.path).st_size,
                "records": int(r.get("records") or 0),
                "messages": int(r.get("messages") or 0),
                "damaged": int(r.get("damaged") or 0),
                "first_seq": r.get("first_seq"),
                "last_seq": r.get("last_seq"),
                "first_time": r.get("first_time"),
                "last_time": r.get("last_time"),
                "start": start,
                "checkpoint": chkpt is not None,
                "checkpoint_time": chkpt,
                "torn_copies": beside.get((directory, "torn", log.number), 0),
            }
        )
    out = pd.DataFrame(rows)
    for name in ("first_seq", "last_seq"):
        out[name] = out[name].astype("Int64")
    for name in ("first_time", "last_time", "checkpoint_time"):
        out[name] = pd.to_datetime(out[name])
    return out


def _files_beside(files: list[LogFile]) -> dict[tuple[str, str, int], Any]:
    """Checkpoint modification times and torn-tail counts in the logs' directories."""
    pd = _pd()

    found: dict[tuple[str, str, int], Any] = {}
    for directory in sorted({str(Path(f.path).parent) for f in files}):
        for entry in os.scandir(directory):
            if m := _CHECKPOINT.fullmatch(entry.name):
                mtime = pd.Timestamp(entry.stat().st_mtime_ns, unit="ns")
                found[(directory, "checkpoint", int(m.group(1)))] = mtime
            elif m := _TORN.fullmatch(entry.name):
                key = (directory, "torn", int(m.group(1)))
                found[key] = found.get(key, 0) + 1
    return found
