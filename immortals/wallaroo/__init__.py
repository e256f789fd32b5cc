"""The Wallaroo connector protocol: a connector and a worker as deterministic immortals.

Both have the services' shape (``docs/architecture.md``, *Services*). The worker:
``worker_core`` its sans-IO state and handlers (with ``worker_config``, its configuration
and the rule for a HELLO; ``worker_state``, the records they change; ``worker_move``, the
handlers of a move), ``worker`` the immortal (``ambrosia-py run
immortals.wallaroo.worker``), ``worker_transport`` its connectors' port, ``worker_control``
its operators' port, ``worker_client`` the operators' client. ``docs/wallaroo.md`` tells
its story. The connector: ``connector_core`` its sans-IO handlers (with
``connector_state``, what they keep; ``connector_actions``, what they return),
``connector`` the immortal (``ambrosia-py run immortals.wallaroo.connector``),
``connector_transport`` its edge (with ``connector_link``, its connections), ``sources``
the replayable sources it reads; ``docs/wallaroo_connector.md``. The protocol both
share, sans-IO: ``frames`` the frame classes both dialects share, ``codec`` the two
dialects (the seed's ``draft``, the default, and the released ``v3``), one table of tags
and layouts each, with :func:`encode`, :func:`decode` and the length-prefix splitting;
``states`` the connection and stream state machines as transition tables; ``errors``
the error hierarchy; ``handoff`` the state a move carries from worker to worker.
Everything public is re-exported here.
"""

from __future__ import annotations

from .codec import (
    DEFAULT_MAX_FRAME_BYTES,
    DIALECTS,
    DRAFT_VERSION,
    LENGTH_PREFIX_BYTES,
    NOTHING_SEEN,
    V3_VERSION,
    Dialect,
    DialectSpec,
    decode,
    encode,
    end_of_stream,
    stream_id_for,
)
from .connector import WallarooConnector
from .connector_actions import ConnectorConfig, MessageEncoder
from .connector_core import ConnectorCore, UnknownStreamError
from .errors import (
    EncodeError,
    FrameTooLargeError,
    InvalidBoolError,
    InvalidFlagsError,
    InvalidTextError,
    ProtocolError,
    TrailingBytesError,
    TruncatedFrameError,
    TruncatedStreamError,
    UnknownTagError,
    WallarooError,
)
from .frames import (
    Ack,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)
from .sources import Source, SourceError, open_source, stream_names
from .states import (
    ConnectionMachine,
    ConnectionState,
    Direction,
    FrameKind,
    Role,
    StreamMachine,
    StreamState,
    UnexpectedFrameError,
    kind_of,
)
from .worker import WallarooWorker
from .worker_control import ControlRequestError
from .worker_core import NoCreditsError, StreamNotOpenError, WorkerConfig, WorkerCore

__all__ = [
    # codec
    "DEFAULT_MAX_FRAME_BYTES",
    "DIALECTS",
    "DRAFT_VERSION",
    "LENGTH_PREFIX_BYTES",
    "NOTHING_SEEN",
    "V3_VERSION",
    "Dialect",
    "DialectSpec",
    "decode",
    "encode",
    "end_of_stream",
    "stream_id_for",
    # frames
    "Ack",
    "EosMessage",
    "Error",
    "Frame",
    "Hello",
    "Message",
    "MessageFlags",
    "Migrate",
    "MigrationAck",
    "Nack",
    "Notify",
    "NotifyAck",
    "Ok",
    "Restart",
    # states
    "ConnectionMachine",
    "ConnectionState",
    "Direction",
    "FrameKind",
    "Role",
    "StreamMachine",
    "StreamState",
    "UnexpectedFrameError",
    "kind_of",
    # the connector
    "ConnectorConfig",
    "ConnectorCore",
    "MessageEncoder",
    "Source",
    "WallarooConnector",
    "open_source",
    "stream_names",
    # the worker
    "WallarooWorker",
    "WorkerConfig",
    "WorkerCore",
    # errors
    "ControlRequestError",
    "EncodeError",
    "FrameTooLargeError",
    "InvalidBoolError",
    "InvalidFlagsError",
    "InvalidTextError",
    "NoCreditsError",
    "ProtocolError",
    "SourceError",
    "StreamNotOpenError",
    "TrailingBytesError",
    "TruncatedFrameError",
    "TruncatedStreamError",
    "UnknownStreamError",
    "UnknownTagError",
    "WallarooError",
]
