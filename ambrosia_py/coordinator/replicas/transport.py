"""The network between the replicas of one instance: the replicated log's messages over
TCP (TLS when the link settings say so), authenticated with the cluster secret.

Messages from replica ``r`` to replica ``s`` travel on one connection that ``r`` dials
to ``s`` when it first has something for it, and dials again, with backoff, after that
connection fails, asking ``address_of`` where ``s`` listens each time. So each side only
ever reads on the connections it accepted and writes on the ones it dialed: no rule for
who dials whom, and no race between two connections for one pair. Each connection's
bytes are the sans-IO ends of :mod:`.transport_auth` (the handshake, then tagged frames);
this module is their asyncio edge, over the shared transport stream
(:mod:`ambrosia_py.serving.transport_stream`), accepting through the shared
:class:`~ambrosia_py.serving.Listener` and :class:`~ambrosia_py.serving.Admission`, as the
links between instances do.

Nothing is ever retried here. A message is encoded as it is sent and queued for its
destination; frames written to a connection that then fails are lost with it, and the
replication protocol finds out and asks again (resend requests, heartbeats, positions).
So :meth:`ReplicaTransport.send` never waits and never raises for the network's sake.
A destination that cannot keep up (unreachable, or far behind) would make its queue grow
without bound: past ``max_queue_bytes`` the queue is dropped whole, counted, and said
once per episode. What the process holds for one destination is then at most that,
plus the transport's write buffer (:data:`WRITE_HIGH_WATER`) and one batch being written
(:data:`WRITE_BATCH_BYTES`, or one larger frame).

Checkpoint chunks (CHECKPOINT, TAKEN) are paced instead: a checkpoint may be larger than
any queue bound, and all its chunks are sent at once. They wait as messages, views of
the checkpoint's bytes, and are encoded into the queue only while it holds less than
:data:`PACED_QUEUE_BYTES` (or half ``max_queue_bytes``, if that is less: a chunk at
most that large keeps within the bound); one transfer per destination waits so, and a
chunk of another replaces it (what is left of the older one is not wanted any more).

Queued frames go out in batches, each frame followed by its tag, in one write of many
buffers: the primary's commit path sends every record through here, and a write per
frame would cost a system call each. Messages sent within one turn of the event loop
leave together in the next.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import socket
import ssl
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Final

from ...iov import IOV_MAX
from ...serving import Admission, ConnectionLimits, Incoming, Listener, RefusalLog, Slot
from ...serving.transport_stream import TransportStream
from ..links.config import SECRET_ENV, LinkSettings, load_secret, tls_contexts
from ..registry.interface import Endpoint
from ..registry.port_users import PortTakenError
from ..replication.errors import ReplicationProtocolError
from ..replication.messages import (
    DEFAULT_MAX_FRAME,
    CheckpointChunk,
    Message,
    TakenChunk,
    encode_frame,
)
from .transport_auth import MAX_REPLICA, Accepting, Dialing
from .transport_conns import Accepted, Dialed

__all__ = [
    "BACKOFF_MAX_S",
    "BACKOFF_MIN_S",
    "PACED_QUEUE_BYTES",
    "WRITE_BATCH_BYTES",
    "WRITE_HIGH_WATER",
    "ReplicaTransport",
]

log = logging.getLogger("ambrosia_py.coordinator.replicas")

BACKOFF_MIN_S: Final = 0.02  # the first wait before dialing again; doubled per failure
BACKOFF_MAX_S: Final = 0.5  # a secondary back up rejoins within this of listening
WRITE_BATCH_BYTES: Final = 1 << 20  # frames handed to the transport in one write
_BATCH_FRAMES: Final = IOV_MAX // 2  # each frame and its tag: two buffers of a writev
# The transport's write buffer, past which frames stay in the queue (where they count
# against max_queue_bytes) rather than in the transport (where nothing bounds them).
WRITE_HIGH_WATER: Final = 1 << 20
# Checkpoint chunks are moved into a destination's queue only while it holds less.
PACED_QUEUE_BYTES: Final = 4 << 20
_WHAT: Final = "the replica connection"

OnMessage = Callable[[int, Message], None]
AddressOf = Callable[[int], Awaitable[Endpoint | None]]


class _Destination:
    """What this replica has for one other: its queue, and the coroutine that dials it
    and writes to it."""

    def __init__(self, replica: int) -> None:
        self.replica = replica
        self.frames: collections.deque[bytes] = collections.deque()
        self.queued = 0  # bytes in ``frames``
        self.wake = asyncio.Event()  # frames queued, or the connection ended
        self.conn: Dialed | None = None
        self.task: asyncio.Task[None] | None = None
        self.dropping = False  # in an episode of drops: said once, at its start
        # The chunks of one checkpoint transfer waiting to be queued, and its key.
        self.paced: collections.deque[CheckpointChunk | TakenChunk] = collections.deque()
        self.paced_key: tuple[int, int, int, int] | None = None


class ReplicaTransport:
    """Messages between the replicas of one instance, over TCP (TLS when the settings
    say so), authenticated with the cluster secret.

    ``on_message(sender, message)`` is called on the event loop's thread, in the order
    the messages arrive from each sender; ``sender`` is the replica number the peer
    proved in the handshake. ``address_of(r)`` says where replica ``r`` listens now
    (None: not known yet; asked again at the next dial). ``settings`` are the links':
    the cluster secret (from ``settings.secret_file``, ``$AMBROSIA_SECRET_FILE`` or
    ``data_dir``, as the links find it), TLS, the handshake and idle timeouts and the
    limits on connections. ``max_queue_bytes`` bounds the frames waiting for one
    destination; ``max_frame_bytes`` the frames accepted from a peer and sent to one.

    ``dropped_frames`` and ``dropped_bytes`` count what queue overflows dropped, for
    metrics.
    """

    def __init__(
        self,
        instance: str,
        replica: int,
        settings: LinkSettings,
        on_message: OnMessage,
        address_of: AddressOf,
        *,
        max_queue_bytes: int = 64 << 20,
        max_frame_bytes: int = DEFAULT_MAX_FRAME,
        data_dir: Path | None = None,
    ) -> None:
        if data_dir is None and settings.secret_file is None and not os.environ.get(SECRET_ENV):
            raise ValueError(
                f"replicas need the cluster secret: a secret file (settings.secret_file or "
                f"${SECRET_ENV}) or the data directory that keeps it"
            )
        if not 0 <= replica <= MAX_REPLICA:
            raise ValueError(f"replica number {replica} is not in 0..{MAX_REPLICA}")
        if max_queue_bytes < 1 or max_frame_bytes < 1:
            raise ValueError(
                f"max_queue_bytes ({max_queue_bytes}) and max_frame_bytes "
                f"({max_frame_bytes}) must be at least 1"
            )
        self.instance = instance
        self.replica = replica
        self.settings = settings
        self.max_queue_bytes = max_queue_bytes
        self.max_frame_bytes = max_frame_bytes
        self._secret = load_secret(settings, data_dir or Path("."))
        self._tls = tls_contexts(settings)
        self._on_message = on_message
        self._address_of = address_of
        self._out: dict[int, _Destination] = {}
        self._in: dict[int, Accepted] = {}  # per sender, its current connection
        self._accepting: set[asyncio.Task[None]] = set()
        self._listener: Listener | None = None
        self._closed = False
        self.dropped_frames = 0
        self.dropped_bytes = 0
        self.admission = Admission(
            ConnectionLimits(
                max_connections=settings.max_connections,
                max_pending_per_source=settings.max_pending_per_source,
                handshake_timeout_s=settings.handshake_timeout_s,
            )
        )
        self._refused = RefusalLog(log, "replica connections refused or closed")

    # --- the public side -------------------------------------------------------------------

    async def listen(self, host: str, port: int) -> int:
        """Accept the other replicas' connections on ``host``:``port`` (0: a free port);
        returns the port."""
        try:
            self._listener = await Listener.open(host, port, self._on_accepted, log)
        except OSError as exc:
            raise PortTakenError("replication port", host, port, exc) from None
        return self._listener.address[1]

    def send(self, to: int, message: Message) -> None:
        """Queue ``message`` for replica ``to``, encoded now; it leaves in the event
        loop's next turn once connected. Never waits; raises only for what the caller
        got wrong (a message that does not encode, a frame over ``max_frame_bytes``,
        ``to`` this replica itself)."""
        if to == self.replica or not 0 <= to <= MAX_REPLICA:
            raise ValueError(f"replica {self.replica} cannot send to replica {to}")
        if isinstance(message, CheckpointChunk | TakenChunk):
            self._pace(to, message)
            return
        frame = encode_frame(message)
        if len(frame) > self.max_frame_bytes:
            raise ValueError(
                f"a {type(message).__name__} frame of {len(frame)} bytes, over the limit of "
                f"{self.max_frame_bytes} (cut it in smaller ones)"
            )
        if self._closed:
            return
        dest = self._destination(to)
        if dest.queued + len(frame) > self.max_queue_bytes:
            self._overflow(dest, len(frame))
            return
        dest.frames.append(frame)
        dest.queued += len(frame)
        dest.wake.set()

    def _destination(self, to: int) -> _Destination:
        dest = self._out.get(to)
        if dest is None:
            dest = self._out[to] = _Destination(to)
            dest.task = asyncio.get_running_loop().create_task(self._run(dest))
        return dest

    def _pace(self, to: int, chunk: CheckpointChunk | TakenChunk) -> None:
        """Keep a checkpoint chunk until the queue has room for it (see the module)."""
        if len(chunk.data) + 64 > self.max_frame_bytes:  # 64: more than the fields take
            raise ValueError(
                f"a {type(chunk).__name__} of {len(chunk.data)} bytes, over the frame limit "
                f"of {self.max_frame_bytes} (cut it in smaller ones)"
            )
        if self._closed:
            return
        dest = self._destination(to)
        key = (int(chunk.KIND), chunk.epoch, chunk.seq, chunk.total)
        if dest.paced_key != key:
            dest.paced.clear()
            dest.paced_key = key
        dest.paced.append(chunk)
        self._refill(dest)

    def _refill(self, dest: _Destination) -> None:
        """Move waiting checkpoint chunks into the queue while it holds little."""
        moved = False
        below = min(PACED_QUEUE_BYTES, self.max_queue_bytes // 2)
        while dest.paced and dest.queued < below:
            frame = encode_frame(dest.paced.popleft())
            dest.frames.append(frame)
            dest.queued += len(frame)
            moved = True
        if not dest.paced:
            dest.paced_key = None
        if moved:
            dest.wake.set()

    def paced_chunks(self, to: int) -> int:
        """The checkpoint chunks waiting to be queued for replica ``to``."""
        dest = self._out.get(to)
        return 0 if dest is None else len(dest.paced)

    def flush(self) -> None:
        """Write what is queued now, to every replica connected and keeping up, instead
        of in the event loop's next turn: for a frame that must leave before the loop
        blocks (the primary ships a record, then syncs it on the event loop)."""
        for dest in self._out.values():
            conn = dest.conn
            if dest.frames and conn is not None and conn.error is None and not conn.stream.behind:
                self._write_batch(dest, conn)

    def connected(self, to: int) -> bool:
        """Whether a connection to replica ``to`` is open and authenticated now."""
        dest = self._out.get(to)
        return dest is not None and dest.conn is not None and dest.conn.open

    def queued_bytes(self, to: int) -> int:
        """The bytes of the frames waiting for replica ``to`` (at most
        ``max_queue_bytes``)."""
        dest = self._out.get(to)
        return 0 if dest is None else dest.queued

    def forget(self, to: int) -> None:
        """Drop the connection to replica ``to`` and what is queued for it (it left the
        group); a later :meth:`send` to it starts over."""
        dest = self._out.pop(to, None)
        if dest is None:
            return
        if dest.conn is not None:
            dest.conn.close(f"replica {to} was forgotten")
        if dest.task is not None:
            dest.task.cancel()
        dest.frames.clear()
        dest.queued = 0
        dest.paced.clear()

    async def close(self) -> None:
        """Stop listening, close every connection, drop every queue."""
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        tasks: list[asyncio.Task[None]] = [*self._accepting]
        for to in list(self._out):
            task = self._out[to].task
            self.forget(to)
            if task is not None:
                tasks.append(task)
        for conn in list(self._in.values()):
            conn.close("the transport closed")
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._refused.flush()

    # --- sending ---------------------------------------------------------------------------

    def _overflow(self, dest: _Destination, size: int) -> None:
        frames, dropped = len(dest.frames) + 1, dest.queued + size
        dest.frames.clear()
        dest.queued = 0
        self.dropped_frames += frames
        self.dropped_bytes += dropped
        if not dest.dropping:
            dest.dropping = True
            log.warning(
                "replica %d of %r takes too little: %d frames (%d bytes) waiting for it "
                "passed the limit of %d bytes and were dropped (the replication protocol "
                "asks for what it misses); said once until its queue empties",
                dest.replica,
                self.instance,
                frames,
                dropped,
                self.max_queue_bytes,
            )

    async def _run(self, dest: _Destination) -> None:
        """Dial ``dest`` whenever frames wait for it, and write them while connected."""
        delay = BACKOFF_MIN_S
        failures = 0  # in a row; the first of a run is logged, then every 100th
        while True:
            while not dest.frames:
                dest.wake.clear()
                await dest.wake.wait()
            where = f"replica {dest.replica} of {self.instance!r}"
            level = logging.INFO
            try:
                endpoint = await self._address_of(dest.replica)
                if endpoint is None:
                    problem = f"{where}: where it listens is not known"
                else:
                    where += f" at {endpoint.host}:{endpoint.port}"
                    conn = await self._dial(dest, endpoint)
                    failures, delay = 0, BACKOFF_MIN_S
                    try:
                        await self._pump(dest, conn)
                    except (OSError, ConnectionError) as exc:
                        log.info("connection to %s ended: %s", where, exc)
                    finally:
                        dest.conn = None
                        conn.close("closed")
                    await asyncio.sleep(delay)  # the next dial, not at once
                    continue
            except ReplicationProtocolError as exc:  # refused, or not one of ours
                problem, level = f"{where}: {exc}", logging.WARNING
            except (OSError, ConnectionError) as exc:  # TimeoutError and ssl.SSLError too
                problem = f"{where}: {exc or type(exc).__name__}"
            except Exception as exc:
                # A fault of ours or of address_of: said loudly, then dialed again as
                # after a lost connection, rather than this destination going silent.
                log.exception("replication to %s failed unexpectedly", where)
                problem = f"{where}: {exc!r}"
            if failures % 100 == 0:
                log.log(
                    level,
                    "cannot replicate to %s; dialing again (%d frames queued)",
                    problem,
                    len(dest.frames),
                )
            failures += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _dial(self, dest: _Destination, endpoint: Endpoint) -> Dialed:
        """A connection to ``dest`` at ``endpoint``, authenticated."""
        timeout = self.settings.handshake_timeout_s
        made: list[Dialed] = []

        def on_made(stream: TransportStream) -> None:
            end = Dialing(self._secret, self.instance, self.replica, dest.replica)
            made.append(Dialed(stream, end, dest.wake.set))

        async with asyncio.timeout(timeout):
            transport, _ = await asyncio.get_running_loop().create_connection(
                lambda: TransportStream(on_made, _WHAT),
                endpoint.host,
                endpoint.port,
                ssl=self._tls[1] if self._tls else None,
                ssl_handshake_timeout=timeout if self._tls else None,
            )
            conn = made[0]
            try:
                sock = transport.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
                conn.start()
                await conn.proved
            except BaseException:
                conn.close("the handshake did not finish")
                raise
        if conn.error is not None:
            raise conn.error
        return conn

    async def _pump(self, dest: _Destination, conn: Dialed) -> None:
        """Write what is queued for ``dest`` until the connection ends (raised)."""
        dest.conn = conn
        stream = conn.stream
        while conn.error is None:
            if dest.frames and not stream.behind:
                self._write_batch(dest, conn)
            elif stream.behind:
                await stream.drain()  # raises once the connection is lost
            else:
                dest.wake.clear()
                await dest.wake.wait()
        raise conn.error

    def _write_batch(self, dest: _Destination, conn: Dialed) -> None:
        frames, size = dest.frames, 0
        batch: list[bytes] = []
        while frames and size < WRITE_BATCH_BYTES and len(batch) < _BATCH_FRAMES:
            frame = frames.popleft()
            batch.append(frame)
            size += len(frame)
        dest.queued -= size
        conn.write(batch)
        self._refill(dest)
        if not frames and dest.dropping:
            dest.dropping = False
            log.info("replica %d of %r takes frames again", dest.replica, self.instance)

    # --- receiving -------------------------------------------------------------------------

    def _on_accepted(self, incoming: Incoming) -> None:
        """A connection was accepted: admitted (perhaps evicting one that has not proved
        itself yet) before any byte of it is read, or refused."""
        source = incoming.source

        def evict(why: str) -> None:
            self._refused(source, "replica connection from %s closed: %s", incoming.address, why)
            incoming.drop()

        slot = self.admission.admit(source, evict)
        if slot is None:
            self._refused(
                source,
                "replica connection from %s refused: all %d connections are authenticated",
                incoming.address,
                self.settings.max_connections,
            )
            incoming.drop()
            return
        task = incoming.start(self._serve(incoming, slot))
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _serve(self, incoming: Incoming, slot: Slot) -> None:
        """An admitted connection, from its TLS handshake (if any) to its end: the
        replication handshake within the handshake timeout, then its frames until it
        ends, or is idle for the idle timeout. Its end is one line, through the refusal
        log: under its address, or its own count once it proved itself."""
        timeout = self.settings.handshake_timeout_s
        made: list[Accepted] = []

        def on_made(stream: TransportStream) -> None:
            end = Accepting(
                self._secret, self.instance, self.replica, max_frame=self.max_frame_bytes
            )
            made.append(
                Accepted(
                    stream,
                    end,
                    partial(self._authenticated, slot),
                    self._deliver,
                )
            )

        tls = self._tls[0] if self._tls else None
        try:
            await incoming.connect(lambda: TransportStream(on_made, _WHAT), tls, timeout)
        except TimeoutError:
            why, level = f"no TLS handshake within {timeout:g} s", logging.WARNING
        except ssl.SSLError as exc:  # a peer TLS refuses (certificate, version, ...)
            why, level = f"TLS failed: {exc}", logging.WARNING
        except (ConnectionError, OSError) as exc:
            why, level = str(exc) or type(exc).__name__, logging.INFO
        else:
            conn = made[0]
            try:
                why, level = await self._served(conn, timeout)
            finally:
                conn.close("closed")
                peer = conn.end.peer
                if peer is not None and self._in.get(peer) is conn:
                    del self._in[peer]
        finally:
            self.admission.release(slot)
        if made and made[0].end.authenticated:
            key = slot.refusal_key(f"replica {made[0].end.peer}")
            who = f"replica {made[0].end.peer} at {incoming.address}"
        else:
            key, who = incoming.source, incoming.address
        self._refused(key, "replica connection from %s closed: %s", who, why, level=level)

    async def _served(self, conn: Accepted, timeout: float) -> tuple[str, int]:
        """Wait for ``conn`` to end; return why it did, and how loud to say it."""
        loop = asyncio.get_running_loop()
        idle = self.settings.idle_timeout_s
        try:
            async with asyncio.timeout(timeout):
                await conn.proved
        except TimeoutError:
            return f"no replication handshake within {timeout:g} s", logging.WARNING
        # One timer per idle period, looked at when it fires, rather than one per read.
        while not conn.ended.done():
            left = conn.last_read + idle - loop.time()
            if left <= 0:
                return f"nothing received for {idle:g} s", logging.INFO
            await asyncio.wait((conn.ended,), timeout=left)
        exc = conn.error
        if isinstance(exc, ReplicationProtocolError):
            return str(exc), logging.WARNING
        return str(exc) or type(exc).__name__, logging.INFO

    def _authenticated(self, slot: Slot, conn: Accepted) -> None:
        """``conn``'s peer proved itself: never evicted from now on, and its current
        connection (a sender has one: an older one of its is closed)."""
        self.admission.establish(slot)
        peer = conn.end.peer
        assert peer is not None
        old = self._in.get(peer)
        if old is not None and old is not conn:
            old.close(f"replaced by a newer connection from replica {peer}")
        self._in[peer] = conn

    def _deliver(self, conn: Accepted, messages: list[Message]) -> None:
        """Hand ``conn``'s messages on, in order, while it is its sender's current one."""
        peer = conn.end.peer
        assert peer is not None
        for message in messages:
            if conn.error is not None:
                return  # closed meanwhile (by on_message, say): the rest goes with it
            try:
                self._on_message(peer, message)
            except Exception:
                # A fault of the receiver's, not of the peer: said loudly; the
                # connection ends (what it carried is asked for again), the process not.
                log.exception(
                    "on_message failed for a %s from replica %d", type(message).__name__, peer
                )
                conn.close(f"on_message failed for a {type(message).__name__}")
