"""The public surfaces of ``ambrosia_py.client`` and ``ambrosia_py.ingress`` are pinned:
changing them is a deliberate act (as tests/test_public_api.py does for wire and flow)."""

from __future__ import annotations

import pytest

import ambrosia_py.client as client
import ambrosia_py.ingress as ingress

CLIENT_API = [
    "AsyncClient",
    "AuthenticationError",
    "CallRefusedError",
    "CallTimeoutError",
    "Client",
    "ClientClosedError",
    "DEFAULT_TIMEOUT",
    "IngressError",
    "IngressProtocolError",
    "KeyReusedError",
    "ServiceInfo",
    "ServiceUnreachableError",
    "tls_context",
]

INGRESS_API = [
    "AuthenticationError",
    "Call",
    "CallEnvelope",
    "CallRefusedError",
    "CallTimeoutError",
    "ClientClosedError",
    "ClientConnection",
    "ConnectionState",
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_HOST",
    "DEFAULT_KEEP_COUNT",
    "DEFAULT_KEEP_SECONDS",
    "DEFAULT_MAX_CALL_FRAME",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_REPLY_FRAME",
    "EnvelopeKind",
    "FrameKind",
    "FrameReader",
    "INGRESS_METHOD_ID",
    "IngressError",
    "IngressProtocolError",
    "IngressServer",
    "IngressSettings",
    "KeyReusedError",
    "KeyTable",
    "MAGIC",
    "MAX_KEY_SIZE",
    "MIN_SECRET_SIZE",
    "Outcome",
    "OutcomeKind",
    "PRE_AUTH_FRAME_LIMIT",
    "RawFrame",
    "Refusal",
    "RefusalReason",
    "Reply",
    "RetentionEnvelope",
    "Running",
    "ServerConnection",
    "ServiceInfo",
    "TAG_SIZE",
    "decode_envelope",
    "encode_call_envelope",
    "encode_retention_envelope",
    "parse_address",
]


@pytest.mark.parametrize(
    ("module", "api"), [(client, CLIENT_API), (ingress, INGRESS_API)], ids=["client", "ingress"]
)
def test_all_is_pinned_and_star_import_yields_exactly_it(module: object, api: list[str]) -> None:
    names: list[str] = module.__all__  # type: ignore[attr-defined]
    assert sorted(names) == sorted(api)
    assert len(set(names)) == len(names), "duplicate names in __all__"
    namespace: dict[str, object] = {}
    exec(f"from {module.__name__} import *", namespace)  # type: ignore[attr-defined]
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(api)


def test_every_ingress_error_is_an_ingress_error() -> None:
    errors = [getattr(ingress, n) for n in INGRESS_API if n.endswith("Error")]
    assert len(errors) == 7
    for error in errors:
        assert issubclass(error, ingress.IngressError)
    assert issubclass(ingress.CallTimeoutError, TimeoutError)
    assert issubclass(ingress.KeyReusedError, ingress.CallRefusedError)
    assert issubclass(ingress.AuthenticationError, ingress.IngressProtocolError)
