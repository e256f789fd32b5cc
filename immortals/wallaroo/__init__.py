"""The Wallaroo connector protocol: a connector and a worker as deterministic immortals.

Sans-IO: ``frames`` holds the frame classes both dialects share, ``codec`` the two
dialects (the seed's ``draft``, the default, and the released ``v3``), one table of tags
and layouts each, with :func:`encode` and :func:`decode`; ``framing`` the incremental
:class:`FrameReader`; ``states`` the connection and stream state machines as transition
tables; ``errors`` the error hierarchy. The worker: ``worker_core`` its sans-IO state and
handlers, ``worker_config`` its configuration and the rule for a HELLO, ``worker`` the
immortal (``ambrosia-py run immortals.wallaroo.worker``), ``transport`` its connectors'
port, ``control`` its operators' port, ``worker_ctl`` the operators' client.
``docs/wallaroo.md`` tells the whole story. The connector: ``connector_core`` its
sans-IO handlers, ``connector_state`` what they keep, ``connector_actions`` what they
return, ``connector`` the immortal (``ambrosia-py run immortals.wallaroo.connector``)
and its edge, ``connector_link`` its connections, ``sources`` the replayable sources it
reads. Everything public is re-exported here.
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
from .control import ControlRequestError
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
from .framing import FrameReader
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
    "FrameReader",
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
