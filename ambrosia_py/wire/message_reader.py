"""The incremental reader of the bare messages a binding sends its coordinator (no
record headers): feed bytes in chunks of any size, take complete messages out, each
Checkpoint with the blob that follows its frame. Sans-IO, as :mod:`.reader` is, whose
docstring says how both readers copy and fail."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

from .buffer import DEFAULT_MAX_CHECKPOINT_SIZE, DEFAULT_MAX_MESSAGE_SIZE, InputBuffer
from .decoding import decode_message
from .errors import (
    CheckpointSizeError,
    MalformedMessageError,
    ProtocolError,
    TruncatedInputError,
    UnknownMessageTypeError,
)
from .messages import Buffer, Checkpoint, CheckpointHeader, Direction, Message, MessageType
from .varint import decode_zigzag_int

__all__ = ["MessageReader", "RawMessage"]


@attrs.frozen
class RawMessage:
    """One framed message, undecoded: its type, and the whole frame (size prefix included).

    ``blob`` is a Checkpoint's blob, which follows its frame on the wire.
    """

    type: MessageType
    raw: bytes | memoryview = attrs.field(repr=False)
    offset: int
    blob: bytes | memoryview | None = attrs.field(default=None, repr=False)

    @property
    def data_start(self) -> int:
        """Index in ``raw`` of the first data byte (after size and type)."""
        _, pos = decode_zigzag_int(self.raw, 0)
        return pos + 1


_MESSAGE_TYPES = {int(t): t for t in MessageType}  # a lookup, not an enum call per message


class MessageReader:
    """Reads the bare messages a binding sends its coordinator (no record headers)."""

    def __init__(
        self,
        *,
        direction: Direction = Direction.TO_COORDINATOR,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        max_checkpoint_size: int = DEFAULT_MAX_CHECKPOINT_SIZE,
    ) -> None:
        self._buf = InputBuffer()
        self._direction = direction
        self._max_message = max_message_size
        self._max_checkpoint = max_checkpoint_size
        self._pending: tuple[MessageType, bytes | memoryview, int, int] | None = (
            None  # waiting for a blob
        )
        self._failed: ProtocolError | None = None

    @property
    def offset(self) -> int:
        return self._buf.offset

    def feed(self, data: Buffer) -> None:
        self._buf.feed(data)

    def close(self) -> None:
        if self._pending is not None or self._buf.available:
            raise TruncatedInputError(
                f"stream ends inside a message ({self._buf.available} bytes left over)",
                offset=self._buf.offset,
            )

    def next_frame(self) -> RawMessage | None:
        """The next complete frame (and its checkpoint blob), undecoded.

        After an error every later call raises it again: the reader never resyncs.
        """
        if self._failed is not None:
            raise self._failed
        try:
            return self._next_frame()
        except ProtocolError as exc:
            self._failed = exc
            raise

    def take_rpc_frames(self, out: list[bytes]) -> int:
        """The fast path for high-rate traffic: append to ``out`` the complete RPC frames
        at the read position whose size fits two varint bytes (under 8 KiB), as
        ``bytes``, and return the stream offset of the first.

        It stops at anything else (another type, a larger or invalid size, an incomplete
        frame), which :meth:`next_frame` then reads and checks as usual; frames taken
        here are consumed exactly as ``next_frame`` would have consumed them.
        """
        buf = self._buf
        first = buf.offset
        data = buf.data
        if self._failed is not None or self._pending is not None or not isinstance(data, bytes):
            return first
        pos = buf.pos
        end = len(data)
        most = self._max_message
        append = out.append
        while pos < end:
            try:
                n, at = decode_zigzag_int(data, pos)
            except ProtocolError:  # cut short or malformed: next_frame's to say
                break
            stop = at + n
            # Not small, rejected by next_frame, incomplete, or not an RPC.
            if at - pos > 2 or not 0 < n <= most or stop > end or data[at]:
                break
            append(data[pos:stop])
            pos = stop
        buf.pos = pos
        return first

    def _next_frame(self) -> RawMessage | None:
        buf = self._buf
        if self._pending is None:
            if not buf.available:
                return None
            start = buf.offset
            try:
                with memoryview(buf.data) as mv:
                    size, pos = decode_zigzag_int(mv, buf.pos)
            except TruncatedInputError:
                return None
            except ProtocolError as exc:
                raise exc.relocated(base=buf.consumed) from None
            if not 1 <= size <= self._max_message:
                raise MalformedMessageError(
                    f"message size {size} outside 1..{self._max_message}", offset=start
                )
            header_len = pos - buf.pos
            if buf.available < header_len + size:
                return None
            t = buf.data[pos]
            mtype = _MESSAGE_TYPES.get(t)
            if mtype is None:
                raise UnknownMessageTypeError(
                    f"unknown message type {t}", offset=start + header_len
                )
            raw = buf.take(header_len + size)
            if mtype != MessageType.CHECKPOINT:
                return RawMessage(mtype, raw, start)
            try:
                msg, _ = decode_message(raw, 0, self._direction)
            except ProtocolError as exc:
                raise exc.relocated(base=start) from None
            assert isinstance(msg, CheckpointHeader)
            if msg.length > self._max_checkpoint:
                raise CheckpointSizeError(
                    f"checkpoint of {msg.length} bytes exceeds the maximum {self._max_checkpoint}",
                    offset=start,
                )
            self._pending = (mtype, raw, start, msg.length)
        mtype, raw, start, length = self._pending
        if buf.available < length:
            return None
        self._pending = None
        return RawMessage(mtype, raw, start, buf.take(length))

    def decode(self, frame: RawMessage) -> Message:
        """Decode a frame into its message (a Checkpoint gets its blob)."""
        if frame.blob is not None:
            return Checkpoint(frame.blob)
        try:
            msg, _ = decode_message(frame.raw, 0, self._direction)
        except ProtocolError as exc:
            self._failed = exc.relocated(base=frame.offset)
            raise self._failed from None
        return msg

    def next_message(self) -> Message | None:
        frame = self.next_frame()
        return None if frame is None else self.decode(frame)

    def __iter__(self) -> Iterator[Message]:
        while (msg := self.next_message()) is not None:
            yield msg

    def messages(self, data: Buffer) -> list[Message]:
        """Feed ``data`` and return every message completed by it."""
        self.feed(data)
        return list(self)
