"""How arguments and return values travel: ``pickle`` (default) or ``json``.

``json`` is the format of the released Node binding: the arguments are one UTF-8 JSON
object mapping parameter names to values, so services in other languages can call ours.
Return values and exceptions travel with the method's codec too. A pickle method's
exception is the exception itself, pickled (a :class:`RemoteError` carrying its text when
it cannot be pickled). A json method's exception is one JSON object,
``{"error": type name, "message": text}``, decoded into a :class:`RemoteError` (or one
of this binding's own error classes, by name): a json method never unpickles anything
that came from outside. The json form starts with ``{`` and a pickle with ``0x80``, so a
pickle method's caller tells them apart and takes both (a handler that raises for an
unknown method id does not know the caller's codec and answers in json).
"""

from __future__ import annotations

import inspect
import json
import pickle
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from ..wire import ReturnType
from . import errors
from .errors import RemoteError
from .pickling import find_unpicklable

if TYPE_CHECKING:
    from .immortal import MethodSpec

__all__ = [
    "ArgumentEncodingError",
    "CodecName",
    "decode_args",
    "decode_exception",
    "decode_value",
    "encode_args",
    "encode_exception",
    "encode_outcome",
    "encode_value",
]

CodecName = Literal["pickle", "json"]
_PROTOCOL = pickle.HIGHEST_PROTOCOL


class ArgumentEncodingError(TypeError):
    """A call's argument cannot be encoded; the message names the method and the argument.

    A TypeError, as the pickle or json error it stands for was."""


def encode_args(
    codec: CodecName, signature: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bytes:
    """Encode a call's arguments (``signature`` excludes ``self``).

    An argument the codec refuses is an :class:`ArgumentEncodingError` naming the method
    (by ``signature``, see :func:`signature_of`) and the argument.
    """
    if codec == "json":
        bound = signature.bind(*args, **kwargs)
        try:
            return json.dumps(dict(bound.arguments), separators=(",", ":")).encode()
        except (TypeError, ValueError) as exc:
            raise _argument_error(codec, signature, args, kwargs, exc) from exc
    # A wrong call fails at the caller, not remotely. Whether a call binds depends only on
    # its shape, so each shape is checked once per signature.
    # Keyed by identity: hashing a Signature costs more than pickling small arguments.
    # The entry keeps its signature alive, so the id cannot be reused by another one.
    shape = (len(args), tuple(kwargs))
    entry = _valid_shapes.get(id(signature))
    if entry is None:
        entry = _valid_shapes[id(signature)] = (signature, set())
    if shape not in entry[1]:
        signature.bind(*args, **kwargs)
        entry[1].add(shape)
    try:
        return pickle.dumps((args, kwargs), protocol=_PROTOCOL)
    except Exception as exc:  # TypeError, PicklingError, AttributeError (a local class)...
        raise _argument_error(codec, signature, args, kwargs, exc) from exc


_valid_shapes: dict[int, tuple[inspect.Signature, set[tuple[int, tuple[str, ...]]]]] = {}


def _argument_error(
    codec: CodecName,
    signature: inspect.Signature,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    exc: Exception,
) -> ArgumentEncodingError:
    """Which argument of which method the codec refused (found only once it has)."""
    method = _method_names.get(id(signature), (signature, "a method"))[1]
    bound = signature.bind(*args, **kwargs)
    for name, value in bound.arguments.items():
        if codec == "json":
            try:
                json.dumps(value)
            except (TypeError, ValueError) as err:
                return ArgumentEncodingError(
                    f"{method}: argument {name!r} (of type {type(value).__name__}) cannot be "
                    f"encoded as json: {err}"
                )
            continue
        found = find_unpicklable(value, name, lambda v: pickle.dumps(v, protocol=_PROTOCOL))
        if found is not None:
            return ArgumentEncodingError(f"{method}: {found.describe('argument')}")
    return ArgumentEncodingError(
        f"{method}: its arguments cannot be encoded with the {codec} codec: "
        f"{type(exc).__name__}: {exc}"
    )


def decode_args(
    codec: CodecName, data: bytes | bytearray | memoryview
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The positional and keyword arguments of an incoming call."""
    if codec == "json":
        obj = json.loads(bytes(data))
        if not isinstance(obj, dict):
            raise ValueError("json arguments must be one JSON object of parameter names")
        return (), obj
    args, kwargs = pickle.loads(data)
    return tuple(args), dict(kwargs)


def encode_value(codec: CodecName, value: Any) -> bytes:
    if codec == "json":
        return json.dumps(value, separators=(",", ":")).encode()
    return pickle.dumps(value, protocol=_PROTOCOL)


def decode_value(codec: CodecName, data: bytes | bytearray | memoryview) -> Any:
    if codec == "json":
        return json.loads(bytes(data))
    return pickle.loads(data)


# The binding's own errors come back as themselves from the json form; anything else
# is a RemoteError naming the remote type. Never a class looked up by an arbitrary name.
_JSON_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        errors.BindingError,
        errors.DeterminismError,
        errors.ImpulseDuringRecoveryError,
        errors.UnknownMethodError,
        errors.RemoteError,
    )
}


def encode_outcome(
    spec: MethodSpec | None, result: Any, error: BaseException | None
) -> tuple[ReturnType, bytes]:
    """What a handler's caller gets back: its result, nothing, or its exception, encoded
    with the handler's codec. A result that cannot be encoded is an exception for the
    caller (else replay would stop there again, every time); without a method the
    caller's codec is unknown: json, which both decode."""
    if error is None and result is not None:
        assert spec is not None
        try:
            return ReturnType.VALUE, encode_value(spec.codec, result)
        except Exception as exc:
            error = errors.BindingError(f"the result of {spec.name} cannot be encoded: {exc!r}")
    if error is not None:
        return ReturnType.EXCEPTION, encode_exception(spec.codec if spec else "json", error)
    return ReturnType.NO_VALUE, b""


def encode_exception(codec: CodecName, exc: BaseException) -> bytes:
    """An exception for a caller using ``codec`` (see the module docstring)."""
    if codec == "json":
        return json.dumps(
            {"error": type(exc).__name__, "message": str(exc)}, separators=(",", ":")
        ).encode()
    try:
        data = pickle.dumps(exc, protocol=_PROTOCOL)
        pickle.loads(data)  # some exceptions pickle but cannot be rebuilt
        return data
    except Exception:
        return pickle.dumps(RemoteError(f"{type(exc).__name__}: {exc}"), protocol=_PROTOCOL)


def decode_exception(codec: CodecName, data: bytes | bytearray | memoryview) -> BaseException:
    """The exception a reply carries, decoded with the awaited method's codec.

    A json method's reply is only ever parsed as JSON, whatever its bytes.
    """
    if codec == "json" or data[:1] == b"{":
        return _exception_from_json(data)
    try:
        exc = pickle.loads(data)
    except Exception as err:
        return RemoteError(f"an exception that could not be decoded ({err})")
    return exc if isinstance(exc, BaseException) else RemoteError(repr(exc))


def _exception_from_json(data: bytes | bytearray | memoryview) -> BaseException:
    try:
        obj = json.loads(bytes(data))
    except ValueError as err:
        return RemoteError(f"an exception that is not the json form ({err})")
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("error"), str)
        and isinstance(obj.get("message"), str)
    ):
        return RemoteError(
            f"an exception in json without error and message strings: {repr(obj)[:200]}"
        )
    name, message = obj["error"], obj["message"]
    cls = _JSON_ERRORS.get(name)
    return cls(message) if cls is not None else RemoteError(f"{name}: {message}")


def signature_of(fn: Callable[..., Any]) -> inspect.Signature:
    """The signature of an @rpc method without ``self``.

    The signature remembers whose it is, so an argument that cannot be encoded is
    reported with its method's name (:func:`encode_args`).
    """
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())[1:]
    sig = sig.replace(parameters=params)
    _method_names[id(sig)] = (sig, getattr(fn, "__qualname__", repr(fn)))
    return sig


# By identity (a Signature is not weakly referable); each entry keeps its signature
# alive, so an id is never reused by another signature.
_method_names: dict[int, tuple[inspect.Signature, str]] = {}
