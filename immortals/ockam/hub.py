"""The Ockam hub as an immortal: ``ambrosia-py run immortals.ockam.hub``.

    ambrosia-py run immortals.ockam.hub --instance hub --data-dir DATA --listen 127.0.0.1:4000

The streams, their messages and the saved indexes are the immortal's state
(:class:`~immortals.ockam.service.StreamHub`), checkpointed and replayed; sealed message
segments live in files beside the checkpoints (:mod:`immortals.ockam.segments`). The TCP
transport (:mod:`immortals.ockam.transport`) lives outside the determinism boundary:
frames come in as impulses, logged before they are handled, and replies leave as effects
of the incarnation that handles them first. A PushConfirm is therefore sent only once the
push it confirms is in the durable log. The options that change what handlers do (the
two service names, retention) are sent in as a logged ``configure`` impulse at start, so
replay sees the configuration each frame was handled with.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from ambrosia_py import Immortal, background, rpc

from .routing import Address, AddressType
from .service import HubConfig, StreamHub
from .transport import HubTransport, parse_host_port

__all__ = ["OckamHub"]

log = logging.getLogger("immortals.ockam.hub")

# This incarnation's transport: not state (connections die with the process).
_transport: HubTransport | None = None


def _send(connection: bytes, wire: bytes) -> None:
    if _transport is not None:
        _transport.write(connection, wire)


def _report(peer: str, problems: list[str]) -> None:
    for problem in problems:
        log.warning("from %s: %s", peer, problem)


class OckamHub(Immortal):
    """The stream service, stream workers and the index service of one Ockam node."""

    class Options:
        listen: str = "127.0.0.1:4000"  # where Ockam TCP clients connect
        stream_service: str = "stream_service"
        index_service: str = "stream_index_service"
        retention_messages: int = 0  # kept per stream partition; 0: no limit
        retention_seconds: float = 0.0  # maximum age of a message; 0: no limit

    def __init__(self) -> None:
        self.hub = StreamHub()
        self.frames_handled = 0

    @rpc
    def configure(self, config: HubConfig) -> None:
        """Take the configuration the hub was started with (a logged impulse)."""
        self.hub.config = config

    @rpc
    def frames(self, peer: str, now_ms: int, frames: list[bytes]) -> None:
        """Handle the frames one read from ``peer`` brought, at (logged) time ``now_ms``."""
        via = Address(AddressType.TCP, peer.encode())
        replies = self.hub.handle_frames(frames, via, now_ms)
        self.frames_handled += len(frames)
        if replies.wire:
            self.effect(_send, via.value, replies.wire)
        if replies.problems:
            self.effect(_report, peer, list(replies.problems))

    @background
    async def serve(self) -> None:
        global _transport
        opts = self.options if self.options is not None else self.make_options()
        config = HubConfig(
            opts.stream_service,
            opts.index_service,
            int(opts.retention_messages),
            int(opts.retention_seconds * 1000),
        )
        if config != self.hub.config:
            self.impulse.configure(config)  # logged before any frame of this incarnation
        host, port = parse_host_port(opts.listen)
        transport = HubTransport(self.impulse.frames)
        await transport.start(host, port)
        _transport = transport
        host, port = transport.address
        print(f"ockam hub listening on {host}:{port}", file=sys.stderr, flush=True)
        try:
            await asyncio.Event().wait()  # serve until the binding stops
        finally:
            _transport = None
            transport.close()
