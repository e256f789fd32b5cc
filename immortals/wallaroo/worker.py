"""The Wallaroo worker as an immortal: ``ambrosia-py run immortals.wallaroo.worker``.

    ambrosia-py run immortals.wallaroo.worker --instance w1 --data-dir DATA \\
        --listen 127.0.0.1:7100 --cookie C --dialect v3 --app mypkg.apps:word_count \\
        [--max-credits N] [--refill-credits M] [--max-frame-bytes B] [--control H:P]
        [--max-connections N] [--handshake-timeout S] ... (the edges' limits)

The worker's state (:class:`~immortals.wallaroo.worker_core.WorkerCore`: connections,
streams with their points of reference, the application's state) is the immortal's,
checkpointed and replayed. The TCP edges (:mod:`immortals.wallaroo.worker_transport`,
:mod:`immortals.wallaroo.worker_control`) live outside the determinism boundary:
connection events and frames come in as impulses, logged before a handler sees them, and
replies leave as effects of the incarnation that handles them first. So an ACK leaves
only once the record holding the messages it acknowledges is durable.

Connections belong to one incarnation. Each start logs a ``start`` impulse first, with a
fresh incarnation name and the options that change what handlers do (the cookie,
dialect, credits, frame limit, application): it drops every connection of the
incarnation before (releasing their streams) and sets the configuration, so replay sees
both where they happened, before any frame of the new incarnation.

Operators (``python -m immortals.wallaroo.worker_client``, through ``--control``) read the
state, or have the worker NACK a stream or send its connectors elsewhere (MIGRATE in the
draft, RESTART in v3): those are impulses too, logged like frames.

What a peer can make the edges hold is bounded by limits whose defaults live with each
port (:data:`.worker_transport.LIMITS`, :data:`.worker_control.CONTROL_LIMITS`); every
one is an option here. They are not in the logged configuration: they decide only what
reaches the log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

import attrs

from ambrosia_py import Immortal, background, rpc
from ambrosia_py.serving import ConnectionLimits

from .codec import DEFAULT_MAX_FRAME_BYTES
from .handoff import Handed
from .worker_control import CONTROL_LIMITS, ControlServer
from .worker_core import Replies, WorkerConfig, WorkerCore, load_app
from .worker_transport import LIMITS, WorkerTransport, parse_host_port

__all__ = ["WallarooWorker"]

log = logging.getLogger("immortals.wallaroo.worker")


class WallarooWorker(Immortal):
    """A Wallaroo worker: connectors' streams in, the application's state kept."""

    class Options:
        listen: str = "127.0.0.1:7100"  # where connectors connect
        cookie: str = ""  # HELLO must carry exactly this (seed 000, footnote C0)
        dialect: str = "draft"  # draft (the seed) or v3 (released Wallaroo)
        max_credits: int = 1000  # granted by OK, topped up to by refills
        refill_credits: int = 500  # a refill once credits fall to this
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # larger lengths: ERROR (seed B1)
        app: str = ""  # module:function(state: dict, payload: bytes) -> None
        adopt_points: bool = False  # a new stream resumes from its NOTIFY's point
        control: str = ""  # HOST:PORT of the operators' port; empty: none
        # The connectors' port's limits (worker_transport.LIMITS; docs/wallaroo.md, *Limits*):
        max_connections: int = LIMITS.max_connections
        """Connector connections open at once; a newcomer evicts the oldest that has not
        yet sent a good HELLO."""
        max_pending_per_source: int = LIMITS.max_pending_per_source
        """Connections from one address that have not yet sent a good HELLO."""
        handshake_timeout: float = LIMITS.handshake_timeout_s
        """Seconds from accept to the worker's OK; also the longest gap inside a frame."""
        max_hello_bytes: int = LIMITS.max_pre_handshake_frame
        """Bytes the first frame (the HELLO) may declare."""
        idle_timeout: float = LIMITS.idle_timeout_s
        """Seconds a streaming connector may send nothing before it is closed; 0: none."""
        max_buffered_output: int = LIMITS.max_buffered_output
        """Bytes a connector may leave unread before the worker stops reading it."""
        output_stall: float = LIMITS.output_stall_s
        """Seconds a connector may stay over that bound before it is closed."""
        # The operators' port's limits (worker_control.CONTROL_LIMITS):
        control_max_connections: int = CONTROL_LIMITS.max_connections
        """Connections to the operators' port open at once."""
        control_max_line: int = CONTROL_LIMITS.max_pre_handshake_frame
        """Bytes of one request line on the operators' port."""
        control_timeout: float = CONTROL_LIMITS.handshake_timeout_s
        """Seconds from accept to the first request on the operators' port."""
        control_idle_timeout: float = CONTROL_LIMITS.idle_timeout_s
        """Seconds between requests on the operators' port before it is closed."""

    def __init__(self) -> None:
        self.core = WorkerCore()

    # -- effects: this incarnation's edges live in ``self.local`` (not state) -------------

    def _deliver(self, replies: Replies) -> None:
        """Write the replies a handler produced, and log its problems."""
        for problem in replies.problems:
            log.warning("%s", problem)
        transport: WorkerTransport | None = getattr(self.local, "transport", None)
        if transport is not None:
            for send in replies.sends:
                transport.write(send.conn, send.wire, send.close)

    def _answer(self, request: int, reply: dict[str, Any]) -> None:
        control: ControlServer | None = getattr(self.local, "control", None)
        if control is not None:
            control.answer(request, reply)

    def _out(self, replies: Replies) -> None:
        if replies.sends or replies.problems:
            self.effect(self._deliver, replies)
        for call in replies.calls:  # a move's hand-off: to the other worker, exactly once
            peer = self.proxy(call.peer, WallarooWorker)
            getattr(peer, call.method).fork(self.instance_name, *call.args)

    # -- the transport's impulses ----------------------------------------------------------

    @rpc
    def start(self, incarnation: str, config: WorkerConfig) -> None:
        """A new incarnation begins: drop the connections of the last, take the config."""
        self._out(self.core.start(incarnation, config))

    @rpc
    def opened(self, conn: str, peer: str) -> None:
        self._out(self.core.opened(conn, peer))

    @rpc
    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None:
        """The frames one read brought on ``conn`` (``now_ms``: when, for analytics of
        the log; the protocol's rules use no time)."""
        self._out(self.core.frames(conn, frames))

    @rpc
    def too_large(self, conn: str, offset: int, size: int) -> None:
        self._out(self.core.too_large(conn, offset, size))

    @rpc
    def closed(self, conn: str) -> None:
        self._out(self.core.closed(conn))

    # -- operators' commands ---------------------------------------------------------------

    @rpc
    def nack(self, request: int, stream: str, point: int | None) -> None:
        """Rewind ``stream`` (its name, or its id in decimal) to ``point`` (None: its
        start); answered to control request ``request``."""
        try:
            sid = self._stream_id(stream)
            replies = self.core.nack(sid, point)
        except ValueError as exc:
            self.effect(self._answer, request, {"ok": False, "error": str(exc)})
            return
        self._out(replies)
        self.effect(self._answer, request, {"ok": True, "stream_id": sid, "point": point})

    @rpc
    def move(self, request: int, target: str, instance: str = "") -> None:
        """Move every stream, and so every connector, to the worker ``instance`` listening
        at ``target`` (``HOST:PORT``): each stream's point goes there first, then the
        connectors follow (MIGRATE in the draft, seed 001; RESTART in v3). See
        :mod:`.handoff`."""
        try:
            host, port = parse_host_port(target)
            replies = self.core.begin_move(host, port, instance)
        except ValueError as exc:
            self.effect(self._answer, request, {"ok": False, "error": str(exc)})
            return
        self._out(replies)
        answer = {"ok": True, "streams": len(self.core.streams), "to": instance}
        self.effect(self._answer, request, answer)

    # -- another worker's calls: a move's hand-off (handoff.py) ----------------------------

    @rpc
    def expect(self, source: str, stream_ids: list[int]) -> None:
        self._out(self.core.expect(source, stream_ids))

    @rpc
    def expecting(self, peer: str, count: int) -> None:
        self._out(self.core.expecting())

    @rpc
    def adopt(self, source: str, batch: int, streams: list[Handed]) -> None:
        self._out(self.core.adopt(source, batch, streams))

    @rpc
    def adopted(self, peer: str, batch: int) -> None:
        self._out(self.core.adopted(batch))

    def _stream_id(self, stream: str) -> int:
        named = [sid for sid, s in self.core.streams.items() if s.name == stream]
        if len(named) == 1:
            return named[0]
        if stream.isdigit() and int(stream) in self.core.streams:
            return int(stream)
        raise ValueError(f"no stream named {stream!r}" if not named else f"{stream!r} is ambiguous")

    # -- the edges -------------------------------------------------------------------------

    def _command(self, request: int, body: dict[str, Any]) -> None:
        if body.get("op") == "nack":
            point = body.get("point")
            self.impulse.nack(
                request, str(body.get("stream", "")), None if point is None else int(point)
            )
        else:
            target, instance = str(body.get("target", "")), str(body.get("instance", ""))
            self.impulse.move(request, target, instance)

    def _status(self) -> dict[str, Any]:
        """The state for operators, with the connectors' port's counts (not state)."""
        status = self.core.status()
        transport: WorkerTransport | None = getattr(self.local, "transport", None)
        if transport is not None:
            status["edge"] = transport.stats()
        return status

    @background
    async def serve(self) -> None:
        opts = self.options if self.options is not None else self.make_options()
        try:
            config = WorkerConfig(
                cookie=opts.cookie.encode(),
                dialect=opts.dialect,
                max_credits=int(opts.max_credits),
                refill_credits=int(opts.refill_credits),
                max_frame_bytes=int(opts.max_frame_bytes),
                app=opts.app,
                adopt_points=bool(opts.adopt_points),
            )
            load_app(config.app)  # refuse a bad --app now, not at the first message
            host, port = parse_host_port(opts.listen)
            control_at = parse_host_port(opts.control) if opts.control else None
            limits, control_limits = _limits(opts)
        except ValueError as exc:
            raise SystemExit(f"wallaroo worker: {exc}") from None
        incarnation = os.urandom(4).hex()
        self.impulse.start(incarnation, config)  # logged before any frame of this incarnation
        transport = WorkerTransport(self.impulse, incarnation, config, limits)
        await transport.start(host, port)
        self.local.transport = transport
        where = "{}:{}".format(*transport.address)
        control = None
        if control_at is not None:
            control = ControlServer(opts.cookie, self._status, self._command, control_limits)
            await control.start(*control_at)
            self.local.control = control
            where += " control {}:{}".format(*control.address)
        print(
            f"wallaroo worker listening on {where} ({config.dialect.value})",
            file=sys.stderr,
            flush=True,
        )
        try:
            await asyncio.Event().wait()  # serve until the binding stops
        finally:
            self.local.transport = self.local.control = None
            transport.close()
            if control is not None:
                control.close()


def _limits(opts: Any) -> tuple[ConnectionLimits, ConnectionLimits]:
    """The two ports' limits from the options (ValueError naming a bad one)."""
    worker = ConnectionLimits(
        max_connections=int(opts.max_connections),
        max_pending_per_source=int(opts.max_pending_per_source),
        handshake_timeout_s=float(opts.handshake_timeout),
        max_pre_handshake_frame=int(opts.max_hello_bytes),
        idle_timeout_s=float(opts.idle_timeout),
        max_buffered_output=int(opts.max_buffered_output),
        output_stall_s=float(opts.output_stall),
    )
    control = attrs.evolve(
        CONTROL_LIMITS,
        max_connections=int(opts.control_max_connections),
        max_pre_handshake_frame=int(opts.control_max_line),
        handshake_timeout_s=float(opts.control_timeout),
        idle_timeout_s=float(opts.control_idle_timeout),
    )
    return worker, control
