"""The analytics report's ingress calls: the method each one carries, read in Spark SQL.

A call from an ordinary program enters an immortal as an impulse to the reserved method
id :data:`~ambrosia_py.ingress.envelope.INGRESS_METHOD_ID`, its arguments an envelope
(``ambrosia_py/ingress/envelope.py``, the one definition of the layout)::

    CALL       u8 1 | u64 time | u8 k | key (k bytes, 1..255) | i32 method id | arguments
    RETENTION  u8 2 | u64 calls to keep | u64 milliseconds to keep them
    BATCH      u8 3 | u64 time | u32 n | n times (u8 k | key (k) | i32 method id
               | u32 a | arguments (a))

(integers little-endian). The report counts a call under the method it carries, as
:func:`ambrosia_py.spark.decoded` names it, so :func:`with_ingress` reads the kind, the
keys' lengths and the method ids from the payload with SQL expressions: nothing in an
envelope's head is pickled, so this is safe for any log and always done; no Python runs
per row, and the scan keeps no payload for it. A BATCH (the calls of one turn of the
ingress's event loop) is walked call by call with Spark's ``aggregate`` over its count,
and is what :func:`~ambrosia_py.ingress.envelope.decode_impulse` accepts: every call
whole, with a key, and nothing after the last; anything else is ``undecodable``, as a
whole. ``tests/test_analyze_names.py`` and ``tests/test_spark_batches.py`` hold these
expressions to the envelope's own decoder.
"""

from __future__ import annotations

import struct
from typing import Any

from ..ingress.envelope import INGRESS_METHOD_ID, EnvelopeKind

__all__ = ["INGRESS_KINDS", "with_ingress"]

# What the ``ingress`` column says of an impulse to the ingress's id; null elsewhere.
INGRESS_KINDS = ("call", "retention", "undecodable")

# Offsets and sizes of envelope.py's layout (its structs: "<BQB" | key | "<i"; "<BQQ";
# "<BQI" then per call "<B" | key | "<iI" | arguments).
_KEY_SIZE_AT = struct.calcsize("<BQ")  # the u8 key length follows the kind and time
_HEAD = struct.calcsize("<BQB")
_METHOD = struct.calcsize("<i")
_RETENTION = struct.calcsize("<BQQ")
_COUNT_AT = struct.calcsize("<BQ")  # a batch's u32 number of calls follows kind and time
_BATCH_HEAD = struct.calcsize("<BQI")
_ARGS_SIZE = struct.calcsize("<I")
# The fewest bytes a batch's call takes (key length, a 1-byte key, method id, args size):
# a count that could not fit is refused before anything is walked.
_SMALLEST_CALL = 1 + 1 + _METHOD + _ARGS_SIZE
_BATCH_COLUMN = "__ingress_batch_methods"


def _byte(payload: Any, at: Any) -> Any:
    """The unsigned byte at 0-based ``at`` (int or Column) of a binary column."""
    from pyspark.sql import functions as F

    start = F.lit(at + 1) if isinstance(at, int) else (at + F.lit(1)).cast("int")
    return F.conv(F.hex(payload.substr(start, F.lit(1))), 16, 10).cast("int")


def _unsigned(payload: Any, at: Any, size: int) -> Any:
    """The little-endian unsigned integer of ``size`` bytes at 0-based ``at`` (int or
    Column), as a long: its bytes' hex digits in reverse order."""
    from pyspark.sql import functions as F

    start = F.lit(at + 1) if isinstance(at, int) else (at + F.lit(1)).cast("int")
    digits = F.hex(payload.substr(start, F.lit(size)))
    swapped = F.concat(*(digits.substr(2 * i + 1, 2) for i in reversed(range(size))))
    return F.conv(swapped, 16, 10).cast("long")


def _signed32(unsigned: Any) -> Any:
    from pyspark.sql import functions as F

    return F.when(unsigned >= 2**31, unsigned - 2**32).otherwise(unsigned).cast("int")


def _batch_methods(payload: Any, size: Any) -> Any:
    """The method ids of a BATCH envelope's calls, in order, or null when it is not one
    that decodes: a call cut short, an empty key, or bytes after the last call.

    The walk is Spark's ``aggregate`` over the calls, its state the offset of the next
    call, whether all so far were whole, and the ids read; the caller evaluates it only
    for rows whose count could fit in their payload, so a corrupt count never makes a
    large array."""
    from pyspark.sql import functions as F

    count = _unsigned(payload, _COUNT_AT, _ARGS_SIZE)
    start = F.struct(
        F.lit(_BATCH_HEAD).cast("long").alias("at"),
        F.lit(True).alias("ok"),
        F.array().cast("array<int>").alias("ids"),
    )

    def step(state: Any, _: Any) -> Any:
        at = state["at"]
        key = _byte(payload, at)
        tail = at + F.lit(1) + key  # the method id, then the arguments' size
        after = tail + F.lit(_METHOD + _ARGS_SIZE) + _unsigned(payload, tail + _METHOD, _ARGS_SIZE)
        whole = state["ok"] & (key >= 1) & (tail + (_METHOD + _ARGS_SIZE) <= size)
        whole = whole & (after <= size)
        ids = F.concat(state["ids"], F.array(_signed32(_unsigned(payload, tail, _METHOD))))
        done = F.struct(after.alias("at"), F.lit(True).alias("ok"), ids.alias("ids"))
        stuck = F.struct(at.alias("at"), F.lit(False).alias("ok"), state["ids"].alias("ids"))
        return F.when(whole, done).otherwise(stuck)

    def finish(state: Any) -> Any:
        return F.when(state["ok"] & (state["at"] == size), state["ids"])

    calls = F.array_repeat(F.lit(0), count.cast("int"))
    fits = count <= (size - F.lit(_BATCH_HEAD)) / F.lit(_SMALLEST_CALL)
    return F.when(fits, F.aggregate(calls, start, step, finish))


def with_ingress(df: Any) -> Any:
    """``df`` (rows of the ``ambrosia`` data source, with ``payload``) with three columns:

    * ``ingress``: for an impulse to the ingress's id, ``call`` (a client's call, or a
      batch of them), ``retention`` (how long the key table keeps results) or
      ``undecodable`` (not an envelope); null for every other row;
    * ``called_id``: the method a call runs: the id an ingress call carries, else the
      row's ``method_id``; null for a batch, whose calls run several;
    * ``called_ids``: the methods the row's calls run, one per call: a batch's ids in
      order, else ``[called_id]``. Counting calls is counting these.
    """
    from pyspark.sql import functions as F

    payload = F.col("payload")
    size = F.length(payload)
    kind = _byte(payload, 0)
    key = _byte(payload, _KEY_SIZE_AT)
    is_ingress = (
        (F.col("msg_type") == "RPC")
        & (F.col("rpc_type") == "impulse")
        & (F.col("method_id") == INGRESS_METHOD_ID)
    )
    is_call = (
        (kind == int(EnvelopeKind.CALL))
        & (size >= _HEAD + _METHOD)
        & (key >= 1)
        & (size >= key + (_HEAD + _METHOD))
    )
    is_retention = (kind == int(EnvelopeKind.RETENTION)) & (size == _RETENTION)
    is_batch_kind = (kind == int(EnvelopeKind.BATCH)) & (size >= _BATCH_HEAD)
    batch = F.col(_BATCH_COLUMN)  # computed once per row, dropped at the end
    is_batch = batch.isNotNull()
    # The i32 after the key.
    signed = _signed32(_unsigned(payload, key + F.lit(_HEAD), _METHOD))
    ingress = F.when(
        is_ingress,
        F.when(is_call | is_batch, F.lit("call"))
        .when(is_retention, F.lit("retention"))
        .otherwise(F.lit("undecodable")),
    )
    called = (
        F.when(is_ingress & is_call, signed)
        .when(is_batch, F.lit(None).cast("int"))
        .otherwise(F.col("method_id"))
    )
    return (
        df.withColumn(
            _BATCH_COLUMN, F.when(is_ingress & is_batch_kind, _batch_methods(payload, size))
        )
        .withColumn("ingress", ingress)
        .withColumn("called_id", called)
        .withColumn("called_ids", F.when(is_batch, batch).otherwise(F.array(F.col("called_id"))))
        .drop(_BATCH_COLUMN)
    )
