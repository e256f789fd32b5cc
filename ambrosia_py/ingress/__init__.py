"""The ingress: calls to an immortal's ``@rpc`` methods from ordinary programs.

``ambrosia-py run SERVICE --ingress HOST:PORT`` serves them; :mod:`ambrosia_py.client`
makes them. Every call carries an idempotency key; the immortal keeps each key's outcome
in its replayed state (:class:`KeyTable`), so a client that retries a call until it
gets an answer has it run exactly once. ``docs/ingress.md`` has the protocol byte by
byte. The protocol is sans-IO (``frames``, ``connection``, ``envelope``, ``keys``);
``server`` is the asyncio edge.
"""

from .connection import (
    MIN_SECRET_SIZE,
    TAG_SIZE,
    ClientConnection,
    ConnectionState,
    ServerConnection,
)
from .envelope import (
    INGRESS_METHOD_ID,
    CallEnvelope,
    EnvelopeKind,
    RetentionEnvelope,
    decode_envelope,
    encode_call_envelope,
    encode_retention_envelope,
)
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
    DEFAULT_MAX_CALL_FRAME,
    DEFAULT_MAX_REPLY_FRAME,
    MAGIC,
    MAX_KEY_SIZE,
    PRE_AUTH_FRAME_LIMIT,
    Call,
    FrameKind,
    FrameReader,
    Outcome,
    OutcomeKind,
    RawFrame,
    Refusal,
    RefusalReason,
    Reply,
    ServiceInfo,
)
from .keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS, KeyTable, Running
from .server import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_HOST,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_IN_FLIGHT,
    IngressServer,
    IngressSettings,
    parse_address,
)

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_HOST",
    "DEFAULT_KEEP_COUNT",
    "DEFAULT_KEEP_SECONDS",
    "DEFAULT_MAX_CALL_FRAME",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_IN_FLIGHT",
    "DEFAULT_MAX_REPLY_FRAME",
    "INGRESS_METHOD_ID",
    "MAGIC",
    "MAX_KEY_SIZE",
    "MIN_SECRET_SIZE",
    "PRE_AUTH_FRAME_LIMIT",
    "TAG_SIZE",
    "AuthenticationError",
    "Call",
    "CallEnvelope",
    "CallRefusedError",
    "CallTimeoutError",
    "ClientClosedError",
    "ClientConnection",
    "ConnectionState",
    "EnvelopeKind",
    "FrameKind",
    "FrameReader",
    "IngressError",
    "IngressProtocolError",
    "IngressServer",
    "IngressSettings",
    "KeyReusedError",
    "KeyTable",
    "Outcome",
    "OutcomeKind",
    "RawFrame",
    "Refusal",
    "RefusalReason",
    "Reply",
    "RetentionEnvelope",
    "Running",
    "ServerConnection",
    "ServiceInfo",
    "decode_envelope",
    "encode_call_envelope",
    "encode_retention_envelope",
    "parse_address",
]
