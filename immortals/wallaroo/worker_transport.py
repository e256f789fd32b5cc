"""The worker's connectors' port: the asyncio side, outside the determinism boundary.

:class:`WorkerTransport` accepts connectors. Each connection is named
``<incarnation>.<n>``, so no name outlives its incarnation, and reported to the immortal
as impulses in the order things happen: ``opened``, then the whole frames each read
brought (one impulse per read, with the wall-clock arrival time), then ``closed``. The
coordinator logs each impulse before a handler sees it. Replies come back as effects of
this incarnation: :meth:`WorkerTransport.write` writes all replies to one read with one
call, and closes the connection when the worker decided to (after an ERROR, a RESTART,
a MIGRATION_ACK).

Splitting is all the edge does to the bytes of a connector that said HELLO: it reads
length prefixes (:func:`~.codec.split_frames`, seed 000 *Wire Format*) and hands on
each frame's tag and body. Decoding, and so every judgement of those frames, happens in
the worker core, in logged order. A length over ``max_frame_bytes`` is refused before
its body is buffered (seed 000, B1), as a ``too_large`` impulse: the core answers ERROR
and closes, in logged order too.

**Before the handshake** a peer has proved nothing, so it may make the worker hold
little and log nothing (:data:`LIMITS`, one place for the defaults; ``docs/wallaroo.md``
lists them):

- Connections are admitted through :class:`~ambrosia_py.serving.Admission`: at most
  ``max_connections``, a newcomer evicting the oldest *pending* one (no good HELLO yet),
  at most ``max_pending_per_source`` pending per address.
- The first frame may be ``max_pre_handshake_frame`` bytes (a HELLO is four u16 strings
  and a 16-byte version in the draft: a few hundred bytes), and only it is read; a
  longer length is refused as soon as its four bytes arrive.
- The edge screens that frame itself (:func:`screen_hello`: the codec, the connection
  table and the core's :func:`~.worker_core.hello_refusal`, so the rules are written
  once): anything but a HELLO with the dialect's version and the cookie is answered
  ERROR and closed **without being reported**. Only a good HELLO is reported, with
  ``opened`` before it, so a peer without the cookie never writes a byte to the log, and
  replay stays exact because nothing it did is in the log to replay. (The other choice,
  reporting it and letting the core answer through ``too_large`` or a failed HELLO,
  would log two impulses and an effect per refused connection: a flood's worth of
  garbage in the record of the service.) A good HELLO has proved the cookie, so its
  connection is no longer pending: a flood cannot evict it while its HELLO is logged.
- The worker answers that HELLO with OK through an effect; the edge reads nothing more
  until then. The first write the worker makes to a connection that does not close it
  is that OK (a connection not yet streaming is sent nothing else: ``nack`` and ``move``
  address streaming ones), so the edge reads on from there. The core touches no socket
  and needs no extra signal.
- A connection not answered OK within ``handshake_timeout_s`` of its accept is closed.

**Once established**: an idle connection (nothing received for ``idle_timeout_s``, 0:
never, as the protocol has no keep-alive and a quiet source sends nothing) and a frame
begun whose next byte does not come within ``handshake_timeout_s`` are closed.
Back-pressure: a connector may send at most its credits between two writes of the
worker, and a worker's credits never exceed ``max_credits`` (the core's ledger). A
connection that has sent more frames than that since the worker last wrote to it stops
being read until the worker writes (the ERROR for its missing credits, or a refill), so
a connector ignoring credits cannot fill the log. One whose unsent output passes
``max_buffered_output`` is not read until it takes it, and is closed if it stays over
for ``output_stall_s`` (:func:`~ambrosia_py.serving.wait_for_room`).

**Closing when the worker says so** (behind its ERROR or RESTART, or after the
connector's MIGRATION_ACK): the edge sends the last frames, then a FIN (``write_eof``),
and reads on, dropping what the connector still sends, until the connector closes or
``_LINGER_SECONDS`` pass. Closing at once
would leave the connector's MESSAGEs in flight unread, and a socket closed with unread
input resets the connection (RFC 2525, 2.17): the reset can overtake the last frames
still queued, and a connector busy writing fails on it before it reads them, so a
RESTART (reference) could send it back to the worker it was sent away from.

Refusals and closes are logged through one :class:`~ambrosia_py.serving.RefusalLog`.
The operators' port is :mod:`.worker_control`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from typing import Any, Final, Protocol

from ambrosia_py.serving import (
    Admission,
    ConnectionLimits,
    OutputStalled,
    RefusalLog,
    Slot,
    limit_output,
    source_of,
    wait_for_room,
)

from .codec import DIALECTS, LENGTH_PREFIX_BYTES, decode_tagged, encode, split_frames
from .errors import ProtocolError
from .frames import Error, Hello
from .states import ConnectionMachine, Role
from .worker_core import WorkerConfig, hello_refusal

__all__ = [
    "LIMITS",
    "Sink",
    "WorkerTransport",
    "parse_host_port",
    "screen_hello",
]

log = logging.getLogger("immortals.wallaroo.worker_transport")

LIMITS: Final = ConnectionLimits(
    max_connections=128,
    max_pending_per_source=32,
    handshake_timeout_s=10.0,
    max_pre_handshake_frame=4096,
    idle_timeout_s=0.0,
    max_buffered_output=4 * 1024 * 1024,
    output_stall_s=30.0,
)
"""The connectors' port's limits by default (the worker's options override each)."""

_READ_SIZE: Final = 256 * 1024
_ANSWER_SECONDS: Final = 30.0  # how long a refused connection waits for the worker's ERROR
_MAX_REASON: Final = 200  # characters of an ERROR the edge writes: a refusal, not a report
_LINGER_SECONDS: Final = 5.0  # after the worker's last frames, for the connector to close


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as a pair; a clear ValueError otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def screen_hello(raw: bytes, config: WorkerConfig) -> str | None:
    """Why a connection's first frame (tag and body) is refused before anything of the
    connection is logged, or None for a HELLO the worker accepts (see the module)."""
    try:
        frame = decode_tagged(raw, config.dialect, LENGTH_PREFIX_BYTES)
        ConnectionMachine(Role.WORKER).receive(frame)  # the table: HELLO or ERROR first
    except ProtocolError as err:
        return str(err)
    if isinstance(frame, Hello):
        return hello_refusal(frame, config)
    return f"the connector sent ERROR before HELLO: {getattr(frame, 'reason', '')}"


class Sink(Protocol):
    """Where the transport reports: the worker's impulses."""

    def opened(self, conn: str, peer: str) -> None: ...
    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None: ...
    def too_large(self, conn: str, offset: int, size: int) -> None: ...
    def closed(self, conn: str) -> None: ...


class _Conn:
    """One accepted connection: what the edge holds for it, and how it ends."""

    __slots__ = (
        "buf",
        "linger",
        "offset",
        "peer",
        "reported",
        "slot",
        "source",
        "unanswered",
        "why",
        "writer",
        "wrote",
    )

    def __init__(self, writer: asyncio.StreamWriter, peer: str, source: str) -> None:
        self.writer = writer
        self.peer = peer
        self.source = source
        self.slot: Slot | None = None
        self.buf = bytearray()  # received, not yet handed on
        self.offset = 0  # stream offset of buf[0]
        self.reported = False  # ``opened`` was reported: ``closed`` must follow
        self.unanswered = 0  # frames delivered since the worker last wrote here
        self.wrote = asyncio.Event()
        self.why = ""  # why the edge ended it (evicted), once it has
        self.linger: asyncio.TimerHandle | None = None  # the worker closed it: the deadline

    def end(self, why: str) -> None:
        self.why = why
        self.writer.close()
        self.wrote.set()  # wake a wait for the worker's answer


def _key(me: _Conn) -> str:
    """Whose count a close goes to: lines about connectors that said HELLO are counted
    apart, so a flood from their address cannot hide them."""
    return f"{me.source} (said HELLO)" if me.reported else me.source


class WorkerTransport:
    """Accepts connectors and reports their frames to ``sink`` (see the module)."""

    def __init__(
        self,
        sink: Sink,
        incarnation: str,
        config: WorkerConfig,
        limits: ConnectionLimits = LIMITS,
    ) -> None:
        self._sink = sink
        self._incarnation = incarnation
        self._config = config
        self._limits = limits
        self._order = DIALECTS[config.dialect].byte_order
        self._window = config.max_credits + 2  # a HELLO or an ERROR beyond the credits
        self._numbers = itertools.count(1)
        self._conns: dict[str, _Conn] = {}
        self._admission = Admission(limits)
        self._refusals = RefusalLog(log, "connectors' connections refused or closed")
        self.closes: collections.Counter[str] = collections.Counter()  # by kind, since start
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    def stats(self) -> dict[str, Any]:
        """For operators: connections open and pending now, closes by kind since start."""
        adm = self._admission
        return {"open": adm.open, "pending": adm.pending, "closed_by_limits": dict(self.closes)}

    def _refuse(self, kind: str, conn: str, me: _Conn, why: object) -> None:
        self.closes[kind] += 1
        self._refusals(_key(me), "connection %s (%s) closed: %s", conn, me.peer, why)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        me = _Conn(writer, peer, source_of(peername) if peername else "?")
        conn = f"{self._incarnation}.{next(self._numbers)}"

        def evicted(why: str) -> None:
            self._refuse("evicted", conn, me, why)
            me.end(why)

        me.slot = self._admission.admit(me.source, evicted)
        if me.slot is None:
            most = self._limits.max_connections
            self._refuse("full", conn, me, f"all {most} slots hold connectors that said HELLO")
            writer.close()
            return
        self._conns[conn] = me
        limit_output(writer, self._limits)
        try:
            if await self._handshake(conn, me, reader):
                await self._stream(conn, me, reader)
            if me.linger is not None:  # the worker closed it: drop the rest (see the module)
                while await reader.read(_READ_SIZE):
                    pass
        except OutputStalled as exc:
            self._refuse("output_stalled", conn, me, exc)
        except ConnectionError as exc:
            self._refusals(
                _key(me), "connection %s (%s) lost: %s", conn, peer, exc, level=logging.INFO
            )
        finally:
            if me.linger is not None:
                me.linger.cancel()
            self._admission.release(me.slot)
            if self._conns.pop(conn, None) is not None and me.reported:
                self._sink.closed(conn)
            writer.close()

    async def _handshake(self, conn: str, me: _Conn, reader: asyncio.StreamReader) -> bool:
        """Read and screen the first frame, report it, wait for the worker's OK: whether
        the connection is established (see the module)."""
        limits, config = self._limits, self._config
        limit = limits.max_pre_handshake_frame
        try:
            async with asyncio.timeout(limits.handshake_timeout_s):
                while True:
                    frames, used, oversize = split_frames(me.buf, self._order, limit, most=1)
                    if oversize is not None:
                        why = (
                            f"a frame of {oversize[1]} bytes before the handshake (at most {limit})"
                        )
                        return self._refuse_first("hello_too_large", conn, me, why)
                    if frames:
                        break
                    # Never more than the first frame can take: the rest waits for the OK.
                    data = await reader.read(limit + LENGTH_PREFIX_BYTES - len(me.buf))
                    if not data or me.why:
                        return False
                    me.buf += data
                if (refusal := screen_hello(frames[0], config)) is not None:
                    return self._refuse_first("hello_refused", conn, me, refusal)
                if me.slot is not None:  # it proved the cookie: never evicted from now on
                    self._admission.establish(me.slot)
                del me.buf[:used]
                me.offset = used
                me.reported = True
                me.unanswered = 1
                me.wrote.clear()
                self._sink.opened(conn, me.peer)
                self._sink.frames(conn, int(time.time() * 1000), frames)
                await me.wrote.wait()  # the OK (or, if the worker thinks otherwise, ERROR)
        except TimeoutError:
            why = f"no HELLO answered OK within {limits.handshake_timeout_s:g} s of its accept"
            self._refuse("handshake_timeout", conn, me, why)
            return False
        return conn in self._conns and not me.why  # the OK came: the worker kept it

    def _refuse_first(self, kind: str, conn: str, me: _Conn, reason: str) -> bool:
        """Answer ERROR and close, the worker never told: nothing of it is logged."""
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        self._refuse(kind, conn, me, reason)
        me.writer.write(encode(Error(reason), self._config.dialect))
        me.end(reason)  # its unread bytes, if any, make the kernel reset rather than close
        return False

    async def _stream(self, conn: str, me: _Conn, reader: asyncio.StreamReader) -> None:
        """Hand on the frames of an established connection until it ends."""
        sink, limits, limit = self._sink, self._limits, self._config.max_frame_bytes
        while not me.why:
            frames, used, oversize = split_frames(me.buf, self._order, limit)
            if frames:
                me.unanswered += len(frames)
                sink.frames(conn, int(time.time() * 1000), frames)
            if oversize is not None:
                me.wrote.clear()
                sink.too_large(conn, me.offset + oversize[0], oversize[1])
                # The worker answers ERROR and closes; read no more meanwhile.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(me.wrote.wait(), _ANSWER_SECONDS)
                return
            del me.buf[:used]
            me.offset += used
            while me.unanswered > self._window and not me.why:  # past its credits: wait
                me.wrote.clear()
                await me.wrote.wait()
            await wait_for_room(me.writer, limits)
            # A frame begun must keep coming; between frames only the idle limit holds.
            wait = limits.handshake_timeout_s if me.buf else limits.idle_timeout_s
            try:
                async with asyncio.timeout(wait or None):
                    data = await reader.read(_READ_SIZE)
            except TimeoutError:
                kind = "stalled" if me.buf else "idle"
                self._refuse(kind, conn, me, f"nothing received for {wait:g} s ({kind})")
                return
            if not data or conn not in self._conns:
                return
            me.buf += data

    def write(self, conn: str, wire: bytes, close: bool) -> None:
        """Write a connection's replies (an effect), then close it if the worker said so.

        A connection that has gone takes nothing: its connector reconnects.
        """
        me = self._conns.get(conn)
        if me is None:
            if wire:
                log.info("replies to %s dropped: the connection has gone", conn)
            return
        if wire:
            me.writer.write(wire)
        me.unanswered = 0
        me.wrote.set()
        if close:
            del self._conns[conn]  # the worker has forgotten it already: no closed impulse
            if me.writer.can_write_eof() and not me.writer.is_closing():
                me.writer.write_eof()  # a FIN behind the last frames, not a reset
                me.linger = asyncio.get_running_loop().call_later(_LINGER_SECONDS, me.writer.close)
            else:
                me.writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        conns = list(self._conns.values())
        self._conns.clear()  # the incarnation ends: no closed impulses
        for me in conns:
            me.end("the worker stops")
