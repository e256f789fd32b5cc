"""The Wallaroo source connector as an immortal: ``ambrosia-py run immortals.wallaroo.connector``.

    ambrosia-py run immortals.wallaroo.connector --instance c1 --data-dir DATA \\
        --worker 127.0.0.1:7100 --cookie C [--dialect draft|v3] --source SPEC \\
        [--max-frame-bytes B] [--backoff-max SECONDS]

with SPEC ``file://PATH``, ``gen://COUNT?seed=S[&size=B]`` or
``ockam://HOST:PORT/STREAM`` (:mod:`immortals.wallaroo.sources`).

The protocol state (:class:`~immortals.wallaroo.connector_core.ConnectorCore`: the
worker it talks to, its connections' state machines, each stream's acknowledged point
of reference) is the immortal's, checkpointed and replayed. Everything that touches the
world is the edge, :class:`~.connector_transport.ConnectorEdge`, outside the
determinism boundary: it dials, splits the worker's bytes into frames and reports them
as impulses (logged before a handler sees them), writes what handlers decided through
effects of this incarnation, and runs the source readers.

What is logged, and why that is enough: every frame the worker sends (OK, NOTIFY_ACK,
ACK, NACK, MIGRATE, RESTART, ERROR), connections made and lost, and where a reader
stopped (the end of its source, or a halt for a migration). Those are the protocol's
decisions: which streams, from which point, rewinds, EOS, where to connect. MESSAGE
frames are not: a reader sends records straight from the source while credits allow,
because the worker, not the connector, is the system of record for points of
reference. A payload is never logged; it is read again from the source by point after
any crash, rewind or move, and the worker drops what it already holds. Credits are a
property of one live connection: the edge counts them, taking what OK, ACK and NACK
grant as they arrive, and holds back frames the core marked as costing one.

The edge (:mod:`.connector_transport`) only dials; what a worker can make it hold is
bounded there.

Each start logs a ``start`` impulse first, with a fresh incarnation name and the
configuration (worker, cookie, dialect, the source's stream names): connections of the
incarnation before are gone, so handlers forget them, and the target worker is the one
a RESTART or migration moved to (unless ``--worker`` changed).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

from ambrosia_py import Immortal, background, rpc

from .codec import DEFAULT_MAX_FRAME_BYTES, Dialect
from .connector_actions import Actions, ConnectorConfig
from .connector_core import ConnectorCore
from .connector_transport import ConnectorEdge
from .sources import open_source, stream_names

__all__ = ["WallarooConnector"]

log = logging.getLogger("immortals.wallaroo.connector")


class WallarooConnector(Immortal):
    """A Wallaroo source connector: a replayable source's streams to a worker."""

    class Options:
        worker: str = "127.0.0.1:7100"  # HOST:PORT of the worker to connect to first
        cookie: str = ""  # sent in HELLO (seed 000, footnote A2)
        dialect: str = "draft"  # draft (the seed) or v3 (released Wallaroo)
        source: str = ""  # file://PATH, gen://COUNT?seed=S[&size=B], ockam://HOST:PORT/STREAM
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES  # larger frames from the worker: ERROR
        backoff_max: float = 2.0  # seconds: the longest wait between reconnects

    def __init__(self) -> None:
        self.core = ConnectorCore()

    def _out(self, actions: Actions) -> None:
        if actions.actions or actions.problems:
            self.effect(self._apply, actions)

    def _apply(self, actions: Actions) -> None:
        """Carry out what a handler decided (an effect), through this incarnation's edge,
        which lives in ``self.local`` (not state)."""
        edge: ConnectorEdge | None = getattr(self.local, "edge", None)
        if edge is not None:
            edge.apply(actions)
        else:
            for problem in actions.problems:
                log.warning("%s", problem)

    # -- the edge's impulses ---------------------------------------------------------------

    @rpc
    def start(self, incarnation: str, config: ConnectorConfig) -> None:
        """A new incarnation: forget the last one's connections, take the config, dial."""
        self._out(self.core.start(incarnation, config))

    @rpc
    def connected(self, dial: int, conn: str, address: str) -> None:
        self._out(self.core.connected(dial, conn, address))

    @rpc
    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None:
        """The frames one read brought on ``conn`` (``now_ms``: when, for analytics of the
        log; the protocol's rules use no time)."""
        self._out(self.core.frames(conn, frames))

    @rpc
    def too_large(self, conn: str, offset: int, size: int) -> None:
        self._out(self.core.too_large(conn, offset, size))

    @rpc
    def closed(self, conn: str) -> None:
        self._out(self.core.closed(conn))

    @rpc
    def halted(self, conn: str, stream_id: int, generation: int, point: int, end: bool) -> None:
        """A reader stopped after sending up to ``point`` (at the source's end, or halted)."""
        self._out(self.core.halted(conn, stream_id, generation, point, end))

    @rpc
    def failed(self, conn: str, stream_id: int, generation: int, reason: str) -> None:
        """A reader's source cannot go on from the point it was given (seed 000, D5)."""
        self._out(self.core.failed(conn, stream_id, generation, reason))

    @rpc
    def retry(self, conn: str, stream_id: int) -> None:
        self._out(self.core.retry(conn, stream_id))

    # -- the edge --------------------------------------------------------------------------

    @background
    async def run(self) -> None:
        opts = self.options if self.options is not None else self.make_options()
        try:
            if not opts.source:
                raise ValueError("--source is required")
            config = ConnectorConfig(
                worker=opts.worker,
                streams=stream_names(opts.source),
                cookie=opts.cookie.encode(),
                dialect=Dialect(opts.dialect),
                instance_name=self.instance_name,
                max_frame_bytes=int(opts.max_frame_bytes),
            )
            source = open_source(opts.source, client_id=self.instance_name)
        except ValueError as exc:
            raise SystemExit(f"wallaroo connector: {exc}") from None
        incarnation = os.urandom(4).hex()
        edge = ConnectorEdge(self.impulse, incarnation, config, source, float(opts.backoff_max))
        self.local.edge = edge  # before the start impulse: its effect dials through the edge
        self.impulse.start(incarnation, config)  # logged before anything of this incarnation
        print(
            f"wallaroo connector {self.instance_name}: {opts.source} -> {opts.worker} "
            f"({config.dialect.value})",
            file=sys.stderr,
            flush=True,
        )
        try:
            await asyncio.Event().wait()  # run until the binding stops
        finally:
            self.local.edge = None
            await edge.close()
