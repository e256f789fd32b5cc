"""Calling immortals from ordinary programs, exactly once: :class:`Client`, :class:`AsyncClient`.

    from ambrosia_py.client import Client

    with Client("127.0.0.1:7000", data_dir="ambrosia-data") as client:
        total = client.call(Counter.add, 5)  # Counter.add's result, or its exception

The service runs with ``ambrosia-py run SERVICE --ingress 127.0.0.1:7000``. Every call
carries an idempotency key (made up by the client unless given); the client sends it
again until it gets an answer, across restarts of the service and its coordinator, and
the service runs each key's call once: exactly-once effect, at-least-once answer.
``docs/ingress.md`` explains; ``docs/api.md`` lists the public names. The errors a call
raises are here too, and in :mod:`ambrosia_py.errors` with every other error users catch.
"""

from ..binding.errors import UnknownMethodError
from ..ingress.errors import (
    AuthenticationError,
    CallRefusedError,
    CallTimeoutError,
    ClientClosedError,
    IngressError,
    IngressProtocolError,
    KeyReusedError,
    ServiceUnreachableError,
)
from ..ingress.frames import ServiceInfo
from .asyncio_client import AsyncClient
from .calls import tls_context
from .sync_client import Client

__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "CallRefusedError",
    "CallTimeoutError",
    "Client",
    "ClientClosedError",
    "IngressError",
    "IngressProtocolError",
    "KeyReusedError",
    "ServiceInfo",
    "ServiceUnreachableError",
    "UnknownMethodError",
    "tls_context",
]
