"""The errors the Ockam codecs raise.

Everything here derives from :class:`OckamError`. Bad input is a :class:`DecodeError`
that names the struct field it was reading (``"PushRequest.data"``), the byte offset in
the buffer being decoded, and what was wrong; parsers never let ``IndexError`` or
``UnicodeDecodeError`` escape. A message too large for one TCP frame is a
:class:`FrameTooLargeError`, never a truncation (reference, *Routing message and TCP
transport*).
"""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "FrameTooLargeError",
    "OckamError",
    "UnknownProtocolError",
]


class OckamError(Exception):
    """Base of every error the Ockam codecs, routing and services raise."""


class DecodeError(OckamError):
    """Malformed BARE, payload or routing input.

    ``what`` is the field path (``"stream_push request PushRequest.data"``), ``offset``
    the byte offset in the buffer being decoded, ``reason`` what was wrong there.
    """

    def __init__(self, what: str, offset: int, reason: str) -> None:
        super().__init__(f"{what} at offset {offset}: {reason}")
        self.what = what
        self.offset = offset
        self.reason = reason

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, str]]:
        # Keeps the error picklable with its three attributes (the default would
        # rebuild it from the single formatted message).
        return (type(self), (self.what, self.offset, self.reason))


class UnknownProtocolError(DecodeError):
    """A BasePayload whose protocol name is not one we know in that direction."""

    def __init__(self, protocol: str, offset: int, direction: str) -> None:
        super().__init__(
            "BasePayload.protocol",
            offset,
            f"unknown protocol {protocol!r} for a {direction}",
        )
        self.protocol = protocol
        self.direction = direction

    def __reduce__(self) -> tuple[type[DecodeError], tuple[str, int, str]]:
        return (type(self), (self.protocol, self.offset, self.direction))


class FrameTooLargeError(OckamError):
    """A message longer than one TCP frame can carry (``size`` > ``limit``)."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"a {size}-byte message does not fit in one TCP frame (limit {limit} bytes)"
        )
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[type[FrameTooLargeError], tuple[int, int]]:
        return (type(self), (self.size, self.limit))
