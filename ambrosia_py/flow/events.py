"""The events a :class:`~ambrosia_py.flow.FlowConnection` reports, as frozen values."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from .connect import ConnectPacket
from .tokens import Token

__all__ = ["ConnectionClosed", "Event", "FrameReceived", "PeerConnected"]


@attrs.frozen
class PeerConnected:
    """The peer's ConnectPacket arrived (once per connection).

    ``compatible`` says whether its version can talk to ours; if not, nothing it sends
    afterwards is parsed or delivered, and only pings may be sent to it.
    """

    packet: ConnectPacket
    compatible: bool


@attrs.frozen
class FrameReceived:
    """A verified frame from a compatible peer. ``message`` is a ``bytes`` copy of its own."""

    token: Token
    message: bytes = attrs.field(repr=lambda m: f"<{len(m)} bytes>")


@attrs.frozen
class ConnectionClosed:
    """The peer ended the stream. ``clean`` unless it ended inside a packet or frame."""

    clean: bool


Event: TypeAlias = PeerConnected | FrameReceived | ConnectionClosed
"""Anything :meth:`FlowConnection.receive_data` returns."""
