"""The errors the wire core raises on bad input.

Every rejection is a subclass of :class:`ProtocolError` and its message names what was
wrong and where: the byte offset within the buffer being parsed and, when known, the
sequence id of the record. Parsers never let ``IndexError``, ``struct.error`` or
``UnicodeDecodeError`` escape, and never truncate silently.
"""

from __future__ import annotations

__all__ = [
    "BatchCountError",
    "CheckBytesError",
    "CheckpointSizeError",
    "CommitterError",
    "InvalidNameError",
    "MalformedMessageError",
    "ProtocolError",
    "RecordLengthError",
    "SequenceError",
    "TruncatedInputError",
    "UnknownMessageTypeError",
    "VarintTooLongError",
]


class ProtocolError(ValueError):
    """Malformed AMBROSIA wire input. ``offset`` and ``seq`` say where, when known."""

    def __init__(self, message: str, *, offset: int | None = None, seq: int | None = None):
        where = []
        if seq is not None:
            where.append(f"record seq {seq}")
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)
        self.reason = message
        self.offset = offset
        self.seq = seq

    def relocated(self, *, base: int = 0, seq: int | None = None) -> ProtocolError:
        """The same error with its offset moved by ``base`` (and ``seq`` filled in)."""
        offset = None if self.offset is None else base + self.offset
        return type(self)(self.reason, offset=offset, seq=self.seq if seq is None else seq)


class CheckpointSizeError(ProtocolError):
    """A checkpoint blob longer than the reader's configured maximum."""


class CommitterError(ProtocolError):
    """A record whose committer id differs from the stream's."""


class TruncatedInputError(ProtocolError):
    """The input ends inside a record, a message or a field."""


class VarintTooLongError(ProtocolError):
    """A varint runs past 5 bytes (32-bit) or 10 bytes (64-bit)."""


class RecordLengthError(ProtocolError):
    """A record header states a length below 24 bytes or above the configured maximum."""


class CheckBytesError(ProtocolError):
    """A record's xxHash64 check bytes do not match its contents."""


class SequenceError(ProtocolError):
    """A logged record's sequence id is not the one after its predecessor's."""


class UnknownMessageTypeError(ProtocolError):
    """A message type byte outside the protocol's table."""


class BatchCountError(ProtocolError):
    """An RPC batch whose stated count does not match the messages it holds."""


class InvalidNameError(ProtocolError):
    """A destination or sender name that is not valid UTF-8."""


class MalformedMessageError(ProtocolError):
    """A message whose fields are inconsistent (a bad RPC type, trailing bytes, ...)."""
