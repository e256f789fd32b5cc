"""The ingress's and the client's errors form one hierarchy (their public names are
pinned against docs/api.md in tests/test_public_names.py)."""

from __future__ import annotations

import ambrosia_py.client as client
import ambrosia_py.ingress as ingress


def test_every_ingress_error_is_an_ingress_error() -> None:
    errors = [getattr(ingress, n) for n in ingress.__all__ if n.endswith("Error")]
    assert len(errors) == 7
    for error in errors:
        assert issubclass(error, ingress.IngressError)
    assert issubclass(ingress.CallTimeoutError, TimeoutError)
    assert issubclass(ingress.KeyReusedError, ingress.CallRefusedError)
    assert issubclass(ingress.AuthenticationError, ingress.IngressProtocolError)


def test_the_client_raises_the_ingress_errors_and_a_connection_error_when_unreachable() -> None:
    assert issubclass(client.ServiceUnreachableError, client.IngressError)
    assert issubclass(client.ServiceUnreachableError, ConnectionError)
    assert client.IngressError is ingress.IngressError
