"""Opt-in: the logged calls' arguments as columns, decoded with the service's own code.

``decoded(df, Service)`` (or ``decoded(df, "module:Class")``, or a service file as
``run`` takes it) adds to rows of the ``ambrosia`` data source, batch or streaming (as
does the data source's option ``decode``, with ``decode_method``):

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
from ..ingress.envelope import INGRESS_METHOD_ID, CallEnvelope, decode_envelope

__all__ = ["DECODED_COLUMNS", "CallDecoder", "decoded"]

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

    def row(
        self, msg_type: str | None, rpc_type: str | None, method_id: int | None, payload: Any
    ) -> tuple[str | None, ...]:
        """``(method, args_json, decode_error, *arg_columns)`` of one row."""
        none = (None,) * (3 + len(self.params))
        if msg_type != "RPC" or rpc_type in (None, "return") or method_id is None:
            return none
        data = bytes(payload or b"")
        if method_id == INGRESS_METHOD_ID and rpc_type == "impulse":
            try:
                envelope = decode_envelope(data)
            except Exception as exc:
                return ("(ingress)", None, _error(exc), *none[3:])
            if not isinstance(envelope, CallEnvelope):
                return none  # a retention setting, not a call
            method_id, data = envelope.method_id, envelope.args
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
        return [*DECODED_COLUMNS, *((f"arg_{p}", "STRING", True) for p in self.params)]

    def batch(self, batch: Any) -> Any:
        """``batch`` (an Arrow record batch of data source rows) with the columns added."""
        import pyarrow as pa  # type: ignore[import-untyped]

        values = zip(
            *(batch.column(name).to_pylist() for name in ("msg_type", "rpc_type", "method_id")),
            batch.column("payload").to_pylist(),
            strict=True,
        )
        rows = [self.row(*v) for v in values]
        schema = batch.schema
        arrays = [batch.column(i) for i in range(batch.num_columns)]
        for i, (name, _, _) in enumerate(self.columns()):
            schema = schema.append(pa.field(name, pa.string()))
            arrays.append(pa.array([r[i] for r in rows], pa.string()))
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
    from pyspark.sql.types import StringType, StructField, StructType

    decoder = CallDecoder(service, method)  # checks the service and method here, at once
    missing = {"msg_type", "rpc_type", "method_id", "payload"} - set(df.columns)
    if missing:
        raise ValueError(f"decoded() needs the data source's columns; missing {sorted(missing)}")
    fields = [StructField(name, StringType(), True) for name, _, _ in decoder.columns()]
    schema = StructType([*df.schema.fields, *fields])
    return df.mapInArrow(functools.partial(_map, service, method), schema)
