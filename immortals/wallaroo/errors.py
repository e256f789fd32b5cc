"""The errors the Wallaroo connector codec raises.

Everything derives from :class:`WallarooError`. Bad input from a peer is a
:class:`ProtocolError` naming the dialect, the frame and field being read
(``"Message.flags"``, ``"Frame.length"`` before the tag is known), the byte offset in the
stream where the bad field (or byte) starts, and what was wrong. Readers never let
``IndexError`` or ``UnicodeDecodeError`` escape and never resynchronise after an error:
the seed's answer to bad input is ERROR and a close (seed 000, *Protocol State Machine*).

What we are asked to send but cannot is an :class:`EncodeError` (also a ``ValueError``):
a frame or field the dialect does not have, a value outside its field's width, or a frame
over the size limit. It names the frame, the field and the dialect.
"""

from __future__ import annotations

__all__ = [
    "EncodeError",
    "FrameTooLargeError",
    "InvalidBoolError",
    "InvalidFlagsError",
    "InvalidTextError",
    "ProtocolError",
    "TrailingBytesError",
    "TruncatedFrameError",
    "TruncatedStreamError",
    "UnknownStreamError",
    "UnknownTagError",
    "WallarooError",
]


class WallarooError(Exception):
    """Base of every error the Wallaroo connector codec and services raise."""


class ProtocolError(WallarooError):
    """Malformed input from a peer.

    ``dialect`` is the dialect's name, ``frame`` the frame class being read (``"Frame"``
    for the length prefix and tag), ``field`` the field (None for the frame as a whole),
    ``offset`` the byte offset in the stream, ``reason`` what was wrong there.
    """

    def __init__(
        self, dialect: str, frame: str, field: str | None, offset: int, reason: str
    ) -> None:
        what = frame if field is None else f"{frame}.{field}"
        super().__init__(f"{dialect} {what} at offset {offset}: {reason}")
        self.dialect = dialect
        self.frame = frame
        self.field = field
        self.offset = offset
        self.reason = reason

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str, str | None, int, str]]:
        # Keeps the error picklable with its attributes (the default would rebuild it
        # from the single formatted message).
        return (type(self), (self.dialect, self.frame, self.field, self.offset, self.reason))


class FrameTooLargeError(ProtocolError):
    """A length prefix over the reader's maximum, refused before the body is buffered
    (seed 000, footnote B1)."""

    def __init__(self, dialect: str, offset: int, size: int, limit: int) -> None:
        super().__init__(
            dialect, "Frame", "length", offset, f"frame of {size} bytes over the limit of {limit}"
        )
        self.size = size
        self.limit = limit

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, int, int, int]]:  # type: ignore[override]
        return (type(self), (self.dialect, self.offset, self.size, self.limit))


class UnknownTagError(ProtocolError):
    """A tag byte that is not in the dialect's table."""

    def __init__(self, dialect: str, offset: int, tag: int) -> None:
        super().__init__(dialect, "Frame", "tag", offset, f"unknown tag 0x{tag:02x}")
        self.tag = tag

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, int, int]]:  # type: ignore[override]
        return (type(self), (self.dialect, self.offset, self.tag))


class TruncatedFrameError(ProtocolError):
    """A field, or a length or count, that runs past the end of its frame; or a frame
    too short to hold a tag."""


class TrailingBytesError(ProtocolError):
    """Bytes left in a frame after its last field."""


class InvalidBoolError(ProtocolError):
    """A u8 boolean other than 0 or 1."""


class InvalidTextError(ProtocolError):
    """Bytes that are not UTF-8 in a field the protocol says is text."""


class InvalidFlagsError(ProtocolError):
    """Message flags with reserved bits set, or a combination with no layout."""


class TruncatedStreamError(ProtocolError):
    """The stream ended inside a frame: ``received`` of its ``declared`` bytes (length
    prefix included) arrived; ``declared`` is None when the prefix itself is cut."""

    def __init__(
        self, dialect: str, offset: int, received: int, declared: int | None, prefix: int = 4
    ) -> None:
        if declared is None:
            field, reason = "length", f"stream ended after {received} of a {prefix}-byte length"
        else:
            field, reason = None, f"stream ended after {received} of the frame's {declared} bytes"
        super().__init__(dialect, "Frame", field, offset, reason)
        self.received = received
        self.declared = declared
        self.prefix = prefix

    def __reduce__(  # type: ignore[override]
        self,
    ) -> tuple[type[ProtocolError], tuple[str, int, int, int | None, int]]:
        return (
            type(self),
            (self.dialect, self.offset, self.received, self.declared, self.prefix),
        )


class UnknownStreamError(ProtocolError):
    """A frame from the worker naming a stream this connector never introduced."""

    def __init__(self, dialect: str, frame: str, offset: int, stream_id: int) -> None:
        reason = f"stream {stream_id} was never notified by this connector"
        super().__init__(dialect, frame, "stream_id", offset, reason)
        self.stream_id = stream_id

    def __reduce__(self) -> tuple[type[ProtocolError], tuple[str, str, int, int]]:  # type: ignore[override]
        return (type(self), (self.dialect, self.frame, self.offset, self.stream_id))


class EncodeError(WallarooError, ValueError):
    """A frame :func:`~.codec.encode` cannot write in that dialect.

    ``frame`` is the frame class, ``field`` the field (None for the frame as a whole),
    ``dialect`` the dialect's name, ``reason`` why.
    """

    def __init__(self, frame: str, field: str | None, dialect: str, reason: str) -> None:
        what = frame if field is None else f"{frame}.{field}"
        super().__init__(f"{what} cannot be encoded in {dialect}: {reason}")
        self.frame = frame
        self.field = field
        self.dialect = dialect
        self.reason = reason

    def __reduce__(self) -> tuple[type[EncodeError], tuple[str, str | None, str, str]]:
        return (type(self), (self.frame, self.field, self.dialect, self.reason))
