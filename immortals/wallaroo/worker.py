"""The Wallaroo worker as an immortal: ``ambrosia-py run immortals.wallaroo.worker``.

    ambrosia-py run immortals.wallaroo.worker --instance w1 --data-dir DATA \\
        --listen 127.0.0.1:7100 --cookie C --dialect v3 --app mypkg.apps:word_count \\
        [--max-credits N] [--refill-credits M] [--max-frame-bytes B] [--control H:P]

The worker's state (:class:`~immortals.wallaroo.worker_core.WorkerCore`: connections,
streams with their points of reference, the application's state) is the immortal's,
checkpointed and replayed. The TCP edges (:mod:`immortals.wallaroo.transport`) live
outside the determinism boundary: connection events and frames come in as impulses,
logged before a handler sees them, and replies leave as effects of the incarnation that
handles them first. So an ACK leaves only once the record holding the messages it
acknowledges is durable.

Connections belong to one incarnation. Each start logs a ``start`` impulse first, with a
fresh incarnation name and the options that change what handlers do (the cookie,
dialect, credits, frame limit, application): it drops every connection of the
incarnation before (releasing their streams) and sets the configuration, so replay sees
both where they happened, before any frame of the new incarnation.

Operators (``python -m immortals.wallaroo.worker_ctl``, through ``--control``) read the
state, or have the worker NACK a stream or send its connectors elsewhere (MIGRATE in the
draft, RESTART in v3): those are impulses too, logged like frames.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from typing import Any

from ambrosia_py import Immortal, background, rpc

from .codec import DEFAULT_MAX_FRAME_BYTES
from .transport import ControlServer, WorkerTransport, parse_host_port
from .worker_core import Replies, WorkerConfig, WorkerCore, load_app

__all__ = ["WallarooWorker"]

log = logging.getLogger("immortals.wallaroo.worker")

# This incarnation's edges: not state (connections die with the process).
_transport: WorkerTransport | None = None
_control: ControlServer | None = None


def _deliver(replies: Replies) -> None:
    """Write the replies a handler produced, and log its problems (an effect)."""
    for problem in replies.problems:
        log.warning("%s", problem)
    if _transport is not None:
        for send in replies.sends:
            _transport.write(send.conn, send.wire, send.close)


def _answer(request: int, reply: dict[str, Any]) -> None:
    if _control is not None:
        _control.answer(request, reply)


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

    def __init__(self) -> None:
        self.core = WorkerCore()

    def _out(self, replies: Replies) -> None:
        if replies.sends or replies.problems:
            self.effect(_deliver, replies)

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
            self.effect(_answer, request, {"ok": False, "error": str(exc)})
            return
        self._out(replies)
        self.effect(_answer, request, {"ok": True, "stream_id": sid, "point": point})

    @rpc
    def move(self, request: int, target: str) -> None:
        """Send every streaming connector to ``target`` (``HOST:PORT``): MIGRATE in the
        draft (seed 001), RESTART in v3 (reference)."""
        try:
            host, port = parse_host_port(target)
            replies = self.core.move(host, port)
        except ValueError as exc:
            self.effect(_answer, request, {"ok": False, "error": str(exc)})
            return
        self._out(replies)
        self.effect(_answer, request, {"ok": True, "connections": len(replies.sends)})

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
            self.impulse.move(request, str(body.get("target", "")))

    @background
    async def serve(self) -> None:
        global _transport, _control
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
        except ValueError as exc:
            raise SystemExit(f"wallaroo worker: {exc}") from None
        incarnation = os.urandom(4).hex()
        self.impulse.start(incarnation, config)  # logged before any frame of this incarnation
        transport = WorkerTransport(
            self.impulse,
            incarnation,
            config.dialect,
            config.max_frame_bytes,
            config.max_credits,
        )
        await transport.start(host, port)
        _transport = transport
        where = "{}:{}".format(*transport.address)
        control = None
        if control_at is not None:
            control = ControlServer(opts.cookie, self.core.status, self._command)
            await control.start(*control_at)
            _control = control
            where += " control {}:{}".format(*control.address)
        print(
            f"wallaroo worker listening on {where} ({config.dialect.value})",
            file=sys.stderr,
            flush=True,
        )
        try:
            await asyncio.Event().wait()  # serve until the binding stops
        finally:
            _transport = _control = None
            transport.close()
            if control is not None:
                control.close()
