"""One link connection between two coordinators: bytes, flow framing, tags, timers.

Its bytes move through the shared transport stream
(:mod:`ambrosia_py.serving.transport_stream`), an :class:`asyncio.Protocol`, not asyncio's
streams: ``StreamReader`` copies every chunk into its buffer and out again, and wakes the
reading task for every frame. Here a received chunk goes straight into the flow
connection (which keeps it by reference), and once a link is authenticated its frames
are handed to a handler as they are read, inside ``data_received``: on a link carrying a
request and its reply, that is one task switch fewer per message, and none of the
copies.

Before the handshake is done the old rules hold exactly: what an unauthenticated peer
sends is looked at :data:`PRE_AUTH_READ_SIZE` bytes at a time, and the transport stops
reading while a chunk of it waits.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence

from ... import crashpoints
from ...flow import (
    ConnectionClosed,
    ConnectPacket,
    FlowConnection,
    FrameReceived,
    PeerConnected,
    Token,
    WellKnown,
)
from ...serving.transport_stream import TransportStream
from .auth import AUTH_TOKEN, LinkAuthError, LinkChannel, LinkHandshake, Role
from .protocol import LINK_TOKEN, LinkError

__all__ = ["PING_TOKEN", "PRE_AUTH_READ_SIZE", "LinkConn", "LinkProtocol"]

PRE_AUTH_READ_SIZE = 4096  # what is looked at in one go before the peer authenticated
PING_TOKEN = Token.well_known(WellKnown.PING)  # keep-alives, tagged like any frame
_TIMER_SLACK_S = 0.001  # a timer firing this early counts as on time
# Frames whose parts average less than this are joined, as before: one copy of small parts
# costs less than handing each to the socket (and to the checksum and the tag) on its own.
_JOIN_BELOW = 4096
# A read of at most this many bytes may be one whole frame for the C fast path (_feed),
# its payload copied out; larger frames are read by the flow reader, as views.
_ONE_FRAME_MAX = 8192

FrameHandler = Callable[[bytes | memoryview], None]


class LinkProtocol(TransportStream):
    """The transport's side of a :class:`LinkConn`: the shared transport stream, and the
    conn it carries; ``on_made`` runs once connected, and makes the conn."""

    def __init__(self, on_made: Callable[[LinkProtocol], None]) -> None:
        super().__init__(on_made, "the link connection")
        self.conn: LinkConn | None = None


def _frame(event: object) -> FrameReceived:
    """``event`` if it is a frame; the end of the stream, or anything else, raises."""
    if isinstance(event, FrameReceived):
        return event
    if isinstance(event, ConnectionClosed):
        raise ConnectionError("the peer closed the link")
    raise LinkError(f"unexpected {type(event).__name__} on a link")


class LinkConn:
    """One link connection with its flow state and, once authenticated, its tags."""

    def __init__(self, protocol: LinkProtocol, flow: FlowConnection, stall_s: float) -> None:
        self.transport = protocol.transport
        self._stream = protocol  # its bytes, both ways
        protocol.conn = self
        self.flow = flow
        self.stall_s = stall_s
        peer = self.transport.get_extra_info("peername")
        self.address = (
            f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) and len(peer) >= 2 else str(peer)
        )
        self.channel: LinkChannel | None = None
        self._loop = asyncio.get_running_loop()
        self.last_event = self._loop.time()  # when the last frame (or event) arrived
        self.last_sent = self.last_event  # when the last frame was written
        self._chunks: collections.deque[bytes] = collections.deque()  # not yet looked at
        self._ended = False  # the stream ended (EOF or lost)
        self._events: list[object] = []
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None  # what ended the connection
        self._handler: FrameHandler | None = None  # frames go here once delivering
        self._read_done: Callable[[], None] | None = None  # after each read's frames
        self._done: asyncio.Future[None] | None = None  # what deliver() waits for
        self._stopped = False  # stop_delivering() was called
        self._paused = False  # pause_reading() was called, resume_reading() not yet
        self._lost: Exception | None = None  # the error that ended the stream (handshake)
        self._stall_timer: asyncio.TimerHandle | None = None
        self._last_bytes = self.last_event
        protocol.read_each(self._received, self._lost_with)

    # -- receiving ---------------------------------------------------------------------

    def _received(self, data: bytes, lost: Exception | None = None) -> None:
        """Bytes from the transport; ``b""`` at the end of the stream, with ``lost`` the
        error that ended it, if one did (raised as streams raised it on a read)."""
        if lost is not None and self._error is None and not self._stopped:
            if self._handler is None:
                self._lost = lost  # next_event raises it once it reaches the end
            else:
                self._end(lost)
                return
        if self._ended:
            return
        if not data:
            self._ended = True
        if self._handler is None:  # the handshake: looked at when asked for, in pieces
            self._chunks.append(data)
            if data:
                self._stream.pause_reading()
            self._wake()
            return
        self._feed(data)

    def _lost_with(self, exc: Exception) -> None:
        """The connection was lost with ``exc`` (a reset, a TLS alert or a bad record)."""
        self._received(b"", exc)

    def _feed(self, data: bytes) -> None:
        """Delivering: frames of ``data`` to the handler now."""
        assert self.channel is not None and self._handler is not None
        if len(data) <= _ONE_FRAME_MAX and (limit := self.flow.receive_limit()):
            # One whole small link frame, the usual read on a quiet link: checked and
            # opened in one C call (anything else, valid or not, is read below).
            payload = self.channel.open_frame(data, LINK_TOKEN, limit)
            if payload is not None:
                self.flow.skip_frame(len(data))
                self.last_event = self._last_bytes = self._loop.time()
                try:
                    self._handler(payload)
                    self._said_read()
                except Exception as exc:  # a handler refusing: the link ends
                    self._end(exc)
                return
        try:
            self._deliver(self.flow.receive_data(data))
            self._said_read()
        except Exception as exc:  # a bad frame or tag, a handler refusing: the link ends
            self._end(exc)
            return
        self._last_bytes = self._loop.time()
        if self.flow.buffered and self._stall_timer is None:
            self._stall_timer = self._loop.call_at(self._last_bytes + self.stall_s, self._stall)

    def _deliver(self, events: Sequence[object]) -> None:
        assert self._handler is not None
        for event in events:
            self.last_event = self._loop.time()
            payload = self._link_payload(event)
            if payload is not None:
                self._handler(payload)
                if self._stopped or self._error is not None:
                    return  # the handler ended the link

    def _said_read(self) -> None:
        """A read's frames are all handed over: ``read_done``, unless the handler ended
        delivery or the link."""
        if self._read_done is not None and not self._stopped and self._error is None:
            self._read_done()

    def _link_payload(self, event: object) -> memoryview | None:
        """A link message's payload, its tag checked; None for a keep-alive."""
        assert self.channel is not None, "link messages come only after the handshake"
        frame = _frame(event)
        payload = self.channel.open(frame.token, frame.message)
        if frame.token == LINK_TOKEN:
            return payload
        if frame.token != PING_TOKEN:
            raise LinkError(f"a frame for token {frame.token}, not the link endpoint")
        return None

    def _stall(self) -> None:
        """A frame has begun: its bytes must keep coming. A flipped bit in a length (which
        no checksum covers) would otherwise have us wait, pings and all, for bytes that
        never come, until the idle timeout."""
        self._stall_timer = None
        if not self.flow.buffered or self._stopped or self._error is not None:
            return
        due = self._last_bytes + self.stall_s
        if self._loop.time() < due - _TIMER_SLACK_S:
            self._stall_timer = self._loop.call_at(due, self._stall)
            return
        self._end(self._stalled())

    def _stalled(self) -> LinkError:
        return LinkError(
            f"a frame stayed incomplete for {self.stall_s:g} s with {self.flow.buffered} "
            "bytes held (a damaged length, or a peer stopped mid-frame)"
        )

    def _end(self, exc: BaseException) -> None:
        """The link ends with ``exc``: for deliver() to raise, now or when next called."""
        if self._error is None:
            self._error = exc
        if self._done is not None and not self._done.done():
            self._done.set_exception(exc)
        self._stream.close()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_event(self) -> object:
        """The next flow event, before delivery starts (the handshake)."""
        while not self._events:
            if not self._chunks:
                if self._ended:
                    if self._lost is not None:
                        raise self._lost
                    self._events.extend(self.flow.receive_data(b""))
                    if not self._events:
                        return ConnectionClosed(clean=False)
                    break
                self._waiter = self._loop.create_future()
                try:
                    if self.flow.buffered:  # a frame has begun: see _stall
                        try:
                            async with asyncio.timeout(self.stall_s):
                                await self._waiter
                        except TimeoutError:
                            raise self._stalled() from None
                    else:
                        await self._waiter
                finally:
                    self._waiter = None
                continue
            chunk = self._chunks.popleft()
            if len(chunk) > PRE_AUTH_READ_SIZE:
                self._chunks.appendleft(chunk[PRE_AUTH_READ_SIZE:])
                chunk = chunk[:PRE_AUTH_READ_SIZE]
            if not self._chunks and not self._ended:
                self._resume_transport()
            if chunk:
                self._events.extend(self.flow.receive_data(chunk))
        self.last_event = self._loop.time()
        return self._events.pop(0)

    async def next_frame(self) -> memoryview:
        """The next link message's payload, its tag checked, keep-alives skipped: for
        the messages of the link's own start (hello, ReplayFrom), before delivery."""
        while (payload := self._link_payload(await self.next_event())) is None:
            pass
        return payload

    async def deliver(
        self, handler: FrameHandler, read_done: Callable[[], None] | None = None
    ) -> None:
        """Hand every further link message's payload to ``handler`` as it is read, until
        the link ends: raises what ended it (``ConnectionError`` when the peer closed
        it), or returns once :meth:`stop_delivering` was called. Wrap it in
        :meth:`idle_limit` so a quiet peer does not hold it for ever.

        ``read_done`` runs after the frames of each read were handed over (what one read
        brought is then all there: a request alone, or the start of a batch).
        """
        assert self.channel is not None, "frames are delivered only after the handshake"
        self._done = self._loop.create_future()
        if self._handler is None:  # the first call: what the handshake's reads left
            self._handler = handler
            self._read_done = read_done
            events, self._events = self._events, []
            try:
                self._deliver(events)
                if events:
                    self._said_read()
            except Exception as exc:
                self._end(exc)
            while self._chunks and self._error is None and not self._stopped:
                self._feed(self._chunks.popleft())
            if self._error is None and not self._stopped and not self._paused:
                self._resume_transport()  # the handshake's reads paused it
        if self._error is not None:
            raise self._error
        if self._stopped:
            return
        await self._done

    def stop_delivering(self) -> None:
        """End :meth:`deliver` without an error (a newer connection replaced this one)."""
        self._stopped = True
        if self._done is not None and not self._done.done():
            self._done.set_result(None)

    def pause_reading(self) -> None:
        """Stop reading for now (back-pressure); a pause is never idleness."""
        self._paused = True
        self._stream.pause_reading()

    def skip_turn(self) -> None:
        """Read nothing more until the event loop's next turn (unless paused by then)."""
        self._stream.pause_reading()
        self._loop.call_soon(self._next_turn)

    def _next_turn(self) -> None:
        if not self._paused:
            self._resume_transport()

    def resume_reading(self) -> None:
        if self._paused:  # the idle time counts from now, as if a frame had come
            self._paused = False
            self.last_event = self._loop.time()
        self._resume_transport()

    def _resume_transport(self) -> None:
        self._stream.resume_reading()

    @contextlib.asynccontextmanager
    async def idle_limit(self, idle: float) -> AsyncIterator[None]:
        """Raise TimeoutError in the block once ``idle`` seconds pass with no frame.

        One timer per idle period, looked at when it fires, rather than a timeout armed
        and cancelled around every frame: on a busy link that was a heap push, a cancel
        and their bookkeeping per message.
        """
        loop = self._loop
        self.last_event = loop.time()
        timer: asyncio.TimerHandle
        async with asyncio.timeout(None) as limit:

            def check() -> None:
                nonlocal timer
                due = max(self.last_event, loop.time() if self._paused else 0.0) + idle
                if loop.time() >= due - _TIMER_SLACK_S:
                    limit.reschedule(loop.time())  # expire now: TimeoutError at its await
                else:
                    timer = loop.call_at(due, check)

            timer = loop.call_at(self.last_event + idle, check)
            try:
                yield
            finally:
                timer.cancel()

    # -- the connection's start ----------------------------------------------------------

    async def handshake(self) -> ConnectPacket:
        """Exchange ConnectPackets: the dialer's goes first, the acceptor answers with its
        own once it has read the dialer's. Returns the peer's packet, compatible or not
        (``flow.compatible`` says which): either side keeps an incompatible peer's
        connection open (:meth:`ignore`), so that the peer does not keep dialing."""
        if self.flow.dialer:
            self._stream.write(self.flow.connect_packet_bytes())
        event = await self.next_event()
        if not isinstance(event, PeerConnected):
            raise LinkError(f"expected the peer's ConnectPacket, got {type(event).__name__}")
        if not self.flow.dialer:
            self._stream.write(self.flow.connect_packet_bytes())
        return event.packet

    async def authenticate(self, handshake: LinkHandshake, max_frame: int) -> None:
        """Run the secret handshake (:mod:`.auth`); then allow frames up to
        ``max_frame`` and tag every frame."""
        if handshake.role is Role.DIALER:
            self._send_raw(AUTH_TOKEN, handshake.start())
        while not handshake.done:
            event = _frame(await self.next_event())
            if event.token != AUTH_TOKEN:
                raise LinkAuthError(
                    f"a frame for token {event.token} before the link handshake was done"
                )
            reply = handshake.receive(event.message)
            if reply is not None:
                self._send_raw(AUTH_TOKEN, reply)
        await self.drain()
        self.channel = handshake.channel()
        self.flow.max_frame_length = max_frame

    def _send_raw(self, token: Token, message: bytes) -> None:
        self._stream.writelines(self.flow.send(token, message))

    async def ignore(self, seconds: float) -> bool:
        """An incompatible peer's connection, kept open so that the peer does not keep
        dialing (seed 004, *Protocol compatibility*): for ``seconds``, read what it sends
        and act on none of it, then ping it. False, at once, if it closed the connection.

        Nothing it sends is kept: the flow connection drops every byte after its
        ConnectPacket, and the transport is paused while one read waits to be dropped.
        The ping (the one frame the reference lets us send it) is the write that lets
        TCP find a peer whose host vanished without a FIN, which would otherwise hold
        the connection for ever; it goes only when our side queues nothing for the
        socket, so a peer that reads nothing makes us buffer no more than one.
        """
        assert self.flow.compatible is False, "only an incompatible peer is ignored"
        try:
            async with asyncio.timeout(seconds):
                while not isinstance(await self.next_event(), ConnectionClosed):
                    pass
            return False
        except TimeoutError:
            pass
        if self.writable_now:
            self._stream.writelines(self.flow.send(PING_TOKEN, b""))  # untagged: no key
            self.last_sent = self._loop.time()
        return True

    # -- sending -------------------------------------------------------------------------

    async def send(self, *parts: bytes) -> None:
        """One link frame made of ``parts`` (joined once, with the tag)."""
        self.write(*parts)
        await self.drain()

    def write(self, *parts: bytes) -> None:
        """:meth:`send` without waiting for the transport to drain."""
        self._write_tagged(LINK_TOKEN, parts)

    async def ping(self) -> None:
        self._write_tagged(PING_TOKEN, ())
        await self.drain()

    async def drain(self) -> None:
        await self._stream.drain()

    def idle_for(self) -> float:
        """Seconds since the last frame was written."""
        return self._loop.time() - self.last_sent

    @property
    def queued(self) -> int:
        """Bytes written but still in the transport, not yet taken by the socket."""
        return self._stream.queued

    @property
    def closing(self) -> bool:
        """Whether the connection is closed or closing: writes would go nowhere."""
        return self._stream.closing

    @property
    def writable_now(self) -> bool:
        """Open, and nothing waiting in the transport: a write goes out at once."""
        return not self.closing and not self._stream.queued

    def _write_tagged(self, token: Token, parts: tuple[bytes, ...]) -> None:
        assert self.channel is not None, "frames are sent only after the handshake"
        if self.closing:  # a lost TLS transport raises AttributeError when written to
            raise ConnectionResetError("the link connection is closed")
        if not self._stream.direct or sum(map(len, parts)) < len(parts) * _JOIN_BELOW:
            frame = self.channel.seal_frame(token, parts, self.flow.send_limit(token))
            if frame is not None:  # built in one C call: the same bytes as below
                crashpoints.reach_midway("ic.link.mid_send", self.transport, (frame,))
                self._stream.write(frame)
            else:
                tag = self.channel.seal(token, parts)
                out = self.flow.send(token, b"".join([*parts, tag]))
                crashpoints.reach_midway("ic.link.mid_send", self.transport, out)
                self._stream.writelines(out)
        else:
            tag = self.channel.seal(token, parts)
            out = self.flow.send_parts(token, [*parts, tag])
            crashpoints.reach_midway("ic.link.mid_send", self.transport, out)
            self._stream.write_unjoined(out)
        self.last_sent = self._loop.time()

    def close(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None
        self._end(ConnectionError("the link connection was closed"))
