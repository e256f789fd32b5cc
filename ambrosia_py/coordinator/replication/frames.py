"""Frames of the replicated log's messages (:mod:`.messages`) from a byte stream, sans-IO:
each length checked against a bound before any of its frame is buffered, each body
decoded strictly."""

from __future__ import annotations

from ...wire.errors import ProtocolError, TruncatedInputError
from ...wire.varint import decode_uvarint
from .errors import ReplicationProtocolError
from .fields import MAX_VARINT
from .messages import DEFAULT_MAX_FRAME, Buffer, Message, decode_body

__all__ = ["FrameReader", "decode_frame", "frame_extent"]


def frame_extent(
    buf: bytes | bytearray | memoryview, at: int, max_frame: int, name: str, trailer: int = 0
) -> tuple[int, int] | None:
    """Where the frame at the start of ``buf`` lies: ``(pos, end)``, its body from
    ``pos`` (after the length prefix) and its end after ``trailer`` more bytes (a tag),
    once all of it is in; None until then. A length that does not decode, or declares
    more than ``max_frame``, is refused as soon as its varint is in, naming ``name`` and
    the stream offset ``at`` of ``buf``'s first byte."""
    try:
        length, pos = decode_uvarint(buf, 0, None, MAX_VARINT)
    except TruncatedInputError:
        return None  # fewer than 10 bytes, the last with its high bit set
    except ProtocolError as exc:
        raise ReplicationProtocolError(f"{name}: length: {exc.reason}", offset=at) from None
    if length > max_frame:
        raise ReplicationProtocolError(
            f"{name}: {length} bytes, over the limit of {max_frame}", offset=at
        )
    end = pos + length + trailer
    return None if len(buf) < end else (pos, end)


def decode_frame(frame: Buffer, max_frame: int = DEFAULT_MAX_FRAME) -> Message:
    """The message in ``frame``, exactly one whole frame (length prefix included)."""
    reader = FrameReader(max_frame)
    reader.receive_data(frame)
    msg = reader.next_message()
    if msg is None:
        raise ReplicationProtocolError(
            f"frame cut short: {len(frame)} bytes hold no whole frame", offset=len(frame)
        )
    if reader.buffered:
        raise ReplicationProtocolError(
            f"{reader.buffered} bytes after the frame", offset=len(frame) - reader.buffered
        )
    return msg


class FrameReader:
    """Frames from a byte stream, sans-IO: :meth:`receive_data` what arrived,
    :meth:`next_message` until it returns None. A declared length over ``max_frame`` is
    refused as soon as its varint is in, before any of the frame is buffered. After an
    error the reader refuses everything: the connection is to be closed."""

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._consumed = 0  # stream offset of self._buf[0]
        self._broken: ReplicationProtocolError | None = None

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def receive_data(self, data: Buffer) -> None:
        if self._broken is not None:
            raise self._broken
        self._buf += data

    def next_message(self) -> Message | None:
        if self._broken is not None:
            raise self._broken
        try:
            return self._next()
        except ReplicationProtocolError as exc:
            self._broken = exc
            raise

    def _next(self) -> Message | None:
        buf = self._buf
        extent = frame_extent(buf, self._consumed, self.max_frame, "frame") if buf else None
        if extent is None:
            return None
        pos, end = extent
        with memoryview(buf) as view:
            frame = bytes(view[pos:end])  # the one copy: records are views of it
        base = self._consumed + pos
        del buf[:end]
        self._consumed += end
        return decode_body(memoryview(frame), base)
