"""The Ockam hub as an immortal: ``ambrosia-py run immortals.ockam.hub``.

    ambrosia-py run immortals.ockam.hub --instance hub --data-dir DATA --listen 127.0.0.1:4000

The streams, their messages and the saved indexes are the immortal's state
(:class:`~immortals.ockam.hub_core.StreamHub`), checkpointed and replayed; sealed message
segments live in files beside the checkpoints (:mod:`immortals.ockam.segments`). The TCP
transport (:mod:`immortals.ockam.hub_transport`) lives outside the determinism boundary:
frames come in as impulses, logged before they are handled, and replies leave as effects
of the incarnation that handles them first. A PushConfirm is therefore sent only once the
push it confirms is in the durable log. The options that change what handlers do (the
two service names, retention, the dialect) are sent in as a logged ``configure`` impulse
at start, so replay sees the configuration each frame was handled with.

Every ``frames`` impulse is answered with exactly one ``_send`` effect, even when there is
nothing to send: the transport counts a connection's unanswered impulses and stops
reading it past a few (:data:`~immortals.ockam.hub_transport.MAX_UNANSWERED`). The connection
limits are options (their defaults are :data:`~immortals.ockam.hub_transport.HUB_LIMITS`);
they change only what the transport admits, never what a handler does, so they are not
logged.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from ambrosia_py import Immortal, background, rpc
from ambrosia_py.serving import ConnectionLimits

from .hub_core import HubConfig, StreamHub
from .hub_transport import HUB_LIMITS, HubTransport, parse_host_port
from .routing import Address, AddressType

__all__ = ["OckamHub"]

log = logging.getLogger("immortals.ockam.hub")


class OckamHub(Immortal):
    """The stream service, stream workers and the index service of one Ockam node."""

    class Options:
        listen: str = "127.0.0.1:4000"  # where Ockam TCP clients connect
        stream_service: str = "stream_service"  # the stream service's worker address
        index_service: str = "stream_index_service"  # the index service's worker address
        retention_messages: int = 0  # kept per stream partition; 0: no limit
        retention_seconds: float = 0.0  # maximum age of a message; 0: no limit
        dialect: str = "seed"
        """Where seed 003 and the released Ockam code differ, whose index service to be:
        seed (a pair never saved gets a new record at 0; an index is the last one
        processed) or released (none, and the next index to read). Both dialects'
        protocol names are read either way; a reply uses its request's."""
        # What clients may make the hub hold (defaults: transport.HUB_LIMITS).
        max_connections: int = HUB_LIMITS.max_connections
        """Client connections open at once; a newcomer evicts the oldest that has not
        yet sent a valid frame."""
        max_pending_per_source: int = HUB_LIMITS.max_pending_per_source
        """Connections from one address that have not yet sent a valid frame."""
        handshake_timeout: float = HUB_LIMITS.handshake_timeout_s
        """Seconds from accept to a connection's first valid frame."""
        max_first_frame: int = HUB_LIMITS.max_pre_handshake_frame
        """Bytes a connection's first frame may take."""
        idle_timeout: float = HUB_LIMITS.idle_timeout_s
        """Seconds a connection may send nothing before it is closed; 0: no limit."""
        max_buffered_output: int = HUB_LIMITS.max_buffered_output
        """Bytes of replies a client may leave unread before the hub stops reading it."""
        output_stall_timeout: float = HUB_LIMITS.output_stall_s
        """Seconds a client may stay over that bound before it is closed."""

    def __init__(self) -> None:
        self.hub = StreamHub()
        self.frames_handled = 0

    # -- effects: this incarnation's transport lives in ``self.local`` (not state) --------

    def _send(self, connection: bytes, wire: bytes) -> None:
        transport: HubTransport | None = getattr(self.local, "transport", None)
        if transport is not None:
            transport.write(connection, wire)

    def _report(self, peer: str, problems: list[str]) -> None:
        transport: HubTransport | None = getattr(self.local, "transport", None)
        if transport is not None:
            transport.report(peer, problems)  # rate-limited per source
            return
        for problem in problems:
            log.warning("from %s: %s", peer, problem)

    @rpc
    def configure(self, config: HubConfig) -> None:
        """Take the configuration the hub was started with (a logged impulse)."""
        self.hub.config = config

    @rpc
    def frames(self, peer: str, now_ms: int, frames: list[bytes]) -> None:
        """Handle the frames one read from ``peer`` brought, at (logged) time ``now_ms``."""
        via = Address(AddressType.TCP, peer.encode())
        wire = b""
        try:
            replies = self.hub.handle_frames(frames, via, now_ms)
            self.frames_handled += len(frames)
            wire = replies.wire
            if replies.problems:
                self.effect(self._report, peer, list(replies.problems))
        finally:
            # Answered even with nothing (or if handling failed): the transport reads
            # the connection again only once its impulses are answered.
            self.effect(self._send, via.value, wire)

    @background
    async def serve(self) -> None:
        opts = self.options if self.options is not None else self.make_options()
        try:
            config = HubConfig(
                opts.stream_service,
                opts.index_service,
                int(opts.retention_messages),
                int(opts.retention_seconds * 1000),
                opts.dialect,
            )
            host, port = parse_host_port(opts.listen)
            limits = _limits(opts)
        except ValueError as exc:
            raise SystemExit(f"ockam hub: {exc}") from None
        if config != self.hub.config:
            self.impulse.configure(config)  # logged before any frame of this incarnation
        transport = HubTransport(self.impulse.frames, limits)
        await transport.start(host, port)
        self.local.transport = transport
        host, port = transport.address
        print(
            f"ockam hub listening on {host}:{port} ({config.dialect.value})",
            file=sys.stderr,
            flush=True,
        )
        try:
            await asyncio.Event().wait()  # serve until the binding stops
        finally:
            self.local.transport = None
            transport.close()


def _limits(opts: OckamHub.Options) -> ConnectionLimits:
    """The connection limits the options ask for (ValueError naming a bad one)."""
    return ConnectionLimits(
        max_connections=int(opts.max_connections),
        max_pending_per_source=int(opts.max_pending_per_source),
        handshake_timeout_s=float(opts.handshake_timeout),
        max_pre_handshake_frame=int(opts.max_first_frame),
        idle_timeout_s=float(opts.idle_timeout),
        max_buffered_output=int(opts.max_buffered_output),
        output_stall_s=float(opts.output_stall_timeout),
    )
