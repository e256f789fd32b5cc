"""What a client does around the wire, without I/O: the method, its arguments checked
against its signature, the key, the secret, and the answer turned back into a value or
the handler's exception."""

from __future__ import annotations

import inspect
import os
import secrets
import ssl
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..binding import codec
from ..binding.errors import UnknownMethodError
from ..binding.immortal import MethodSpec, rpc_spec
from ..coordinator.links.config import (
    DEFAULT_SECRET_NAME,
    SECRET_ENV,
    LinkSettings,
    LinkSetupError,
    load_secret,
)
from ..coordinator.storage.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR
from ..ingress.connection import TAG_SIZE
from ..ingress.errors import CallRefusedError, IngressError, KeyReusedError
from ..ingress.frames import (
    MAX_KEY_SIZE,
    Outcome,
    OutcomeKind,
    Refusal,
    RefusalReason,
    ServiceInfo,
    call_frame_length,
)
from ..ingress.keys import describe_key
from ..ingress.server import parse_address

__all__ = [
    "DEFAULT_DATA_DIR",
    "DEFAULT_KEY_SIZE",
    "call_key",
    "check_size",
    "client_address",
    "client_secret",
    "encode_call",
    "method_spec",
    "result_of",
    "tls_context",
    "tls_refused",
]

DEFAULT_KEY_SIZE = 16  # random bytes of a key the client makes up


def tls_context(
    cert: str | Path | None = None, key: str | Path | None = None, ca: str | Path | None = None
) -> ssl.SSLContext:
    """A client's TLS context for an ingress the service runs with ``--tls-cert``.

    ``ca``: the service's certificate must chain to it (without it, TLS only encrypts,
    as between coordinators). ``cert`` (and ``key``, if not in the same file): the
    client's certificate, which a service with ``--tls-ca`` requires. Host names are not
    checked, as between coordinators: the secret's handshake says who answers.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        if cert is not None:
            ctx.load_cert_chain(cert, key)
        if ca is not None:
            ctx.load_verify_locations(ca)
    except (OSError, ssl.SSLError) as exc:
        raise IngressError(f"TLS certificate {cert} / key {key} / CA {ca}: {exc}") from None
    ctx.verify_mode = ssl.CERT_REQUIRED if ca is not None else ssl.CERT_NONE
    return ctx


def tls_refused(exc: BaseException) -> bool:
    """A TLS failure that trying again cannot mend: a certificate one side refused (the
    service's does not chain to our CA, or it refused ours or its absence)."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    reason = getattr(exc, "reason", None) if isinstance(exc, ssl.SSLError) else None
    return isinstance(reason, str) and ("CERTIFICATE" in reason or "UNKNOWN_CA" in reason)


def method_spec(method: Callable[..., Any]) -> tuple[MethodSpec, str]:
    """The @rpc spec of ``Service.method``, and its name for messages."""
    spec = rpc_spec(method)
    label = getattr(method, "__qualname__", repr(method))
    if spec is None:
        raise TypeError(
            f"{label} is not an @rpc method: call(Service.method, ...) takes a method of an "
            "Immortal class marked with @rpc"
        )
    return spec, label


def encode_call(
    spec: MethodSpec, label: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bytes:
    """The arguments in the method's codec, bound to its signature first: a call that
    does not fit fails here, naming the method and the argument, and nothing is sent."""
    try:  # binds the call to the signature first (once per shape of call)
        return codec.encode_args(spec.codec, spec.signature, args, kwargs)
    except Exception as exc:
        try:
            spec.signature.bind(*args, **kwargs)
        except TypeError as wrong:
            raise TypeError(f"{label}{_plain(spec.signature)}: {wrong}") from None
        bad = _unencodable(spec, args, kwargs)
        raise TypeError(
            f"{label}: argument {bad} cannot be encoded with the {spec.codec} codec: {exc}"
        ) from exc


def _plain(signature: inspect.Signature) -> inspect.Signature:
    """The signature without annotations: ``(token, times=1)``."""
    empty = inspect.Parameter.empty
    return signature.replace(
        parameters=[p.replace(annotation=empty) for p in signature.parameters.values()],
        return_annotation=empty,
    )


def _unencodable(spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The first argument the codec refuses, by name (for the message)."""
    bound = spec.signature.bind(*args, **kwargs)
    for name, value in bound.arguments.items():
        try:
            codec.encode_value(spec.codec, value)
        except Exception:
            return repr(name)
    return "(one of them)"


class _Keys:
    """The keys a client makes up: 16 random bytes each, cut from one read of the
    system's random source per :data:`_KEYS_PER_READ` keys. A read per key was a system
    call per call, and with many threads calling each one gives up the interpreter lock
    and waits to take it back. A forked child starts with none of its parent's bytes,
    which would give both processes the same keys."""

    _lock: threading.Lock
    _bytes: bytes
    _at: int

    def __init__(self) -> None:
        self.forget()

    def take(self) -> bytes:
        with self._lock:
            at = self._at
            if at >= len(self._bytes):
                self._bytes, at = secrets.token_bytes(DEFAULT_KEY_SIZE * _KEYS_PER_READ), 0
            self._at = at + DEFAULT_KEY_SIZE
            return self._bytes[at : at + DEFAULT_KEY_SIZE]

    def forget(self) -> None:
        """Start afresh (in a forked child: the parent's bytes and lock are not its own)."""
        self._lock = threading.Lock()
        self._bytes = b""
        self._at = 0


_KEYS_PER_READ = 256
_keys = _Keys()
os.register_at_fork(after_in_child=_keys.forget)


def call_key(key: str | bytes | None) -> bytes:
    """The key as bytes: a string's UTF-8, bytes as they are, or 16 fresh random bytes."""
    if key is None:
        return _keys.take()
    if isinstance(key, str):
        raw = key.encode()
    elif isinstance(key, bytes | bytearray | memoryview):
        raw = bytes(key)
    else:
        raise TypeError(f"an idempotency key is a str or bytes, not {type(key).__name__}")
    if not 1 <= len(raw) <= MAX_KEY_SIZE:
        raise ValueError(f"an idempotency key of {len(raw)} bytes: it needs 1 to {MAX_KEY_SIZE}")
    return raw


def check_size(label: str, key: bytes, data: bytes, info: ServiceInfo) -> None:
    """Refuse a call larger than the service takes (it said so in its WELCOME), before
    it is sent: :class:`CallRefusedError`."""
    size = call_frame_length(len(key), len(data), TAG_SIZE)
    if size > info.max_call_frame:
        raise CallRefusedError(
            f"{label}: a call of {size} bytes (its arguments {len(data)}); "
            f"the service takes calls of at most {info.max_call_frame}",
            reason="TOO_LARGE",
        )


def client_address(address: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(address, tuple):
        host, port = address
        return str(host), int(port)
    return parse_address(address)


def client_secret(
    secret_file: str | Path | None, data_dir: str | Path | None
) -> tuple[bytes, Path]:
    """The cluster secret and where it came from: ``secret_file``; else the service's
    data dir's ``link-secret`` (``data_dir``); else ``$AMBROSIA_SECRET_FILE``; else
    ``link-secret`` in ``run``'s default data dir (``$AMBROSIA_DATA_DIR``, else
    ``./ambrosia-data``). Never made here. A secret another user owns or could replace
    is refused, as the service refuses it (``coordinator/storage/ownership.py``)."""
    if secret_file is not None:
        path = Path(secret_file)
    elif data_dir is not None:
        path = Path(data_dir) / DEFAULT_SECRET_NAME
    elif os.environ.get(SECRET_ENV):
        path = Path(os.environ[SECRET_ENV])
    else:
        path = Path(os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR) / DEFAULT_SECRET_NAME
    if not os.path.lexists(path):  # a link is not followed here: load_secret checks it
        raise IngressError(
            f"no cluster secret at {path}: give the client secret_file= (the service's "
            "--secret-file) or data_dir= (the service's --data-dir, where its coordinator "
            "made link-secret on its first start)"
        )
    try:
        return load_secret(LinkSettings(secret_file=path), path.parent), path
    except LinkSetupError as exc:
        raise IngressError(str(exc)) from None


def result_of(
    spec: MethodSpec, label: str, key: bytes, answer: Outcome | Refusal, where: str
) -> Any:
    """The value an answer carries; raises the handler's exception or the refusal."""
    if isinstance(answer, Refusal):
        message = f"{label} at {where}: {answer.message}"
        if answer.reason == RefusalReason.KEY_REUSED:
            raise KeyReusedError(message, reason=answer.reason.name)
        if answer.reason == RefusalReason.UNKNOWN_METHOD:
            raise UnknownMethodError(message)
        raise CallRefusedError(message, reason=answer.reason.name)
    if answer.kind == OutcomeKind.NO_VALUE:
        return None
    if answer.kind == OutcomeKind.VALUE:
        return codec.decode_value(spec.codec, answer.value)
    exc = codec.decode_exception(spec.codec, answer.value)
    exc.add_note(f"raised by {label} at {where} (ingress call, key {describe_key(key)})")
    raise exc
