"""Opt-in: the logged calls' arguments as columns, decoded with the service's own code.

``decoded(df, Service)`` (or ``decoded(df, "module:Class")``, or a service file as
``run`` takes it) adds to rows of the ``ambrosia`` data source, batch or streaming (as
does the data source's option ``decode``, with ``decode_method``):

* ``ingress_key`` and ``ingress_call``: for a client's call through the ingress, its
  idempotency key (the bytes) and its place in its impulse (0 for a lone call; 0, 1, ...
  for the calls of a batch); null for every other row.
* ``method``: the name of the called method, for calls (``RPC`` rows that are not
  returns) whose method id the service has; an ingress impulse is taken apart
  (``ambrosia_py/ingress/envelope.py``) and names the method it carries.
* ``args_json``: the arguments the handler ran with, by parameter name, defaults
  applied, as one JSON object (values JSON cannot hold: ``bytes`` as hex, attrs and
  dataclass instances as objects, sets as lists, anything else as its ``repr``).
* ``decode_error``: why a call to one of the service's methods did not decode (bytes
  that are not its codec's, arguments that no longer fit its signature); null otherwise.
* With ``method=NAME``: one column per parameter of that method, ``arg_<parameter>``,
  each the JSON text of the argument, for the rows calling it.

An ingress impulse of kind BATCH (the calls that reached the ingress in one turn of its
event loop) is one message of the log but several calls: it becomes **one row per
call**, in the order the key table takes them, each repeating the message's columns
(``log_file``, ``offset``, ``seq``, ``msg_index``: the batch's place in the log). Its
``payload`` and ``payload_size`` are on its first call's row only (null on the others),
so a batch's bytes are not carried once per call, and sums over the rows still count
every message's bytes once. An impulse that does not decode (a call cut short, bytes
after the last) is one row, method ``(ingress)``, with ``decode_error`` naming what and
where.

Decoding is :meth:`ambrosia_py.binding.log_decode.ServiceDecoder.arguments`, the code
behind ``ambrosia-py log show --service``. A ``pickle`` method's arguments are unpickled,
which runs whatever code the pickle names: decode only logs you trust. It is never done
unless asked for. ``json`` methods are only parsed.

The decoding runs in Spark's Python workers (``mapInArrow``): a service given as a
class must be importable there by its module's name; a service given as a string is
loaded there (``ambrosia_py.binding.loading.load_service``).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
from collections.abc import Iterator
from typing import Any

import attrs

from ..binding.immortal import Immortal
from ..binding.log_decode import ServiceDecoder
from ..ingress.envelope import INGRESS_METHOD_ID, RetentionEnvelope, decode_impulse
from ..ingress.errors import IngressProtocolError
from .schema import arrow_schema

__all__ = ["DECODED_COLUMNS", "INGRESS_COLUMNS", "CallDecoder", "decoded"]

# (name, Spark SQL type, nullable): which ingress call a row is, before DECODED_COLUMNS.
INGRESS_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("ingress_key", "BINARY", True),
    ("ingress_call", "INT", True),
)

# (name, Spark SQL type, nullable), appended after the data source's columns.
DECODED_COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("method", "STRING", True),
    ("args_json", "STRING", True),
    ("decode_error", "STRING", True),
)


def _jsonable(value: Any) -> Any:
    """What ``json.dumps`` cannot take, as something it can (see the module docstring)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if attrs.has(type(value)):
        return attrs.asdict(value, recurse=False)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


def to_json(value: Any) -> str:
    return json.dumps(value, default=_jsonable, ensure_ascii=False)


def _load(service: type[Immortal] | str) -> type[Immortal]:
    if isinstance(service, str):
        from ..binding.loading import load_service

        return load_service(service)
    return service


class CallDecoder:
    """The decoded columns of one row (:meth:`row`) or of an Arrow batch (:meth:`batch`)."""

    def __init__(self, service: type[Immortal] | str, method: str | None = None) -> None:
        cls = _load(service)
        self.decoder = ServiceDecoder(cls)
        self.method = method
        self.params: tuple[str, ...] = ()
        if method is not None:
            spec = cls.rpc_methods_by_name().get(method)
            if spec is None:
                raise ValueError(
                    f"{cls.__name__} has no @rpc method {method!r} "
                    f"(it has {sorted(cls.rpc_methods_by_name())})"
                )
            self.params = tuple(spec.signature.parameters)

    def rows(
        self, msg_type: str | None, rpc_type: str | None, method_id: int | None, payload: Any
    ) -> list[tuple[Any, ...]]:
        """``(ingress_key, ingress_call, method, args_json, decode_error, *arg_columns)``
        for each call one data source row holds: one per call of a BATCH ingress impulse,
        in order, and exactly one for every other row (a batch of no calls included)."""
        plain = (None,) * (5 + len(self.params))
        if msg_type != "RPC" or rpc_type in (None, "return") or method_id is None:
            return [plain]
        data = bytes(payload or b"")
        if method_id != INGRESS_METHOD_ID or rpc_type != "impulse":
            return [(None, None, *self._arguments(method_id, data))]
        try:
            impulse = decode_impulse(data)
        except IngressProtocolError as exc:
            return [(None, None, "(ingress)", None, _error(exc), *plain[5:])]
        if isinstance(impulse, RetentionEnvelope) or not impulse.calls:
            return [plain]  # a retention setting, or a batch of nothing: no call
        return [
            (call.key, index, *self._arguments(call.method_id, call.args))
            for index, call in enumerate(impulse.calls)
        ]

    def row(
        self, msg_type: str | None, rpc_type: str | None, method_id: int | None, payload: Any
    ) -> tuple[str | None, ...]:
        """``(method, args_json, decode_error, *arg_columns)`` of a row holding at most one
        call; a BATCH ingress impulse of several calls raises ``ValueError``, naming
        :meth:`rows`, which gives one per call."""
        found = self.rows(msg_type, rpc_type, method_id, payload)
        if len(found) != 1:
            raise ValueError(
                f"a BATCH ingress impulse holding {len(found)} calls: rows() gives one per call"
            )
        return tuple(found[0][2:])

    def _arguments(self, method_id: int, data: bytes) -> tuple[str | None, ...]:
        """``(method, args_json, decode_error, *arg_columns)`` of one call."""
        none = (None,) * (3 + len(self.params))
        try:
            found = self.decoder.arguments(method_id, data)
        except Exception as exc:
            spec = self.decoder.service.rpc_methods()[method_id]
            return (spec.name, None, _error(exc), *none[3:])
        if found is None:
            return none
        name, arguments = found
        try:
            text = to_json(arguments)
            params = [
                to_json(arguments[p]) if name == self.method and p in arguments else None
                for p in self.params
            ]
        except (TypeError, ValueError) as exc:
            return (name, None, _error(exc), *none[3:])
        return (name, text, None, *params)

    def columns(self) -> list[tuple[str, str, bool]]:
        return [
            *INGRESS_COLUMNS,
            *DECODED_COLUMNS,
            *((f"arg_{p}", "STRING", True) for p in self.params),
        ]

    def batch(self, batch: Any) -> Any:
        """``batch`` (an Arrow record batch of data source rows) with the columns added:
        a row per call, so a BATCH ingress impulse's row becomes one per call (its
        payload kept on the first only; see the module docstring)."""
        import pyarrow as pa  # type: ignore[import-untyped]
        import pyarrow.compute as pc  # type: ignore[import-untyped]

        values = zip(
            *(batch.column(name).to_pylist() for name in ("msg_type", "rpc_type", "method_id")),
            batch.column("payload").to_pylist(),
            strict=True,
        )
        per_row = [self.rows(*v) for v in values]
        rows = [r for found in per_row for r in found]
        if len(rows) != batch.num_rows:
            taken = [i for i, found in enumerate(per_row) for _ in found]
            batch = batch.take(pa.array(taken, pa.int64()))
            later = pa.array([bool(r[1]) for r in rows], pa.bool_())  # ingress_call > 0
            for name in ("payload", "payload_size"):
                at = batch.schema.get_field_index(name)
                column = batch.column(at)
                kept = pc.if_else(later, pa.scalar(None, column.type), column)
                batch = batch.set_column(at, batch.schema.field(at), kept)
        schema = batch.schema
        arrays = [batch.column(i) for i in range(batch.num_columns)]
        for i, field in enumerate(arrow_schema(tuple(self.columns()))):
            schema = schema.append(field)
            arrays.append(pa.array([r[i] for r in rows], field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _map(service: type[Immortal] | str, method: str | None, batches: Iterator[Any]) -> Any:
    decoder = CallDecoder(service, method)  # once per partition, in the worker
    for batch in batches:
        yield decoder.batch(batch)


def decoded(df: Any, service: type[Immortal] | str, *, method: str | None = None) -> Any:
    """``df`` (rows of the ``ambrosia`` data source) with the decoded columns added (see
    the module docstring). Unpickles logged arguments: only for logs you trust."""
    from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

    decoder = CallDecoder(service, method)  # checks the service and method here, at once
    missing = {"msg_type", "rpc_type", "method_id", "payload"} - set(df.columns)
    if missing:
        raise ValueError(f"decoded() needs the data source's columns; missing {sorted(missing)}")
    types = {"BINARY": BinaryType(), "INT": IntegerType(), "STRING": StringType()}
    fields = [StructField(name, types[kind], True) for name, kind, _ in decoder.columns()]
    schema = StructType([*df.schema.fields, *fields])
    return df.mapInArrow(functools.partial(_map, service, method), schema)
