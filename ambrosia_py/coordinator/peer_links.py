"""The coordinator's TCP links to other coordinators: the asyncio side of :mod:`links`.

Each link is one TCP connection (optionally TLS), dialed by the sender, framed with the
flow transport (:mod:`ambrosia_py.flow`: ConnectPacket, then frames). Right after the
ConnectPackets both ends run the secret handshake of :mod:`link_auth`; until it is done
a peer may send only frames of a few hundred bytes, and nothing it sends reaches a
decoder but the ConnectPacket and frame readers and the handshake's own fixed-size
checks. After it every frame carries a tag, and the link conversation of :mod:`links`
runs on :data:`LINK_TOKEN`.

A coordinator publishes where it accepts links in the registry; a sender looks its
destination up there and dials, retrying with backoff from 50 ms to 500 ms (as flow
does) while the destination is down. Whatever goes wrong on a connection — a failed
handshake, a bad tag or checksum, a frame out of protocol, a peer that says it is
someone else, a peer idle too long — closes it and nothing from the bad frame is
logged; the sender's output stays buffered and is sent again on the next connection
from where the receiver asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from .. import crashpoints, wire
from ..flow import (
    ConnectionClosed,
    ConnectPacket,
    FlowConnection,
    FlowError,
    FrameReceived,
    PeerConnected,
    Token,
    WellKnown,
)
from .ic_core import Intake
from .link_auth import (
    AUTH_TOKEN,
    TAG_SIZE,
    LinkAuthError,
    LinkChannel,
    LinkHandshake,
    Role,
    name_digest,
)
from .link_config import PRE_AUTH_FRAME_LIMIT, LinkSettings, load_secret, tls_contexts
from .links import LINK_TOKEN, Hello, LinkError, Outbox

__all__ = ["PeerLinks"]

log = logging.getLogger("ambrosia_py.coordinator")

READ_SIZE = 256 * 1024
PRE_AUTH_READ_SIZE = 4096  # what one read takes before the peer has authenticated
MAX_FRAME_MESSAGES_BYTES = 4 * 1024 * 1024  # output per link frame
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 0.5
PING_TOKEN = Token.well_known(WellKnown.PING)  # keep-alives, tagged like any frame
_TIMER_SLACK_S = 0.001  # an idle timer firing this early counts as on time
# A receiver's Commits not taken by its socket beyond which more are not queued: a sender
# that reads none of them is not worth memory (commits are cumulative; it reconnects).
COMMIT_BACKLOG_BYTES = 64 * 1024

Lookup = Callable[[str], Awaitable[tuple[str, int] | None]]


def _local_packet(port: int) -> ConnectPacket:
    return ConnectPacket.current(
        canonical_port=port,
        connection_id=secrets.randbits(64),
        canonical_ipv4=0x7F000001,
    )


def _address(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)


class _Conn:
    """One TCP connection with its flow state and, once authenticated, its tags."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        flow: FlowConnection,
        stall_s: float,
    ):
        self.reader = reader
        self.writer = writer
        self.flow = flow
        self.stall_s = stall_s
        self.address = _address(writer)
        self.channel: LinkChannel | None = None
        self._events: list[object] = []
        self._loop = asyncio.get_running_loop()
        self.last_event = self._loop.time()  # when the last frame (or event) arrived
        self.last_sent = self.last_event  # when the last frame was written

    async def next_event(self) -> object:
        while not self._events:
            size = READ_SIZE if self.channel is not None else PRE_AUTH_READ_SIZE
            if not self.flow.buffered:
                data = await self.reader.read(size)
            else:
                # A frame has begun: its bytes must keep coming. A flipped bit in a length
                # (which no checksum covers) would otherwise have us wait, pings and all,
                # for bytes that never come, until the idle timeout.
                try:
                    async with asyncio.timeout(self.stall_s):
                        data = await self.reader.read(size)
                except TimeoutError:
                    raise LinkError(
                        f"a frame stayed incomplete for {self.stall_s:g} s with "
                        f"{self.flow.buffered} bytes held (a damaged length, or a peer "
                        "stopped mid-frame)"
                    ) from None
            self._events.extend(self.flow.receive_data(data))
            if not data and not self._events:
                return ConnectionClosed(clean=False)
        self.last_event = self._loop.time()
        return self._events.pop(0)

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
                due = self.last_event + idle
                if loop.time() >= due - _TIMER_SLACK_S:
                    limit.reschedule(loop.time())  # expire now: TimeoutError at its await
                else:
                    timer = loop.call_at(due, check)

            timer = loop.call_at(self.last_event + idle, check)
            try:
                yield
            finally:
                timer.cancel()

    async def _next_received(self) -> FrameReceived:
        event = await self.next_event()
        if isinstance(event, FrameReceived):
            return event
        if isinstance(event, ConnectionClosed):
            raise ConnectionError("the peer closed the link")
        raise LinkError(f"unexpected {type(event).__name__} on a link")

    async def next_frame(self) -> memoryview:
        """The next link message's payload, its tag checked; keep-alives are skipped (a
        reader that must not wait for ever reads inside :meth:`idle_limit`)."""
        assert self.channel is not None, "frames are read only after the handshake"
        while True:
            event = await self._next_received()
            payload = self.channel.open(event.token, event.message)
            if event.token == LINK_TOKEN:
                return payload
            if event.token != PING_TOKEN:
                raise LinkError(f"a frame for token {event.token}, not the link endpoint")

    async def handshake(self) -> ConnectPacket:
        """Exchange ConnectPackets: the dialer's goes first, the acceptor answers with its
        own once it has read the dialer's. Returns the peer's packet; raises for a dialed
        peer that is incompatible (nothing can be sent to it)."""
        if self.flow.dialer:
            self.writer.write(self.flow.connect_packet_bytes())
        event = await self.next_event()
        if not isinstance(event, PeerConnected):
            raise LinkError(f"expected the peer's ConnectPacket, got {type(event).__name__}")
        if not self.flow.dialer:
            self.writer.write(self.flow.connect_packet_bytes())
        elif not event.compatible:
            raise LinkError(
                f"incompatible peer protocol version {event.packet.protocol_version:#x}"
            )
        return event.packet

    async def authenticate(self, handshake: LinkHandshake, max_frame: int) -> None:
        """Run the secret handshake (:mod:`link_auth`); then allow frames up to
        ``max_frame`` and tag every frame."""
        if handshake.role is Role.DIALER:
            self._send_raw(AUTH_TOKEN, handshake.start())
        while not handshake.done:
            event = await self._next_received()
            if event.token != AUTH_TOKEN:
                raise LinkAuthError(
                    f"a frame for token {event.token} before the link handshake was done"
                )
            reply = handshake.receive(event.message)
            if reply is not None:
                self._send_raw(AUTH_TOKEN, reply)
        await self.writer.drain()
        self.channel = handshake.channel()
        self.flow.max_frame_length = max_frame

    def _send_raw(self, token: Token, message: bytes) -> None:
        self.writer.writelines(self.flow.send(token, message))

    async def ignore_until_closed(self) -> None:
        """An incompatible peer: keep its connection open, so it does not keep dialing,
        and act on nothing it sends (reference flow-transport.md, *Compatibility*)."""
        while data := await self.reader.read(PRE_AUTH_READ_SIZE):
            self.flow.receive_data(data)

    async def send(self, *parts: bytes) -> None:
        """One link frame made of ``parts`` (joined once, with the tag)."""
        self.write(*parts)
        await self.writer.drain()

    def write(self, *parts: bytes) -> None:
        """:meth:`send` without waiting for the transport to drain."""
        self._write_tagged(LINK_TOKEN, parts)

    async def ping(self) -> None:
        self._write_tagged(PING_TOKEN, ())
        await self.writer.drain()

    def idle_for(self) -> float:
        """Seconds since the last frame was written."""
        return self._loop.time() - self.last_sent

    @property
    def queued(self) -> int:
        """Bytes written but still in the transport, not yet taken by the socket."""
        return self.writer.transport.get_write_buffer_size()

    def _write_tagged(self, token: Token, parts: tuple[bytes, ...]) -> None:
        assert self.channel is not None, "frames are sent only after the handshake"
        tag = self.channel.seal(token, parts)
        out = self.flow.send(token, b"".join([*parts, tag]))
        crashpoints.reach_midway("ic.link.mid_send", self.writer, out)
        self.writer.writelines(out)
        self.last_sent = self._loop.time()

    def close(self) -> None:
        self.writer.close()


class PeerLinks:
    """Links to and from the other coordinators of one instance's coordinator.

    ``settings`` holds the secret's source, TLS and the limits; ``data_dir`` is where the
    default secret lives. Both are read here, so a bad secret file or certificate stops
    start-up with :class:`~.link_config.LinkSetupError`.
    """

    def __init__(
        self,
        instance: str,
        intake: Intake,
        lookup: Lookup,
        wake: Callable[[], None],
        room: Callable[[], Awaitable[None]],
        incarnation: int,
        *,
        settings: LinkSettings | None = None,
        data_dir: Path | None = None,
    ) -> None:
        self.instance = instance
        self.incarnation = incarnation  # our committer id, in our hellos
        self.intake = intake
        self.settings = settings = settings or LinkSettings()
        if data_dir is None and settings.secret_file is None:
            raise ValueError("links need a secret file or a data directory to keep one in")
        self._secret = load_secret(settings, data_dir or Path("."))
        self._tls = tls_contexts(settings)
        self._lookup = lookup
        self._wake = wake
        self._room = room  # waits while too much input is pending
        self._server: asyncio.Server | None = None
        self._port = 0
        self._outbound: dict[str, asyncio.Task[None]] = {}
        self._output_ready: dict[str, asyncio.Event] = {}
        # per destination whose send loop waits for output: its connection, frame budget
        self._parked: dict[str, tuple[_Conn, int]] = {}
        self._inbound: dict[str, _Conn] = {}  # per sender, its current connection
        self._accepted_count = 0  # accepted connections open now, authenticated or not

    async def listen(self, host: str, port: int = 0) -> int:
        """Accept links on ``host``:``port`` (0: a free port); return the port."""
        self._server = await asyncio.start_server(
            self._accepted,
            host,
            port,
            ssl=self._tls[0] if self._tls else None,
            ssl_handshake_timeout=self.settings.handshake_timeout_s if self._tls else None,
        )
        self._port = self._server.sockets[0].getsockname()[1]
        if self._tls is not None:
            mutual = self.settings.tls_ca is not None
            log.info("links use TLS%s", ", mutual (certificates checked)" if mutual else "")
        return self._port

    def _flow(self, dialer: bool) -> FlowConnection:
        return FlowConnection(
            _local_packet(self._port),
            dialer=dialer,
            max_frame_length=PRE_AUTH_FRAME_LIMIT,
            checksum=self._tls is None,  # over TLS, the frame form without the checksum
        )

    # --- sending --------------------------------------------------------------------------

    def output_ready(self) -> None:
        """New output may be waiting: start links to new destinations, wake the others."""
        for dest in self.intake.new_destinations:
            if dest not in self._outbound:
                self._output_ready[dest] = asyncio.Event()
                self._outbound[dest] = asyncio.create_task(self._send_loop(dest))
        self.intake.new_destinations.clear()
        for dest, event in self._output_ready.items():
            parked = self._parked.get(dest)
            if parked is not None and not parked[0].queued and not event.is_set():
                self._write_now(dest, *parked)
            else:
                event.set()

    def _write_now(self, dest: str, conn: _Conn, budget: int) -> None:
        """New output to a destination whose send loop is parked with nothing queued:
        written here, at once, rather than by waking the loop (a task switch or two on
        every message of a request and its reply). Anything the socket does not take
        at once wakes the loop, which waits for it to drain and sends the rest."""
        box = self.intake.outboxes[dest]
        try:
            while not conn.queued and (frames := box.take(budget)):
                conn.write(*frames)
        except (OSError, ConnectionError, FlowError):
            pass  # the loop's connection is failing: it finds out and reconnects
        if conn.queued:
            self._output_ready[dest].set()

    async def _send_loop(self, dest: str) -> None:
        box = self.intake.outboxes[dest]
        delay = BACKOFF_MIN_S
        failures = 0  # in a row; the first of a run is logged, then every 100th
        while True:
            addr = await self._lookup(dest)
            problem = f"instance {dest!r} has no coordinator accepting links"
            if addr is not None:
                try:
                    await self._serve_outbound(dest, box, addr)
                except (FlowError, wire.ProtocolError) as exc:
                    # A peer that breaks the protocol or fails the handshake is always
                    # worth a line.
                    log.warning("link to %r at %s:%d closed: %s", dest, addr[0], addr[1], exc)
                    problem = f"link to {dest!r} at {addr[0]}:{addr[1]} closed: {exc}"
                except (OSError, ConnectionError) as exc:  # TimeoutError, ssl.SSLError too
                    problem = f"link to {dest!r} at {addr[0]}:{addr[1]}: {exc or type(exc)}"
                finally:
                    if box.cursor is not None:  # it was open: a new run of failures starts
                        failures = 0
                        delay = BACKOFF_MIN_S
                    box.disconnected()
            if failures % 100 == 0:
                log.info("%s; retrying (output kept: %d messages)", problem, len(box.buffered))
            failures += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _serve_outbound(self, dest: str, box: Outbox, addr: tuple[str, int]) -> None:
        settings = self.settings
        async with asyncio.timeout(settings.handshake_timeout_s):
            reader, writer = await asyncio.open_connection(
                addr[0],
                addr[1],
                ssl=self._tls[1] if self._tls else None,
                ssl_handshake_timeout=settings.handshake_timeout_s if self._tls else None,
            )
        writer.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _Conn(reader, writer, self._flow(dialer=True), settings.handshake_timeout_s)
        try:
            async with asyncio.timeout(settings.handshake_timeout_s):
                await conn.handshake()
                auth = LinkHandshake(Role.DIALER, self._secret, self.instance, dest)
                await conn.authenticate(auth, settings.max_frame_bytes)
                await conn.send(Hello(self.instance, dest, self.incarnation).encode())
                msg, _ = wire.decode_message(await conn.next_frame(), 0, wire.Direction.TO_BINDING)
            if not isinstance(msg, wire.ReplayFrom):
                raise LinkError(f"expected ReplayFrom from {dest!r}, got {type(msg).__name__}")
            box.connected(msg.seq)
            log.info("link to %r open; sending from seq %d", dest, msg.seq)
            commits = asyncio.create_task(self._read_commits(dest, box, conn))
            keep_alive = settings.idle_timeout_s / 3
            # A frame holds a token and a tag besides the calls (one larger call still
            # goes alone, and is refused by a receiver whose limit it passes).
            budget = min(MAX_FRAME_MESSAGES_BYTES, settings.max_frame_bytes - 16 - TAG_SIZE)
            ready = self._output_ready[dest]
            commits.add_done_callback(lambda _: ready.set())
            try:
                while not commits.done():
                    frames = box.take(budget)
                    if frames:
                        await conn.send(*frames)
                        continue
                    await conn.writer.drain()  # what the fast path left in the transport
                    # Parked: output_ready() writes new output itself while the transport
                    # is empty, and sets ``ready`` only when there is more for this loop.
                    ready.clear()
                    self._parked[dest] = (conn, budget)
                    try:
                        async with asyncio.timeout(keep_alive):
                            await ready.wait()
                    except TimeoutError:
                        if conn.idle_for() >= keep_alive:  # show the receiver we live
                            await conn.ping()
                    finally:
                        self._parked.pop(dest, None)
                await commits  # raises what ended the link
            finally:
                commits.cancel()
                with contextlib.suppress(BaseException):
                    await commits
        finally:
            conn.close()

    async def _read_commits(self, dest: str, box: Outbox, conn: _Conn) -> None:
        """Apply the receiver's Commits. A receiver that confirms nothing for the idle
        timeout while messages sent to it wait (stopped, or cut off without a FIN) has the
        link closed, and the dialer reconnects; a quiet link with nothing owed stays."""
        idle = self.settings.idle_timeout_s
        loop = asyncio.get_running_loop()
        owed_since = loop.time()
        while True:
            try:
                async with conn.idle_limit(idle / 3):
                    while True:
                        payload = await conn.next_frame()
                        owed_since = loop.time()
                        msg, _ = wire.decode_message(payload, 0, wire.Direction.TO_BINDING)
                        if not isinstance(msg, wire.Commit):
                            raise LinkError(
                                f"expected Commit from {dest!r}, got {type(msg).__name__}"
                            )
                        box.commit(msg.seq)
            except TimeoutError:
                owed = (box.cursor or box.first) - box.first
                if not owed:
                    owed_since = loop.time()
                elif loop.time() - owed_since >= idle:
                    raise LinkError(
                        f"{dest!r} confirmed none of the {owed} messages sent to it for {idle:g} s"
                    ) from None

    # --- receiving ------------------------------------------------------------------------

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        settings = self.settings
        conn = _Conn(reader, writer, self._flow(dialer=False), settings.handshake_timeout_s)
        if self._accepted_count >= settings.max_connections:
            log.warning(
                "link connection from %s refused: %d link connections are open already "
                "(--link-max-connections)",
                conn.address,
                self._accepted_count,
            )
            conn.close()
            return
        self._accepted_count += 1
        sender = None
        try:
            async with asyncio.timeout(settings.handshake_timeout_s):
                packet = await conn.handshake()
                if not conn.flow.compatible:
                    log.warning(
                        "an incompatible peer (protocol version %#x) connected from %s; "
                        "ignoring it",
                        packet.protocol_version,
                        conn.address,
                    )
                    # Kept open, but not for ever: it holds a connection slot.
                    await conn.ignore_until_closed()
                    return
                auth = LinkHandshake(Role.ACCEPTOR, self._secret, self.instance)
                await conn.authenticate(auth, settings.max_frame_bytes)
                hello = Hello.decode(await conn.next_frame())
            if hello.destination != self.instance:
                raise LinkError(
                    f"{hello.sender!r} dialed {hello.destination!r}, but this is {self.instance!r}"
                )
            if name_digest(hello.sender) != auth.peer_digest:
                raise LinkAuthError(
                    f"the hello names {hello.sender!r}, but the peer authenticated as "
                    "another instance"
                )
            self.intake.inbox.check_incarnation(hello)
            sender = hello.sender
            old = self._inbound.pop(sender, None)
            if old is not None:
                old.close()  # a sender has one link; the newer connection wins
            self._inbound[sender] = conn
            start = self.intake.inbox.expect(sender)
            await conn.send(wire.encode_message(wire.ReplayFrom(start, start)))
            # And what is durable already, so the sender can forget it now (after its own
            # recovery it may hold regenerated output we logged long ago).
            durable = self.intake.inbox.durable.get(sender, 0)
            if durable:
                await conn.send(wire.encode_message(wire.Commit(durable, durable)))
            log.info("link from %r (%s) open; asked for seq %d on", sender, conn.address, start)
            async with conn.idle_limit(settings.idle_timeout_s):
                while True:
                    payload = await conn.next_frame()
                    if self._inbound.get(sender) is not conn:
                        return  # replaced by a newer connection
                    self.intake.link_input(sender, payload)
                    self._wake()
                    await self._room()
        except (FlowError, wire.ProtocolError) as exc:
            log.warning(
                "link from %r at %s closed: %s", sender or "an unknown peer", conn.address, exc
            )
        except TimeoutError:
            if sender is None:
                why = f"no handshake within {settings.handshake_timeout_s:g} s"
            else:
                why = f"nothing received for {settings.idle_timeout_s:g} s"
            log.warning(
                "link from %r at %s closed: %s", sender or "an unknown peer", conn.address, why
            )
        except (OSError, ConnectionError) as exc:
            log.info(
                "link from %r at %s closed: %s", sender or "an unknown peer", conn.address, exc
            )
        finally:
            self._accepted_count -= 1
            if sender is not None and self._inbound.get(sender) is conn:
                del self._inbound[sender]
            conn.close()

    def durable(self, marks: dict[str, int]) -> None:
        """Records holding these senders' messages are durable (the inbox says up to
        where): tell the senders that are connected."""
        for sender in marks:
            conn = self._inbound.get(sender)
            if conn is None:
                continue
            if conn.queued >= COMMIT_BACKLOG_BYTES:
                continue  # it reads none: see COMMIT_BACKLOG_BYTES
            seq = self.intake.inbox.durable[sender]
            # Written at once, not awaited: Commits are small, one per record at most,
            # and waiting for the transport here would hold up the commit pipeline.
            # A link closing under a Commit is normal: the sender reconnects, asks again.
            with contextlib.suppress(OSError, ConnectionError, FlowError):
                conn.write(wire.encode_message(wire.Commit(seq, seq)))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self._inbound.values()):
            conn.close()
        tasks = list(self._outbound.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
