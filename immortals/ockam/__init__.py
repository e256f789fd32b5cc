"""The Ockam stream service as an immortal hub, and a client for it.

The hub has the services' shape (``docs/architecture.md``, *Services*): ``hub_core``
is its core, sans-IO (the stream service, the stream workers and the index service:
state and handlers), ``hub`` the immortal (``ambrosia-py run immortals.ockam.hub``),
``hub_transport`` its TCP server, ``hub_client`` what a program uses to talk to it
(with ``hub_connection``, one connection). The protocol they share, sans-IO: ``bare``
the BARE primitives, ``messages`` the stream-service messages (seed 003) and both
dialects' protocol names, ``codec`` their payloads, ``routing`` the Ockam routing
messages and the TCP transport's u16 framing, ``pushes`` the pushes' fast paths,
``errors`` the error hierarchy, ``indexes`` the index service's records and their
meaning in each dialect, ``segments`` where messages are kept. ``docs/ockam.md`` tells
the whole story. Everything public is re-exported here.
"""

from __future__ import annotations

from .codec import (
    ANSWERED_WITH,
    PROTOCOLS,
    SEED_PROTOCOL_NAMES,
    BasePayload,
    CreatePartitionedRequest,
    CreateStreamRequest,
    Dialect,
    Direction,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionedInit,
    PartitionIndex,
    Protocol,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    Request,
    Response,
    SaveIndex,
    SavePartitionIndex,
    Status,
    StreamMessage,
    decode_payload,
    decode_request,
    decode_request_with_dialect,
    decode_response,
    encode,
    encode_payload,
    encoded_size,
    protocol_name,
    pull_response_fitting,
)
from .errors import DecodeError, FrameTooLargeError, OckamError, UnknownProtocolError
from .hub import OckamHub
from .hub_client import Consumer, HubError, OckamClient, Publisher, Stream
from .hub_core import HubConfig, Outcome, StreamHub
from .routing import (
    MAX_FRAME,
    VERSION,
    Address,
    AddressType,
    FrameReader,
    Route,
    TransportMessage,
    decode_message,
    encode_message,
    forward_via,
    frame,
    hop,
    max_payload_size,
    reply_to,
)
from .segments import Segment, SegmentError, StreamLog

__all__ = [
    # the hub, its state and the client
    "Consumer",
    "HubConfig",
    "HubError",
    "OckamClient",
    "OckamHub",
    "Outcome",
    "Publisher",
    "Segment",
    "SegmentError",
    "Stream",
    "StreamHub",
    "StreamLog",
    # codec
    "ANSWERED_WITH",
    "PROTOCOLS",
    "SEED_PROTOCOL_NAMES",
    "BasePayload",
    "CreatePartitionedRequest",
    "CreateStreamRequest",
    "Dialect",
    "Direction",
    "Error",
    "GetIndex",
    "GetPartitionIndex",
    "Index",
    "Init",
    "PartitionIndex",
    "PartitionedInit",
    "Protocol",
    "PullRequest",
    "PullResponse",
    "PushConfirm",
    "PushRequest",
    "Request",
    "Response",
    "SaveIndex",
    "SavePartitionIndex",
    "Status",
    "StreamMessage",
    "decode_payload",
    "decode_request",
    "decode_request_with_dialect",
    "decode_response",
    "encode",
    "encode_payload",
    "encoded_size",
    "protocol_name",
    "pull_response_fitting",
    # errors
    "DecodeError",
    "FrameTooLargeError",
    "OckamError",
    "UnknownProtocolError",
    # routing
    "MAX_FRAME",
    "VERSION",
    "Address",
    "AddressType",
    "FrameReader",
    "Route",
    "TransportMessage",
    "decode_message",
    "encode_message",
    "forward_via",
    "frame",
    "hop",
    "max_payload_size",
    "reply_to",
]
