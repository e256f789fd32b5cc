"""The hub's TCP transport: the asyncio edge, outside the determinism boundary.

Each connection is read with the sans-IO :class:`~immortals.ockam.routing.FrameReader`
(u16 big-endian length prefixes). All frames that one read yields go to the immortal as
one impulse, with the peer's ``host:port`` and the wall-clock time of arrival: the
coordinator logs them before any handler sees them, so the time is logged input too.
Replies come back as effects of this incarnation: the hub answers every impulse with
exactly one :meth:`HubTransport.write`, all replies to the read framed together (every
reply's first hop is the connection the frames came in on, which the TCP hop put there),
since a system call per reply would cost more than handling its frame. A reply for a
connection that has gone is dropped (the client retries). Connections belong to one
incarnation; after a crash clients reconnect.

What a peer can make the hub hold (limits in :data:`HUB_LIMITS`, ``OckamHub.Options``):

- **Admission** (:class:`~ambrosia_py.serving.Admission`): at most ``max_connections``;
  a newcomer evicts the oldest connection that has not yet sent a valid frame. The Ockam
  TCP protocol has no authentication, so a connection counts as established once its
  first frame is *valid*: whole, no longer than ``max_pre_handshake_frame``, and a
  TransportMessage the strict decoder accepts (version 1, two routes and a payload that
  end exactly where the frame ends; the payload itself is not decoded here). That first
  frame is read on its own, with exact reads, within ``handshake_timeout_s`` of accept;
  anything else closes the connection before a byte of it is logged. An established
  connection that sends nothing for ``idle_timeout_s`` is closed.
- **Unanswered input**: a connection with :data:`MAX_UNANSWERED` impulses the hub has
  not answered yet is not read. One read becomes one impulse whose replies are built in
  this process, so without this a peer could have thousands of requests delivered before
  any reply exists. The hub bounds the replies one impulse builds
  (:data:`~immortals.ockam.hub_core.REPLY_BUDGET`).
- **Unsent output**: a connection whose unsent replies pass ``max_buffered_output`` is
  not read (:func:`~ambrosia_py.serving.wait_for_room`), and is reset if it stays over
  for ``output_stall_s``; so a connection holds at most that bound plus the replies to
  :data:`MAX_UNANSWERED` impulses.

Refusals and closes are logged through one :class:`~ambrosia_py.serving.RefusalLog` (a
flood cannot flood the log), and so are the problems the hub reports with frames.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final

from ambrosia_py.serving import (
    Admission,
    ConnectionLimits,
    OutputStalled,
    RefusalLog,
    buffered_output,
    limit_output,
    reset,
    source_of,
    wait_for_room,
)

from .errors import OckamError
from .routing import MAX_FRAME, FrameReader, decode_message

__all__ = ["HUB_LIMITS", "MAX_UNANSWERED", "HubTransport", "parse_host_port"]

log = logging.getLogger("immortals.ockam.hub_transport")
_READ_SIZE = 256 * 1024
_PREFIX: Final = 2  # the u16 length in front of every frame (routing)

HUB_LIMITS: Final = ConnectionLimits(
    max_connections=256,
    max_pending_per_source=32,
    handshake_timeout_s=10.0,
    # The protocol has no handshake: a client that knows a stream's address may open a
    # connection with a full-size push, so the first frame may be as large as any.
    max_pre_handshake_frame=MAX_FRAME,
    idle_timeout_s=300.0,
    max_buffered_output=1024 * 1024,
    output_stall_s=30.0,
)
"""The hub's connection limits by default; ``OckamHub.Options`` takes its defaults here."""

MAX_UNANSWERED: Final = 2
"""Impulses of one connection the hub may have unanswered before it stops reading it:
two, so the next read is logged while the last is handled."""

Deliver = Callable[[str, int, list[bytes]], None]


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as a pair; a clear ValueError otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class _Closed(Exception):
    """The hub ends the connection, for the reason given."""


class _Conn:
    """One connection: its writer, what the hub owes it, and whether the hub closed it."""

    __slots__ = ("answered", "closed", "peer", "source", "unanswered", "watch", "writer")

    def __init__(self, writer: asyncio.StreamWriter, peer: str, source: str) -> None:
        self.writer = writer
        self.peer = peer  # host:port, as the impulses name it
        self.source = source  # the host, as admission and the refusal log count it
        self.unanswered = 0  # impulses delivered and not yet answered
        self.answered = asyncio.Event()
        self.closed = False  # by the hub, and logged
        self.watch: asyncio.Task[None] | None = None  # while output is over the bound


class HubTransport:
    """Accepts Ockam TCP connections and hands their frames to ``deliver``."""

    def __init__(self, deliver: Deliver, limits: ConnectionLimits = HUB_LIMITS) -> None:
        self._deliver = deliver
        self.limits = limits
        self.admission = Admission(limits)
        self._refusals = RefusalLog(log, "hub connections refused or closed")
        self._problems = RefusalLog(log, "problems with frames")
        self._connections: dict[bytes, _Conn] = {}
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        if not peername:  # gone before it was accepted
            reset(writer)
            return
        host, port = peername[:2]
        me = _Conn(writer, f"{host}:{port}", source_of(peername))
        slot = self.admission.admit(me.source, lambda why: self._end(me, why))
        if slot is None:
            self._refusals(
                me.source,
                "refused %s: all %d connection slots hold connections that sent a valid frame",
                me.peer,
                self.limits.max_connections,
            )
            reset(writer)
            return
        key = me.peer.encode()
        self._connections[key] = me
        limit_output(writer, self.limits)
        try:
            first = await self._first_frame(reader)
            self.admission.establish(slot)
            me.unanswered += 1
            self._deliver(me.peer, int(time.time() * 1000), [first])
            await self._read_on(reader, me)
        except _Closed as exc:
            self._end(me, str(exc))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            if not me.closed:
                log.info("connection %s lost: %s", me.peer, exc)
        finally:
            if self._connections.get(key) is me:
                del self._connections[key]
            if me.watch is not None:
                me.watch.cancel()
            await self._close(me)
            self.admission.release(slot)

    def _end(self, me: _Conn, why: str) -> None:
        """Close ``me`` at once (unsent replies are dropped), logging why, once."""
        if me.closed:
            return
        me.closed = True
        self._refusals(me.source, "closing %s: %s", me.peer, why)
        reset(me.writer)
        me.answered.set()

    async def _first_frame(self, reader: asyncio.StreamReader) -> bytes:
        """The connection's first frame, once it is valid (see the module)."""
        limits = self.limits
        try:
            async with asyncio.timeout(limits.handshake_timeout_s):
                size = int.from_bytes(await reader.readexactly(_PREFIX), "big")
                if not 0 < size <= limits.max_pre_handshake_frame:
                    raise _Closed(
                        f"its first frame declares {size} bytes (1 to "
                        f"{limits.max_pre_handshake_frame} before a valid frame)"
                    )
                first = await reader.readexactly(size)
        except TimeoutError:
            raise _Closed(
                f"no valid frame within {limits.handshake_timeout_s:g} s of connecting"
            ) from None
        try:
            decode_message(first)  # strict, and bounded by the frame's size
        except OckamError as exc:
            raise _Closed(f"its first frame is not a TransportMessage: {exc}") from None
        return first

    async def _read_on(self, reader: asyncio.StreamReader, me: _Conn) -> None:
        """Read an established connection until either side ends it."""
        limits = self.limits
        idle = limits.idle_timeout_s or None
        frames = FrameReader()
        while not me.closed:
            if me.unanswered >= MAX_UNANSWERED:
                me.answered.clear()
                await me.answered.wait()
                continue
            if buffered_output(me.writer) > limits.max_buffered_output:
                await self._watched(me)  # ends once under the bound, or the connection
                continue
            try:
                async with asyncio.timeout(idle):
                    data = await reader.read(_READ_SIZE)
            except TimeoutError:
                raise _Closed(f"it sent nothing for {idle:g} s") from None
            if not data:
                return
            try:
                received = frames.feed(data)
            except OckamError as exc:
                raise _Closed(str(exc)) from None
            if received:
                me.unanswered += 1
                self._deliver(me.peer, int(time.time() * 1000), received)

    def _watched(self, me: _Conn) -> asyncio.Task[None]:
        """The task that waits for ``me``'s output to fall under the bound, and closes
        the connection if it stays over past the stall deadline. Started by whichever
        comes first: a write over the bound (the reader may be waiting for input that
        never comes), or the reader finding the output over it."""
        if me.watch is None:
            me.watch = asyncio.get_running_loop().create_task(self._watch(me))
        return me.watch

    async def _watch(self, me: _Conn) -> None:
        try:
            await wait_for_room(me.writer, self.limits)
        except OutputStalled as exc:
            self._end(me, str(exc))
        except ConnectionError:
            pass  # the reader sees the connection go
        finally:
            me.watch = None

    async def _close(self, me: _Conn) -> None:
        """Close, letting the peer take the replies it is owed, but not for longer than
        the output stall deadline: a peer that reads nothing holds nothing."""
        writer = me.writer
        if me.closed:
            reset(writer)
            return
        writer.close()
        if not buffered_output(writer):
            return
        try:
            async with asyncio.timeout(self.limits.output_stall_s):
                await writer.wait_closed()
        except (TimeoutError, OSError):
            reset(writer)

    def write(self, connection: bytes, wire: bytes) -> None:
        """Answer one impulse of the connection named ``connection``: write its framed
        replies (an effect; ``wire`` may be empty) and let the connection be read again.

        One write for all the replies to one read: a system call per reply would cost
        more than handling the frame did.
        """
        me = self._connections.get(connection)
        if me is None:
            if wire:
                log.info(
                    "replies dropped: connection %s has gone", connection.decode(errors="replace")
                )
            return
        if wire and not me.writer.is_closing():
            me.writer.write(wire)
            if buffered_output(me.writer) > self.limits.max_buffered_output:
                self._watched(me)
        me.unanswered = max(0, me.unanswered - 1)
        me.answered.set()

    def report(self, peer: str, problems: list[str]) -> None:
        """Log the problems the hub found with a peer's frames (an effect), a few per
        source in full and then a count, so bad frames cannot flood the log."""
        source = source_of(peer)
        for problem in problems:
            self._problems(source, "from %s: %s", peer, problem)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for me in list(self._connections.values()):
            me.closed = True  # the service stops: no line per connection
            reset(me.writer)
        self._connections.clear()
        self._refusals.flush()
        self._problems.flush()
