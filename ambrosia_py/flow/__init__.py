"""Flow-transport framing for the links between coordinators (seed 004), sans-IO.

The ConnectPacket each side sends first, the compatibility rule, checksummed frames,
tokens, an incremental frame reader and :class:`FlowConnection`, the h11-style state
machine of one connection. Nothing here touches a socket, a clock or asyncio.
"""

from .connect import ConnectPacket, compatible, connect_packet_size
from .connection import ConnectionState, FlowConnection
from .constants import (
    COMPATIBLE_VERSION_MASK,
    CONNECT_PACKET_LENGTH,
    CONNECT_PREFIX_LENGTH,
    FLAG_IPV6,
    FRAME_HEADER_LENGTH,
    LEGACY_CONNECT_PACKET_LENGTH,
    MIN_FRAME_LENGTH,
    MIN_FULL_CONNECT_PACKET_VERSION,
    OBJECT_SERIALIZER_FLAG,
    PACKET_LIMIT,
    PROTOCOL_VERSION,
    TLS_FRAME_HEADER_LENGTH,
    TOKEN_STREAM_FLAG,
    VERSION_FLAGS_MASK,
    WELL_KNOWN_FIRST,
    WIRE_PROTOCOL_VERSION,
    WellKnown,
)
from .errors import (
    ChecksumError,
    ConnectPacketError,
    FlowError,
    FlowStateError,
    FrameLengthError,
    TruncatedFrameError,
)
from .events import ConnectionClosed, Event, FrameReceived, PeerConnected
from .frames import FlowFrame, FrameReader, encode_frame, encode_frame_bytes, frame_checksum
from .tokens import Token

__all__ = [
    "COMPATIBLE_VERSION_MASK",
    "CONNECT_PACKET_LENGTH",
    "CONNECT_PREFIX_LENGTH",
    "FLAG_IPV6",
    "FRAME_HEADER_LENGTH",
    "LEGACY_CONNECT_PACKET_LENGTH",
    "MIN_FRAME_LENGTH",
    "MIN_FULL_CONNECT_PACKET_VERSION",
    "OBJECT_SERIALIZER_FLAG",
    "PACKET_LIMIT",
    "PROTOCOL_VERSION",
    "TLS_FRAME_HEADER_LENGTH",
    "TOKEN_STREAM_FLAG",
    "VERSION_FLAGS_MASK",
    "WELL_KNOWN_FIRST",
    "WIRE_PROTOCOL_VERSION",
    "ChecksumError",
    "ConnectPacket",
    "ConnectPacketError",
    "ConnectionClosed",
    "ConnectionState",
    "Event",
    "FlowConnection",
    "FlowError",
    "FlowStateError",
    "FlowFrame",
    "FrameLengthError",
    "FrameReader",
    "FrameReceived",
    "PeerConnected",
    "Token",
    "TruncatedFrameError",
    "WellKnown",
    "compatible",
    "connect_packet_size",
    "encode_frame",
    "encode_frame_bytes",
    "frame_checksum",
]
