"""The coordinator's TCP links to other coordinators: the asyncio side of :mod:`.protocol`.

Each link is one TCP connection (optionally TLS), dialed by the sender, framed with the
flow transport (:mod:`ambrosia_py.flow`: ConnectPacket, then frames). Right after the
ConnectPackets both ends run the secret handshake of :mod:`.auth`; until it is done
a peer may send only frames of a few hundred bytes, and nothing it sends reaches a
decoder but the ConnectPacket and frame readers and the handshake's own fixed-size
checks. After it every frame carries a tag, and the link conversation of :mod:`.protocol`
runs on :data:`LINK_TOKEN`.

A coordinator publishes where it accepts links in the registry; a sender looks its
destination up there and dials, retrying with backoff from 50 ms to 500 ms (as flow
does) while the destination is down. Whatever goes wrong on a connection — a failed
handshake, a bad tag or checksum, a frame out of protocol, a peer that says it is
someone else, a peer idle too long — closes it and nothing from the bad frame is
logged; the sender's output stays buffered and is sent again on the next connection
from where the receiver asks. A peer at an incompatible protocol version is the
exception: either side keeps its connection open, unused, so that it does not keep
reconnecting (seed 004; the bounds are in docs/protocols.md, *Flow transport*).

Accepted connections are admitted through one :class:`~ambrosia_py.serving.Admission`:
pending from accept (before its TLS handshake: :class:`~ambrosia_py.serving.Listener`)
until the secret handshake is done, then established. A newcomer that finds every slot
taken evicts the oldest pending connection, so connections that never finish either
handshake cannot lock out a peer holding the secret. Every line a peer can cause at
will (refused, evicted, timed out, a bad frame or proof) goes through one
:class:`~ambrosia_py.serving.RefusalLog`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import NoReturn

from ... import wire
from ...flow import ConnectPacket, FlowConnection, FlowError
from ...serving import Admission, ConnectionLimits, Incoming, Listener, RefusalLog, Slot
from ..core.intake import Intake
from ..registry.port_users import PortTakenError
from .auth import TAG_SIZE, LinkAuthError, LinkHandshake, Role, name_digest
from .config import PRE_AUTH_FRAME_LIMIT, LinkSettings, load_secret, tls_contexts
from .conn import LinkConn, LinkProtocol
from .protocol import Hello, LinkError, Outbox

__all__ = ["PeerLinks"]

log = logging.getLogger("ambrosia_py.coordinator")

MAX_FRAME_MESSAGES_BYTES = 4 * 1024 * 1024  # output per link frame
# Input pending past this, a link is read once a loop turn (PeerLinks._read_done).
_TURN_BYTES = 1024 * 1024
BACKOFF_MIN_S = 0.05
BACKOFF_MAX_S = 0.5
# A receiver's Commits not taken by its socket beyond which more are not queued: a sender
# that reads none of them is not worth memory (commits are cumulative; it reconnects).
COMMIT_BACKLOG_BYTES = 64 * 1024
# How long Commits wait to go as one: much less than the idle timeout (a sender closes a
# link that confirms nothing for that long), enough to leave the critical path.
COMMIT_DELAY_S = 0.01

Lookup = Callable[[str], Awaitable[tuple[str, int] | None]]


def _local_packet(port: int) -> ConnectPacket:
    return ConnectPacket.current(
        canonical_port=port,
        connection_id=secrets.randbits(64),
        canonical_ipv4=0x7F000001,
    )


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
        input_read: Callable[[], None],
        room: Callable[[], Awaitable[None]],
        has_room: Callable[[], bool],
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
        self._input_read = input_read  # after each read of link input was queued
        self._room = room  # waits while too much input is pending
        self._has_room = has_room  # whether it would return at once
        self._listener: Listener | None = None
        self._port = 0
        self._outbound: dict[str, asyncio.Task[None]] = {}
        self._output_ready: dict[str, asyncio.Event] = {}
        # per destination whose send loop waits for output: its connection, frame budget
        self._parked: dict[str, tuple[LinkConn, int]] = {}
        self._inbound: dict[str, LinkConn] = {}  # per sender, its current connection
        self._commit_due: set[str] = set()  # senders owed a Commit (see durable)
        self._commit_timer: asyncio.TimerHandle | None = None
        # per destination found incompatible, the version last logged (logged once)
        self._incompatible: dict[str, int] = {}
        self.admission = Admission(
            ConnectionLimits(
                max_connections=settings.max_connections,
                max_pending_per_source=settings.max_pending_per_source,
                handshake_timeout_s=settings.handshake_timeout_s,
            )
        )
        self._refused = RefusalLog(log, "link connections refused or closed")
        self._accepting: set[asyncio.Task[None]] = set()  # a task per accepted connection

    async def listen(self, host: str, port: int = 0) -> int:
        """Accept links on ``host``:``port`` (0: a free port); return the port."""
        # Accepted here, not by create_server(ssl=...): that would run the TLS handshake
        # before the connection is admitted, uncounted (serving/accept.py).
        try:
            self._listener = await Listener.open(host, port, self._on_accepted, log)
        except OSError as exc:  # the coordinator says whose the port is
            raise PortTakenError("link port", host, port, exc) from None
        self._port = self._listener.address[1]
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
            if parked is not None and parked[0].writable_now and not event.is_set():
                self._write_now(dest, *parked)
            else:
                event.set()

    def _write_now(self, dest: str, conn: LinkConn, budget: int) -> None:
        """New output to a destination whose send loop is parked with nothing queued:
        written here, at once, rather than by waking the loop (a task switch or two on
        every message of a request and its reply). Anything the socket does not take
        at once wakes the loop, which waits for it to drain and sends the rest."""
        box = self.intake.outboxes[dest]
        writable = True  # as output_ready found it
        try:
            while writable and (frames := box.take(budget)):
                conn.write(*frames)
                writable = conn.writable_now
        except (OSError, ConnectionError, FlowError):
            writable = False  # the loop's connection is failing: it finds out and reconnects
        if not writable:
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
                except Exception as exc:
                    # A fault of ours (asyncio's, once: a lost TLS transport raised on a
                    # write): said loudly, and the link goes on, as after a lost
                    # connection, rather than this task ending and the link with it.
                    log.exception("link to %r at %s:%d failed unexpectedly", dest, *addr)
                    problem = f"link to {dest!r} at {addr[0]}:{addr[1]}: {exc!r}"
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
            transport, protocol = await asyncio.get_running_loop().create_connection(
                lambda: LinkProtocol(self._connection(dialer=True)),
                addr[0],
                addr[1],
                ssl=self._tls[1] if self._tls else None,
                ssl_handshake_timeout=settings.handshake_timeout_s if self._tls else None,
            )
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = protocol.conn
        assert conn is not None
        try:
            async with asyncio.timeout(settings.handshake_timeout_s) as limit:
                packet = await conn.handshake()
                if not conn.flow.compatible:
                    limit.reschedule(None)  # held for as long as it stays open
                    await self._hold_incompatible(dest, addr, conn, packet)
                auth = LinkHandshake(Role.DIALER, self._secret, self.instance, dest)
                await conn.authenticate(auth, settings.max_frame_bytes)
                await conn.send(Hello(self.instance, dest, self.incarnation).encode())
                msg, _ = wire.decode_message(await conn.next_frame(), 0, wire.Direction.TO_BINDING)
            if not isinstance(msg, wire.ReplayFrom):
                raise LinkError(f"expected ReplayFrom from {dest!r}, got {type(msg).__name__}")
            box.connected(msg.seq)
            self._incompatible.pop(dest, None)  # a later incompatibility is news again
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
                    await conn.drain()  # what the fast path left in the transport
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

    async def _hold_incompatible(
        self, dest: str, addr: tuple[str, int], conn: LinkConn, packet: ConnectPacket
    ) -> NoReturn:
        """The destination's coordinator speaks an incompatible protocol version: keep the
        connection, sending it nothing but pings, and dial again only once it closes (seed
        004, *Protocol compatibility*: so that neither side keeps reconnecting). Output
        stays buffered, as for a destination that is down. Said once per destination and
        version, not once per connection.

        At each keep-alive the registry is asked again, and a destination that now
        publishes another address (restarted elsewhere, perhaps upgraded) is dialed
        there rather than waited for here."""
        version = packet.protocol_version
        if self._incompatible.get(dest) != version:
            self._incompatible[dest] = version
            log.warning(
                "link to %r at %s:%d: its protocol version %#x is incompatible with ours "
                "(%#x); keeping the connection open, unused, until it closes (output kept)",
                dest,
                addr[0],
                addr[1],
                version,
                conn.flow.local.protocol_version,
            )
        while await conn.ignore(self.settings.idle_timeout_s / 3):
            if await self._lookup(dest) != addr:
                raise ConnectionError(f"{dest!r} no longer publishes {addr[0]}:{addr[1]}")
        raise ConnectionError(f"the incompatible peer (version {version:#x}) closed the link")

    async def _read_commits(self, dest: str, box: Outbox, conn: LinkConn) -> None:
        """Apply the receiver's Commits. A receiver that confirms nothing for the idle
        timeout while messages sent to it wait (stopped, or cut off without a FIN) has the
        link closed, and the dialer reconnects; a quiet link with nothing owed stays."""
        idle = self.settings.idle_timeout_s
        loop = asyncio.get_running_loop()
        owed_since = loop.time()

        def commit(payload: bytes | memoryview) -> None:  # as each frame is read
            nonlocal owed_since
            owed_since = loop.time()
            msg, _ = wire.decode_message(payload, 0, wire.Direction.TO_BINDING)
            if not isinstance(msg, wire.Commit):
                raise LinkError(f"expected Commit from {dest!r}, got {type(msg).__name__}")
            box.commit(msg.seq)

        while True:
            try:
                async with conn.idle_limit(idle / 3):
                    await conn.deliver(commit)
                return
            except TimeoutError:
                owed = (box.cursor or box.first) - box.first
                if not owed:
                    owed_since = loop.time()
                elif loop.time() - owed_since >= idle:
                    raise LinkError(
                        f"{dest!r} confirmed none of the {owed} messages sent to it for {idle:g} s"
                    ) from None

    # --- receiving ------------------------------------------------------------------------

    def _connection(self, dialer: bool) -> Callable[[LinkProtocol], None]:
        """What a new connection's protocol runs once connected: make its LinkConn (at
        once, so nothing it receives finds no one to take it)."""
        stall = self.settings.handshake_timeout_s

        def made(protocol: LinkProtocol) -> None:
            LinkConn(protocol, self._flow(dialer=dialer), stall)

        return made

    def _on_accepted(self, incoming: Incoming) -> None:
        """A connection was accepted: admitted (perhaps evicting a pending one to make
        room) at once, in the order connections come and before any byte of it is read
        (its TLS handshake included), or refused."""
        source = incoming.source

        def evict(why: str) -> None:  # the table makes room for a newcomer
            self._refused(source, "link connection from %s closed: %s", incoming.address, why)
            # At once, in its TLS handshake too; with a FIN, as links always closed these.
            # Its task logs nothing more.
            incoming.drop(reset=False)

        slot = self.admission.admit(source, evict)
        if slot is None:
            self._refused(
                source,
                "link connection from %s refused: all %d link connections are authenticated "
                "(--link-max-connections)",
                incoming.address,
                self.settings.max_connections,
            )
            incoming.drop(reset=False)
            return
        task = incoming.start(self._connected(incoming, slot))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _connected(self, incoming: Incoming, slot: Slot) -> None:
        """An admitted connection: its TLS handshake if links use TLS (done within the
        handshake timeout of accept), then the link's own start and life (_accepted)."""
        timeout = self.settings.handshake_timeout_s
        level = logging.WARNING
        try:
            _, protocol = await incoming.connect(
                lambda: LinkProtocol(self._connection(dialer=False)),
                self._tls[0] if self._tls else None,
                timeout,
            )
        except TimeoutError:
            why = f"no TLS handshake within {timeout:g} s"
        except ssl.SSLError as exc:  # a peer TLS refuses (certificate, version, ...)
            why = f"TLS failed: {exc}"
        except (ConnectionError, OSError) as exc:
            why, level = str(exc) or type(exc).__name__, logging.INFO
        else:
            assert protocol.conn is not None  # made as the protocol connected
            await self._accepted(protocol.conn, slot, incoming.source)
            return
        self.admission.release(slot)
        self._refused(
            incoming.source,
            "link from an unknown peer at %s closed: %s",
            incoming.address,
            why,
            level=level,
        )

    async def _accepted(self, conn: LinkConn, slot: Slot, source: str) -> None:
        settings = self.settings
        sender = None
        try:
            async with asyncio.timeout(settings.handshake_timeout_s) as limit:
                packet = await conn.handshake()
                if not conn.flow.compatible:
                    self._refused(
                        source,
                        "an incompatible peer (protocol version %#x) connected from %s; "
                        "keeping its connection open, unused",
                        packet.protocol_version,
                        conn.address,
                    )
                    # Seed 004: kept open, so that it does not keep dialing; past the
                    # handshake timeout too. Its slot stays pending, so it is bounded by
                    # the connection caps, and the oldest pending goes first when a
                    # newcomer needs room (docs/protocols.md, *Flow transport*).
                    limit.reschedule(None)
                    while await conn.ignore(settings.idle_timeout_s / 3):
                        pass
                    return
                auth = LinkHandshake(Role.ACCEPTOR, self._secret, self.instance)
                await conn.authenticate(auth, settings.max_frame_bytes)
                self.admission.establish(slot)  # a holder of the secret: never evicted
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
            await self._take_input(conn, sender)
        except (FlowError, wire.ProtocolError) as exc:
            self._closed(slot, sender, conn, exc)
        except TimeoutError:
            if sender is None:
                why = f"no handshake within {settings.handshake_timeout_s:g} s"
            else:
                why = f"nothing received for {settings.idle_timeout_s:g} s"
            self._closed(slot, sender, conn, why)
        except (OSError, ConnectionError) as exc:
            self._closed(slot, sender, conn, exc, level=logging.INFO)
        finally:
            self.admission.release(slot)
            if sender is not None and self._inbound.get(sender) is conn:
                del self._inbound[sender]
            conn.close()

    def _closed(
        self,
        slot: Slot,
        sender: str | None,
        conn: LinkConn,
        why: object,
        level: int = logging.WARNING,
    ) -> None:
        """Why an accepted link closed, through the refusal log: counted under its address
        or, once the peer authenticated, under a count of its own, so that a flood from
        the same address cannot hide a peer holding the secret."""
        sender = sender or "an unknown peer"
        key = slot.refusal_key("authenticated")
        self._refused(key, "link from %r at %s closed: %s", sender, conn.address, why, level=level)

    def _read_done(self, conn: LinkConn) -> None:
        """A read of ``conn`` was queued. While input waits for the commit loop, the
        connection is read once a loop turn, as asyncio's loop does anyway: uvloop reads
        a busy socket up to 32 times before other callbacks run, and input piled up to
        the pending limit ahead of a commit loop that got no turn."""
        self._input_read()
        if self.intake.pending_bytes >= _TURN_BYTES:
            conn.skip_turn()

    async def _take_input(self, conn: LinkConn, sender: str) -> None:
        """Queue the calls of every frame from ``sender`` as it is read, until the link
        ends or a newer connection from the sender replaces this one. While too much
        input waits to be logged, the connection is not read (TCP then slows the sender
        down), and that time does not count as idle."""
        resuming: asyncio.Task[None] | None = None

        async def resume_when_room() -> None:
            await self._room()
            conn.resume_reading()

        def take(payload: bytes | memoryview) -> None:
            nonlocal resuming
            if self._inbound.get(sender) is not conn:
                conn.stop_delivering()  # replaced by a newer connection
                return
            self.intake.link_input(sender, payload)
            if not self._has_room() and (resuming is None or resuming.done()):
                conn.pause_reading()
                resuming = asyncio.create_task(resume_when_room())

        try:
            async with conn.idle_limit(self.settings.idle_timeout_s):
                await conn.deliver(take, partial(self._read_done, conn))
        finally:
            if resuming is not None:
                resuming.cancel()

    def durable(self, marks: dict[str, int]) -> None:
        """Records holding these senders' messages are durable (the inbox says up to
        where): tell the senders, once the records are forwarded (see :meth:`_commit`)."""
        self._commit_due.update(marks)
        if self._commit_timer is None:
            self._commit_timer = asyncio.get_running_loop().call_later(COMMIT_DELAY_S, self._commit)

    def _commit(self) -> None:
        """Send each connected sender whose messages were made durable a Commit up to where
        its messages are durable now.

        Commits are cumulative, so the ones due within :data:`COMMIT_DELAY_S` go as one
        per sender, after the records are forwarded: written at once by the commit
        pipeline they cost a frame (a tag, a send and a wake-up of the sender) per record,
        and stood between a durable record and its binding."""
        self._commit_timer = None
        due, self._commit_due = self._commit_due, set()
        for sender in due:
            conn = self._inbound.get(sender)
            if conn is None:
                continue
            if conn.closing or conn.queued >= COMMIT_BACKLOG_BYTES:
                continue  # gone, or it reads none: see COMMIT_BACKLOG_BYTES
            seq = self.intake.inbox.durable[sender]
            # Written, not awaited (a timer's callback): a Commit is small, and one that
            # the socket does not take waits in the transport (bounded just above). A link
            # closing under a Commit is normal: the sender reconnects and asks again.
            with contextlib.suppress(OSError, ConnectionError, FlowError):
                conn.write(wire.encode_message(wire.Commit(seq, seq)))

    async def close(self) -> None:
        if self._commit_timer is not None:
            self._commit_timer.cancel()
            self._commit_timer = None
        if self._listener is not None:
            self._listener.close()
        for conn in list(self._inbound.values()):
            conn.close()
        tasks = [*self._outbound.values(), *self._accepting]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._refused.flush()
