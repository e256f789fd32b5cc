"""Ockam routing messages and the TCP transport's framing, sans-IO.

Owns the reference's *Routing message and TCP transport*: a TransportMessage is
``version (uint, = 1) | onward_route | return_route | payload (data)``, a route is a BARE
list of addresses, an address is ``type (u8) | value (data)``. Each hop removes its own
address from the front of the onward route and, when it forwards, puts an address for
itself at the front of the return route; a reply goes back along the return route.

On a TCP connection each TransportMessage is framed with a u16 big-endian length, so a
message is at most :data:`MAX_FRAME` bytes; a larger one is refused, never truncated.
Nothing here touches a socket: :func:`frame` makes bytes, :class:`FrameReader` takes
them in any chunking.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from typing import Final, TypeAlias

import attrs

from . import bare
from .bare import Reader
from .errors import DecodeError, FrameTooLargeError, OckamError

__all__ = [
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

VERSION: Final = 1
"""The only TransportMessage version the released code speaks."""

MAX_FRAME: Final = 65535
"""The largest TransportMessage one TCP frame carries (its length prefix is a u16)."""

_PREFIX: Final = 2  # bytes of the u16 length prefix


class AddressType(enum.IntEnum):
    """The address types the stream service uses (reference, *Routing message*)."""

    LOCAL = 0
    """A worker on the same node, e.g. ``stream_service`` or ``app``."""
    TCP = 1
    """A TCP peer; the value is UTF-8 ``"host:port"``."""


def _check_u8(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 0 <= value <= 0xFF:
        raise ValueError(f"address {attribute.name} {value} outside 0..255")


@attrs.frozen
class Address:
    """One hop of a route: an address type (a u8) and its bytes.

    Types other than LOCAL and TCP are carried through unchanged: Ockam reserves the
    whole u8 range for transports, and a hub only needs to hand such routes back.
    """

    type: int = attrs.field(validator=_check_u8)
    value: bytes

    @classmethod
    def local(cls, name: str) -> Address:
        """The address of a local worker called ``name``."""
        return cls(AddressType.LOCAL, name.encode("utf-8"))

    @classmethod
    def tcp(cls, host: str, port: int) -> Address:
        """The TCP address ``host:port`` (an IPv6 host is bracketed, as a socket address
        prints)."""
        if not 0 <= port <= 0xFFFF:
            raise ValueError(f"TCP port {port} outside 0..65535")
        shown = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return cls(AddressType.TCP, f"{shown}:{port}".encode())

    @property
    def text(self) -> str:
        """The value as text, for display; bytes that are not UTF-8 show as escapes.

        Look workers up by :attr:`value`, which is exact.
        """
        return self.value.decode("utf-8", errors="backslashreplace")

    def __str__(self) -> str:
        kind = AddressType(self.type).name if self.type in (0, 1) else str(self.type)
        return f"{kind}:{self.text}"


Route: TypeAlias = tuple[Address, ...]
"""A route: the addresses a message still has to visit (or to go back through)."""


def _to_route(addresses: Iterable[Address]) -> Route:
    return tuple(addresses)


@attrs.frozen
class TransportMessage:
    """An Ockam routing message: where it goes, where replies go, and its payload."""

    version: int
    onward_route: Route = attrs.field(converter=_to_route)
    return_route: Route = attrs.field(converter=_to_route)
    payload: bytes


def _encode_address(a: Address) -> bytes:
    return bare.u8(a.type) + bare.data(a.value)


def _read_address(r: Reader, field: str) -> Address:
    return Address(r.u8(f"{field}.type"), r.data(f"{field}.value"))


def _route_size(route: Route) -> int:
    return bare.uint_size(len(route)) + sum(1 + bare.data_size(len(a.value)) for a in route)


def encode_message(msg: TransportMessage) -> bytes:
    """``msg`` as bytes: version, onward route, return route, payload."""
    return b"".join(
        (
            bare.uint(msg.version),
            bare.list_(msg.onward_route, _encode_address),
            bare.list_(msg.return_route, _encode_address),
            bare.data(msg.payload),
        )
    )


def decode_message(buf: bytes | bytearray | memoryview) -> TransportMessage:
    """A TransportMessage from exactly ``buf``; DecodeError naming field and offset.

    The version must be :data:`VERSION`; trailing bytes are an error.
    """
    r = Reader(buf, "TransportMessage")
    version = r.uint("version")
    if version != VERSION:
        raise r.error("version", 0, f"version {version}, expected {VERSION}")
    onward = r.list_("onward_route", _read_address)
    back = r.list_("return_route", _read_address)
    payload = r.data("payload")
    r.end()
    return TransportMessage(version, onward, back, payload)


def max_payload_size(onward_route: Route, return_route: Route, limit: int = MAX_FRAME) -> int:
    """The largest payload a message with these routes can carry within ``limit`` bytes.

    Raises :class:`FrameTooLargeError` if the routes alone leave no room.
    """
    fixed = bare.uint_size(VERSION) + _route_size(onward_route) + _route_size(return_route)
    # Start from the bound with a one-byte length and step down while the length
    # prefix grows: at most a few steps, as a length takes at most 10 bytes.
    size = limit - fixed - 1
    while size >= 0 and fixed + bare.data_size(size) > limit:
        size -= 1
    if size < 0:
        raise FrameTooLargeError(fixed + 1, limit)
    return size


# --- routing steps ----------------------------------------------------------------------


def hop(msg: TransportMessage, own: Address) -> TransportMessage:
    """``msg`` as received by ``own``: its onward route must start with ``own``, which
    is dropped. Raises :class:`OckamError` naming both addresses otherwise."""
    if not msg.onward_route:
        raise OckamError(f"message received by {own} has an empty onward route")
    first = msg.onward_route[0]
    if first != own:
        raise OckamError(f"message for {first} received by {own}")
    return attrs.evolve(msg, onward_route=msg.onward_route[1:])


def forward_via(msg: TransportMessage, me: Address) -> TransportMessage:
    """``msg`` forwarded by ``me``: ``me`` goes to the front of the return route."""
    return attrs.evolve(msg, return_route=(me, *msg.return_route))


def reply_to(msg: TransportMessage, payload: bytes, me: Address) -> TransportMessage:
    """A reply to ``msg`` from ``me``: back along its return route, returning to ``me``."""
    return TransportMessage(VERSION, msg.return_route, (me,), payload)


# --- TCP framing ------------------------------------------------------------------------


def frame(msg_bytes: bytes) -> bytes:
    """``msg_bytes`` with its u16 big-endian length in front.

    Raises :class:`FrameTooLargeError` over :data:`MAX_FRAME` (never truncates), and
    ValueError for an empty message, which no TransportMessage is (see
    :class:`FrameReader`).
    """
    size = len(msg_bytes)
    if size > MAX_FRAME:
        raise FrameTooLargeError(size, MAX_FRAME)
    if size == 0:
        raise ValueError("an empty message cannot be framed: a TransportMessage is >= 4 bytes")
    return size.to_bytes(_PREFIX, "big") + msg_bytes


class FrameReader:
    """Splits a TCP byte stream into frames, whatever the chunking.

    A zero-length frame is rejected: every frame holds a TransportMessage, which takes
    at least 4 bytes (version and three empty lengths), and the reference defines no
    keep-alive, so an empty frame can only be a broken peer. Errors name the offset in
    the stream; once failed, the reader raises the same error on every call.
    """

    __slots__ = ("_buf", "_failed", "_offset")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._offset = 0  # stream offset of _buf[0]
        self._failed: DecodeError | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet handed out as a frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Take ``data`` and return every frame it completes, in order."""
        if self._failed is not None:
            raise self._failed
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos = 0
        while len(buf) - pos >= _PREFIX:
            size = int.from_bytes(buf[pos : pos + _PREFIX], "big")
            if size == 0:
                self._failed = DecodeError(
                    "TcpFrame.length", self._offset + pos, "zero-length frame"
                )
                raise self._failed
            if len(buf) - pos - _PREFIX < size:
                break
            frames.append(bytes(buf[pos + _PREFIX : pos + _PREFIX + size]))
            pos += _PREFIX + size
        if pos:
            del buf[:pos]
            self._offset += pos
        return frames

    def eof(self) -> None:
        """The peer closed the connection: raise if it did so inside a frame."""
        if self._failed is not None:
            raise self._failed
        if self._buf:
            self._failed = DecodeError(
                "TcpFrame",
                self._offset,
                f"connection closed inside a frame ({len(self._buf)} bytes buffered)",
            )
            raise self._failed
