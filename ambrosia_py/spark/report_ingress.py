"""The analytics report's ingress calls: the method each one carries, read in Spark SQL.

A call from an ordinary program enters an immortal as an impulse to the reserved method
id :data:`~ambrosia_py.ingress.envelope.INGRESS_METHOD_ID`, its arguments an envelope
(``ambrosia_py/ingress/envelope.py``, the one definition of the layout)::

    CALL       u8 1 | u64 time | u8 k | key (k bytes, 1..255) | i32 method id | arguments
    RETENTION  u8 2 | u64 calls to keep | u64 milliseconds to keep them

(integers little-endian). The report counts a call under the method it carries, as
:func:`ambrosia_py.spark.decoded` names it, so :func:`with_ingress` reads the kind, the
key's length and the method id from the payload with SQL expressions: nothing in an
envelope's head is pickled, so this is safe for any log and always done; no Python runs
per row, and the scan keeps no payload for it. ``tests/test_analyze_names.py`` holds
these expressions to :func:`~ambrosia_py.ingress.envelope.decode_envelope`.
"""

from __future__ import annotations

import struct
from typing import Any

from ..ingress.envelope import INGRESS_METHOD_ID, EnvelopeKind

__all__ = ["INGRESS_KINDS", "with_ingress"]

# What the ``ingress`` column says of an impulse to the ingress's id; null elsewhere.
INGRESS_KINDS = ("call", "retention", "undecodable")

# Offsets and sizes of envelope.py's layout (its structs: "<BQB" | key | "<i"; "<BQQ").
_KEY_SIZE_AT = struct.calcsize("<BQ")  # the u8 key length follows the kind and time
_HEAD = struct.calcsize("<BQB")
_METHOD = struct.calcsize("<i")
_RETENTION = struct.calcsize("<BQQ")


def _byte(payload: Any, at: Any) -> Any:
    """The unsigned byte at 0-based ``at`` (int or Column) of a binary column."""
    from pyspark.sql import functions as F

    start = F.lit(at + 1) if isinstance(at, int) else at + F.lit(1)
    return F.conv(F.hex(payload.substr(start, F.lit(1))), 16, 10).cast("int")


def with_ingress(df: Any) -> Any:
    """``df`` (rows of the ``ambrosia`` data source, with ``payload``) with two columns:

    * ``ingress``: for an impulse to the ingress's id, ``call`` (a client's call),
      ``retention`` (how long the key table keeps results) or ``undecodable`` (not an
      envelope); null for every other row;
    * ``called_id``: the method a call runs: the id an ingress call carries, else the
      row's ``method_id``.
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
    # The i32 after the key, little-endian: its bytes' hex digits in reverse order.
    digits = F.hex(payload.substr(key + F.lit(_HEAD + 1), F.lit(_METHOD)))
    swapped = F.concat(*(digits.substr(2 * i + 1, 2) for i in reversed(range(_METHOD))))
    unsigned = F.conv(swapped, 16, 10).cast("long")
    signed = F.when(unsigned >= 2**31, unsigned - 2**32).otherwise(unsigned).cast("int")
    ingress = F.when(
        is_ingress,
        F.when(is_call, F.lit("call"))
        .when(is_retention, F.lit("retention"))
        .otherwise(F.lit("undecodable")),
    )
    called = F.when(is_ingress & is_call, signed).otherwise(F.col("method_id"))
    return df.withColumn("ingress", ingress).withColumn("called_id", called)
