"""Logged calls in the service's own terms, for ``ambrosia-py log show --service``.

A log holds method ids and encoded arguments; given the service's class, a call reads
as Python would write it (``add(5)``, ``deposit('alice', amount=10)``) and a return
value as its ``repr``. Decoding a ``pickle`` method's arguments unpickles what the log
holds, which runs whatever code the pickle names: the command warns, as Spark's
decoding does, and only logs you trust should be decoded this way.
"""

from __future__ import annotations

import json
import pickle
import reprlib
from typing import Any

from .. import wire
from . import codec
from .immortal import Immortal

__all__ = ["TRUST_WARNING", "ServiceDecoder"]

TRUST_WARNING = (
    "decoding the logged arguments unpickles them, which can run any code the log names: "
    "decode only logs you trust"
)

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 8
_MAX_CALL = 300


class ServiceDecoder:
    """Names and values for the method ids and payloads of ``service``'s log."""

    def __init__(self, service: type[Immortal]) -> None:
        self.service = service

    def call(self, method_id: int, data: wire.Payload) -> str | None:
        """``name(args)`` for a call to ``method_id``; None for an id the service lacks."""
        spec = self.service.rpc_methods().get(method_id)
        if spec is None:
            return None
        try:
            args, kwargs = codec.decode_args(spec.codec, data)
        except Exception as exc:
            return f"{spec.name}(<{len(data)} bytes that do not decode: {type(exc).__name__}>)"
        parts = [_repr.repr(a) for a in args] + [f"{k}={_repr.repr(v)}" for k, v in kwargs.items()]
        text = f"{spec.name}({', '.join(parts)})"
        return text if len(text) <= _MAX_CALL else text[: _MAX_CALL - 4] + "...)"

    def arguments(self, method_id: int, data: wire.Payload) -> tuple[str, dict[str, Any]] | None:
        """The method's name and the arguments its handler ran with, by parameter name
        (defaults applied), for a call to ``method_id``; None for an id the service lacks.
        Raises what decoding or binding raised (arguments that do not decode, or that do
        not fit the method's present signature). The Spark decoding's columns
        (``ambrosia_py/spark/decode.py``) are built on this."""
        spec = self.service.rpc_methods().get(method_id)
        if spec is None:
            return None
        args, kwargs = codec.decode_args(spec.codec, data)
        bound = spec.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return spec.name, dict(bound.arguments)

    def value(self, data: wire.Payload) -> str:
        """A return value or exception, by its first byte: a pickle starts with 0x80,
        the json form (a json method's value, or any exception in json) otherwise."""
        if not data:
            return "nothing"
        try:
            value: Any = pickle.loads(data) if data[0] == 0x80 else json.loads(bytes(data))
        except Exception as exc:
            return f"{len(data)} bytes that do not decode ({type(exc).__name__})"
        return _repr.repr(value)
