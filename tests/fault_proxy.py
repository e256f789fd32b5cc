"""A fault-injecting TCP proxy for tests: it sits between two coordinators on loopback and
damages what a link carries, the way a bad network (or a man in the middle) would.

:class:`FaultProxy` listens on a free 127.0.0.1 port and forwards every connection to a
target, in a thread with its own event loop. Each direction of each connection suffers
the :class:`Faults` of the :class:`FaultPlan`, decided by a :class:`random.Random`
seeded from the proxy's seed and the connection's number:

``cut``
    after a random number of bytes (almost always inside a frame) the proxy forwards the
    bytes up to that point and drops both sides of the connection (RST or FIN).
``delay``
    a chunk waits before it is forwarded (and everything behind it in that direction),
    so the two directions and successive connections arrive at shifted times.
``split``
    a chunk goes out as a few small segments with pauses between them, so the receiver
    reads frames in pieces.
``flip``
    one bit of one byte is inverted: the flow checksum, a frame's tag or TLS must notice.
    ``flip_at`` instead flips exactly one bit at a stream offset drawn from a range (the
    pre-authentication handshake, say), once per connection and direction.
``duplicate``
    TCP never delivers a segment twice, so a replay is modelled above it: a copy of a
    recent chunk is written into the stream again. The framing (or the frame counter in
    the tags, or TLS's record numbers) must reject it; nothing may be delivered twice.
``reorder``
    a chunk is held back and written after the next one (if none comes within
    ``max_delay``, its tail goes out before its head), which breaks the stream the same
    way: whole frames swapped fail the tags' frame counter, anything else the framing.

Every fault injected is counted by kind (:meth:`FaultProxy.counts`), and each connection
keeps its own record (:attr:`FaultProxy.connections`): the port the proxy dialed the
target from (what the target logs as the peer's address) and the faults it suffered.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections import deque
from dataclasses import dataclass, field
from types import TracebackType

__all__ = ["KINDS", "FaultPlan", "FaultProxy", "Faults", "ProxiedConnection"]

KINDS = ("cut", "delay", "split", "flip", "duplicate", "reorder")
READ_SIZE = 64 * 1024
DEADLINE = 30.0


@dataclass(frozen=True)
class Faults:
    """What one direction of a proxied connection suffers. Rates are chances per chunk
    read from the sender, except ``cut``: the chance that a connection is cut at all."""

    cut: float = 0.0
    cut_after: tuple[int, int] = (1, 8192)  # bytes forwarded before the cut, drawn uniformly
    delay: float = 0.0
    max_delay: float = 0.02  # seconds
    split: float = 0.0
    max_segments: int = 8
    max_pause: float = 0.002  # seconds between segments
    flip: float = 0.0
    flip_at: tuple[int, int] | None = None  # one flip at an offset in [start, end)
    duplicate: float = 0.0
    reorder: float = 0.0
    history: int = 4  # how far back a duplicated chunk may come from


@dataclass(frozen=True)
class FaultPlan:
    """Faults dialer -> target (``forward``) and target -> dialer (``backward``), for the
    first ``faulty_connections`` connections (all of them if None); later ones are clean."""

    forward: Faults = Faults()
    backward: Faults = Faults()
    faulty_connections: int | None = None


@dataclass
class ProxiedConnection:
    """One connection through the proxy and what was done to it."""

    index: int
    upstream_port: int = 0  # the proxy's port on its connection to the target
    faults: list[tuple[str, str, int]] = field(default_factory=list)  # direction, kind, offset

    def kinds(self) -> set[str]:
        return {kind for _, kind, _ in self.faults}


class _Cut(Exception):
    """This direction reached its cut: drop the connection."""


class FaultProxy:
    """A TCP proxy from a free 127.0.0.1 port to ``target``, injecting ``plan``'s faults.

    Use as a context manager, or call :meth:`close`. ``port`` is where to connect.
    """

    def __init__(self, target: tuple[str, int], plan: FaultPlan, seed: int = 0) -> None:
        self.target = target
        self.plan = plan
        self.seed = seed
        self.connections: list[ProxiedConnection] = []
        self._counts = dict.fromkeys(KINDS, 0)
        self._lock = threading.Lock()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self.port: int = self._listener.getsockname()[1]
        self._loop = asyncio.new_event_loop()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(DEADLINE)

    # --- the public side -------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """Faults injected so far, by kind (every kind of :data:`KINDS` present)."""
        with self._lock:
            return dict(self._counts)

    def records(self) -> list[ProxiedConnection]:
        """A copy of the connection records so far."""
        with self._lock:
            return [
                ProxiedConnection(c.index, c.upstream_port, list(c.faults))
                for c in self.connections
            ]

    def close(self) -> None:
        if self._loop.is_closed():
            return
        with contextlib.suppress(TimeoutError, RuntimeError):
            asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(DEADLINE)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(DEADLINE)
        if not self._thread.is_alive():
            self._loop.close()
        self._listener.close()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- the event loop's side -------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._accepted, sock=self._listener)

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _note(self, conn: ProxiedConnection, direction: str, kind: str, offset: int) -> None:
        with self._lock:
            self._counts[kind] += 1
            conn.faults.append((direction, kind, offset))

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            with self._lock:
                conn = ProxiedConnection(len(self.connections))
                self.connections.append(conn)
            await self._proxy(conn, reader, writer)
        finally:
            self._tasks.discard(task)

    async def _proxy(
        self,
        conn: ProxiedConnection,
        down_reader: asyncio.StreamReader,
        down_writer: asyncio.StreamWriter,
    ) -> None:
        try:
            async with asyncio.timeout(DEADLINE):
                up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            down_writer.transport.abort()
            return
        for w in (down_writer, up_writer):
            w.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn.upstream_port = up_writer.get_extra_info("sockname")[1]
        limit = self.plan.faulty_connections
        faulty = limit is None or conn.index < limit
        pumps = [
            asyncio.create_task(
                self._pump(conn, name, reader, writer, faults if faulty else Faults())
            )
            for name, reader, writer, faults in (
                ("forward", down_reader, up_writer, self.plan.forward),
                ("backward", up_reader, down_writer, self.plan.backward),
            )
        ]
        abort = False
        try:
            done, _ = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            abort = any(not t.cancelled() and isinstance(t.exception(), _Cut) for t in done)
        finally:
            for task in pumps:
                task.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for w in (down_writer, up_writer):
                if abort:
                    w.transport.abort()
                else:
                    w.close()

    async def _pump(
        self,
        conn: ProxiedConnection,
        direction: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        faults: Faults,
    ) -> None:
        """Copy one direction, injecting ``faults``; ends at EOF, an error or a cut."""
        rng = random.Random(f"{self.seed}/{conn.index}/{direction}")
        cut_at = rng.randint(*faults.cut_after) if rng.random() < faults.cut else None
        flip_at = rng.randrange(*faults.flip_at) if faults.flip_at else None
        recent: deque[bytes] = deque(maxlen=faults.history)
        held: bytes | None = None  # a chunk being reordered behind the next one
        offset = 0  # of the sender's bytes in this direction
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                if held is None:
                    data = await reader.read(READ_SIZE)
                else:
                    try:
                        async with asyncio.timeout(faults.max_delay):
                            data = await reader.read(READ_SIZE)
                    except TimeoutError:  # nothing came to swap it with: swap its halves
                        at = rng.randrange(1, len(held)) if len(held) > 1 else 0
                        if at:
                            self._note(conn, direction, "reorder", offset - len(held) + at)
                        await self._write(writer, held[at:] + held[:at])
                        held = None
                        continue
                if not data:
                    if held is not None:
                        await self._write(writer, held)
                    return
                chunk = bytearray(data)
                start, offset = offset, offset + len(chunk)
                # One draw of each decision per chunk, in a fixed order.
                draws = [rng.random() for _ in range(5)]
                if flip_at is not None and start <= flip_at < offset:
                    self._flip(chunk, flip_at - start, rng)
                    self._note(conn, direction, "flip", flip_at)
                    flip_at = None
                if draws[0] < faults.flip:
                    at = rng.randrange(len(chunk))
                    self._flip(chunk, at, rng)
                    self._note(conn, direction, "flip", start + at)
                if cut_at is not None and offset >= cut_at:
                    await self._write(writer, bytes(chunk[: cut_at - start]))
                    self._note(conn, direction, "cut", cut_at)
                    raise _Cut
                if draws[1] < faults.delay:
                    self._note(conn, direction, "delay", start)
                    await asyncio.sleep(rng.uniform(0, faults.max_delay))
                payload = bytes(chunk)
                recent.append(payload)
                if held is None and draws[2] < faults.reorder:
                    held = payload  # goes out after the next chunk, or after its own tail
                    continue
                if draws[3] < faults.split and len(payload) > 1:
                    self._note(conn, direction, "split", start)
                    await self._write_split(writer, payload, faults, rng)
                else:
                    await self._write(writer, payload)
                if held is not None:
                    self._note(conn, direction, "reorder", start)
                    await self._write(writer, held)
                    held = None
                if draws[4] < faults.duplicate:
                    self._note(conn, direction, "duplicate", offset)
                    await self._write(writer, rng.choice(list(recent)))

    @staticmethod
    def _flip(chunk: bytearray, at: int, rng: random.Random) -> None:
        chunk[at] ^= 1 << rng.randrange(8)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, data: bytes) -> None:
        if data:
            writer.write(data)
            await writer.drain()

    async def _write_split(
        self, writer: asyncio.StreamWriter, data: bytes, faults: Faults, rng: random.Random
    ) -> None:
        pieces = rng.randint(2, max(2, min(faults.max_segments, len(data))))
        cuts = sorted(rng.sample(range(1, len(data)), pieces - 1))
        for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True):
            await self._write(writer, data[a:b])
            await asyncio.sleep(rng.uniform(0, faults.max_pause))
