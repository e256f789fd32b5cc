"""The ConnectPacket each side sends first, and the compatibility rule (seed 004,
*ConnectPacket* and *Protocol compatibility*; reference, *ConnectPacket*, *Compatibility*).

Layout, every field little-endian (the reference wins over the seed: IPv4 is LE too)::

    u32 length of what follows (40)  | u64 protocol version (top 4 bits: flags)
    u16 canonical remote port        | u64 connection id
    u32 canonical remote IPv4        | u16 connect-packet flags | 16 bytes IPv6

Versions below :data:`MIN_FULL_CONNECT_PACKET_VERSION` end after the IPv4 field (length
22); such a packet can hold no flags and no IPv6 address. A length above 40, or one that
disagrees with the version, is rejected.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs

from .constants import (
    COMPATIBLE_VERSION_MASK,
    CONNECT_PACKET_LENGTH,
    CONNECT_PREFIX_LENGTH,
    LEGACY_CONNECT_PACKET_LENGTH,
    MIN_FULL_CONNECT_PACKET_VERSION,
    VERSION_FLAGS_MASK,
    WIRE_PROTOCOL_VERSION,
    Buffer,
)
from .errors import ConnectPacketError

__all__ = ["ConnectPacket", "compatible", "connect_packet_size"]

_PREFIX = struct.Struct("<IQH")  # length, version, port: the first 14 bytes
_LEGACY = struct.Struct("<IQHQI")  # ... connection id, IPv4
_FULL = struct.Struct("<IQHQIH16s")  # ... flags, IPv6
_NO_IPV6 = bytes(16)


def _bits(n: int) -> Any:
    top = (1 << n) - 1

    def check(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int):
            raise TypeError(f"ConnectPacket.{attribute.name} must be an int")
        if not 0 <= value <= top:
            raise ValueError(f"ConnectPacket.{attribute.name} {value} does not fit in {n} bits")

    return check


def _ipv6(instance: ConnectPacket, _attribute: attrs.Attribute[bytes], value: bytes) -> None:
    if not isinstance(value, bytes) or len(value) != 16:
        raise ValueError(f"ConnectPacket.ipv6 must be 16 bytes, not {value!r}")
    if not _is_full(instance.protocol_version) and (instance.flags or value != _NO_IPV6):
        raise ValueError(
            f"protocol version {instance.protocol_version:#018x} predates the flags and IPv6 "
            "fields; they must be 0"
        )


def _is_full(protocol_version: int) -> bool:
    return protocol_version & ~VERSION_FLAGS_MASK >= MIN_FULL_CONNECT_PACKET_VERSION


def compatible(a_version: int, b_version: int) -> bool:
    """Whether two protocol versions can talk: flags masked off, equal but for the low 16 bits."""
    return a_version & COMPATIBLE_VERSION_MASK == b_version & COMPATIBLE_VERSION_MASK


def connect_packet_size(prefix: Buffer) -> int:
    """The whole size (length field included) of the ConnectPacket that starts with ``prefix``.

    ``prefix`` holds at least the first 14 bytes (length, version, port). Raises
    :class:`ConnectPacketError` if the length is larger than 40 or disagrees with the version.
    """
    with memoryview(prefix) as mv, mv.cast("B") as data:
        if len(data) < CONNECT_PREFIX_LENGTH:
            raise ConnectPacketError(
                f"ConnectPacket needs {CONNECT_PREFIX_LENGTH} bytes to be sized, "
                f"{len(data)} present",
                offset=0,
            )
        length, version, _port = _PREFIX.unpack_from(data, 0)
    if length > CONNECT_PACKET_LENGTH:
        raise ConnectPacketError(
            f"ConnectPacket length {length} is larger than {CONNECT_PACKET_LENGTH}", offset=0
        )
    expected = CONNECT_PACKET_LENGTH if _is_full(version) else LEGACY_CONNECT_PACKET_LENGTH
    if length != expected:
        raise ConnectPacketError(
            f"ConnectPacket length {length} disagrees with protocol version {version:#018x}, "
            f"which needs {expected}",
            offset=0,
        )
    return 4 + int(length)


@attrs.frozen
class ConnectPacket:
    """The first thing each side of a connection sends: who it is and what it speaks.

    ``protocol_version`` is the full u64 as sent, flag bits included; ``ipv6`` is the
    address in network byte order (``ipaddress.IPv6Address.packed``), used when
    ``flags & FLAG_IPV6``. A version below :data:`MIN_FULL_CONNECT_PACKET_VERSION` cannot
    carry flags or an IPv6 address.
    """

    protocol_version: int = attrs.field(validator=_bits(64), repr=hex)
    canonical_port: int = attrs.field(validator=_bits(16))
    connection_id: int = attrs.field(validator=_bits(64), repr=hex)
    canonical_ipv4: int = attrs.field(validator=_bits(32), repr=hex)
    flags: int = attrs.field(default=0, validator=_bits(16))
    ipv6: bytes = attrs.field(default=_NO_IPV6, validator=_ipv6)

    @classmethod
    def current(
        cls,
        *,
        canonical_port: int,
        connection_id: int,
        canonical_ipv4: int,
        flags: int = 0,
        ipv6: bytes = _NO_IPV6,
    ) -> ConnectPacket:
        """A packet at our protocol version, as we send it (:data:`WIRE_PROTOCOL_VERSION`)."""
        return cls(
            WIRE_PROTOCOL_VERSION, canonical_port, connection_id, canonical_ipv4, flags, ipv6
        )

    @property
    def version(self) -> int:
        """The protocol version with the flag bits masked off."""
        return self.protocol_version & ~VERSION_FLAGS_MASK

    def encode(self) -> bytes:
        """The packet on the wire: 44 bytes (length field 40), or 26 for a legacy version."""
        if _is_full(self.protocol_version):
            return _FULL.pack(
                CONNECT_PACKET_LENGTH,
                self.protocol_version,
                self.canonical_port,
                self.connection_id,
                self.canonical_ipv4,
                self.flags,
                self.ipv6,
            )
        return _LEGACY.pack(
            LEGACY_CONNECT_PACKET_LENGTH,
            self.protocol_version,
            self.canonical_port,
            self.connection_id,
            self.canonical_ipv4,
        )

    @classmethod
    def decode(cls, data: Buffer) -> ConnectPacket:
        """The packet in ``data``, which must hold exactly one complete ConnectPacket."""
        with memoryview(data) as mv, mv.cast("B") as buf:
            if len(buf) >= 4 and _PREFIX.size > len(buf):
                # Too short to size by version, but a bad length is still worth naming.
                (length,) = struct.unpack_from("<I", buf, 0)
                if length > CONNECT_PACKET_LENGTH:
                    raise ConnectPacketError(
                        f"ConnectPacket length {length} is larger than {CONNECT_PACKET_LENGTH}",
                        offset=0,
                    )
            size = connect_packet_size(buf)
            if len(buf) != size:
                what = "truncated" if len(buf) < size else "followed by extra bytes"
                raise ConnectPacketError(
                    f"ConnectPacket of {size} bytes is {what}: {len(buf)} bytes given", offset=0
                )
            if size == _FULL.size:
                _, version, port, conn_id, ip4, flags, ip6 = _FULL.unpack_from(buf, 0)
                return cls(version, port, conn_id, ip4, flags, ip6)
            _, version, port, conn_id, ip4 = _LEGACY.unpack_from(buf, 0)
            return cls(version, port, conn_id, ip4)
