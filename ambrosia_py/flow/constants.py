"""Every number of the flow transport wire format, in one place.

Sources: seed 004 (*ConnectPacket*, *Framing and checksumming protocol*, *Endpoint / token
/ UID layout*, *Well-known endpoints*) and ``shared/reference/flow-transport.md``, which
wins where the two disagree (the IPv4 field is little-endian, the checksum is XXH3-64).
"""

from __future__ import annotations

import enum
from typing import TypeAlias

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
    "Buffer",
    "WellKnown",
]

Buffer: TypeAlias = bytes | bytearray | memoryview
"""What the codecs accept as input bytes."""

# --- frames (reference, Frames (no TLS); Limits) ------------------------------------------

PACKET_LIMIT = 100 * 1024 * 1024
"""The largest frame length (token + message) either side accepts: 100 MiB."""

MIN_FRAME_LENGTH = 16
"""The smallest frame length: a token and an empty message."""

FRAME_HEADER_LENGTH = 28
"""u32 length | u64 checksum | 16-byte token: the bytes before a frame's message."""

TLS_FRAME_HEADER_LENGTH = 20
"""u32 length | 16-byte token: a frame's header over TLS, where the checksum is left out."""

# --- ConnectPacket (reference, ConnectPacket) ---------------------------------------------

CONNECT_PACKET_LENGTH = 40
"""The length field of a full ConnectPacket: the 40 bytes after the field (44 in all)."""

LEGACY_CONNECT_PACKET_LENGTH = 22
"""The length field of a pre-6.3 ConnectPacket, which ends after the IPv4 field."""

CONNECT_PREFIX_LENGTH = 14
"""u32 length | u64 version | u16 port: what a receiver waits for before the rest."""

FLAG_IPV6 = 1
"""Connect-packet flag bit 0: the IPv6 field holds the canonical address."""

# --- protocol versions (seed 004, ConnectPacket; Protocol compatibility) ------------------

VERSION_FLAGS_MASK = 0xF000_0000_0000_0000
"""The top 4 bits of the u64 protocol version are flags, masked off before comparing."""

OBJECT_SERIALIZER_FLAG = 0x1000_0000_0000_0000
"""Version flag bit 60, set by every current sender."""

COMPATIBLE_VERSION_MASK = 0x0FFF_FFFF_FFFF_0000
"""Compatible versions agree on these bits: all but the flags and the low 16 bits."""

MIN_FULL_CONNECT_PACKET_VERSION = 0x0FDB_00B0_6103_0000
"""From this version on a ConnectPacket carries the flags and IPv6 fields."""

PROTOCOL_VERSION = 0x0FDB_00B0_7300_0000
"""Our protocol version, flags clear."""

WIRE_PROTOCOL_VERSION = PROTOCOL_VERSION | OBJECT_SERIALIZER_FLAG
"""The u64 we put in our ConnectPacket: our version with the object-serializer flag."""

# --- tokens (seed 004, Endpoint / token / UID layout; Well-known endpoints) ---------------

TOKEN_STREAM_FLAG = 1
"""Bit 0 of a token's ``first`` marks a stream endpoint."""

WELL_KNOWN_FIRST = 0xFFFF_FFFF_FFFF_FFFF
"""The ``first`` half of every well-known token."""


class WellKnown(enum.IntEnum):
    """Well-known endpoint indices: the ``second`` half of a well-known token."""

    ENDPOINT_NOT_FOUND = 0
    PING = 1
    UNAUTHORIZED = 2
    PROTOCOL_INFO = 10
