"""The errors the flow transport core raises.

Every rejection is a :class:`FlowError` whose message names what was wrong and where: the
offset in the byte stream of the ConnectPacket or frame at fault (``None`` when the error
is not about received bytes, e.g. a frame too long to send). Parsers never let
``IndexError`` or ``struct.error`` escape, and after an error a reader or connection never
resyncs: the connection is to be closed (reference, Frames: Limits).
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = [
    "ChecksumError",
    "ConnectPacketError",
    "FlowError",
    "FlowStateError",
    "FrameLengthError",
    "TruncatedFrameError",
]


class FlowError(Exception):
    """Bad flow-transport input or use. ``reason`` says what, ``offset`` where (or None)."""

    def __init__(self, reason: str, *, offset: int | None = None) -> None:
        super().__init__(reason if offset is None else f"{reason} (stream offset {offset})")
        self.reason = reason
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (functools.partial(type(self), offset=self.offset), (self.reason,))


class ConnectPacketError(FlowError):
    """A ConnectPacket that is truncated, too long, or whose length disagrees with its version."""


class FrameLengthError(FlowError):
    """A frame length below 16 (no room for the token) or above the configured limit."""


class ChecksumError(FlowError):
    """A frame whose XXH3-64 checksum does not match its token and message."""


class TruncatedFrameError(FlowError):
    """Input that ends inside a token or a frame."""


class FlowStateError(FlowError):
    """A call the connection's state does not allow (send before the peer's ConnectPacket)."""
