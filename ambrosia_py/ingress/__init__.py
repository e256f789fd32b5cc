"""The ingress: calls to an immortal's ``@rpc`` methods from ordinary programs.

``ambrosia-py run SERVICE --ingress HOST:PORT`` serves them; :mod:`ambrosia_py.client`
makes them. Every call carries an idempotency key; the immortal keeps each key's outcome
in its replayed state (:class:`KeyTable`, the dispatcher's ingress hook:
``binding/hooks.py``), so a client that retries a call until it gets an answer has it
run exactly once. ``docs/ingress.md`` has the protocol byte by byte. The protocol is
sans-IO (``frames``, ``connection``, ``envelope``, ``keys``); ``server`` and ``peer``
are the asyncio edge. ``docs/api.md`` lists the public names; the rest is imported from
its modules.
"""

from .connection import ClientConnection, ConnectionState, ServerConnection
from .envelope import INGRESS_METHOD_ID
from .errors import (
    AuthenticationError,
    CallRefusedError,
    CallTimeoutError,
    ClientClosedError,
    IngressError,
    IngressProtocolError,
    KeyReusedError,
)
from .frames import (
    PRE_AUTH_FRAME_LIMIT,
    Call,
    Outcome,
    OutcomeKind,
    Refusal,
    RefusalReason,
    Reply,
    ServiceInfo,
)
from .keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS, KeyTable
from .server import IngressServer, IngressSettings

__all__ = [
    "DEFAULT_KEEP_COUNT",
    "DEFAULT_KEEP_SECONDS",
    "INGRESS_METHOD_ID",
    "PRE_AUTH_FRAME_LIMIT",
    "AuthenticationError",
    "Call",
    "CallRefusedError",
    "CallTimeoutError",
    "ClientClosedError",
    "ClientConnection",
    "ConnectionState",
    "IngressError",
    "IngressProtocolError",
    "IngressServer",
    "IngressSettings",
    "KeyReusedError",
    "KeyTable",
    "Outcome",
    "OutcomeKind",
    "Refusal",
    "RefusalReason",
    "Reply",
    "ServerConnection",
    "ServiceInfo",
]
