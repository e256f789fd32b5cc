"""The connector's edge: everything of the Wallaroo source connector that touches the
world, outside the determinism boundary (:mod:`immortals.wallaroo.connector` is the
immortal, :mod:`immortals.wallaroo.connector_core` its state and rules).

:class:`ConnectorEdge` dials, splits the worker's bytes into frames and reports them as
impulses through a :class:`Sink` (logged before a handler sees them), writes what
handlers decided (effects of this incarnation), and runs the source readers. Credits
are a property of one live connection: the edge counts them, taking what OK, ACK and
NACK grant as they arrive, and holds back frames the core marked as costing one.

The edge only dials, so no stranger can connect to it; what a worker (or whatever
answers at its address) can make it hold is still bounded (:data:`LIMITS`): from the
worker it buffers at most one frame of ``--max-frame-bytes`` and one read; the worker's
first frame, and the rest of any frame begun, must come within ``handshake_timeout_s``
or the connection is closed (and dialled again, as for any lost connection); a worker
that leaves more than ``max_buffered_output`` of our messages unread stops the readers
until it takes them, and is disconnected if it stays over for ``output_stall_s``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections.abc import Coroutine, Iterable
from typing import Final, Protocol

from ambrosia_py.serving import ConnectionLimits, OutputStalled, limit_output, wait_for_room

from .codec import DIALECTS, split_frames
from .connector_actions import (
    Actions,
    Close,
    Commit,
    ConnectorConfig,
    Dial,
    Go,
    Halt,
    MessageEncoder,
    RetryLater,
    Stop,
    Write,
    granted,
    parse_address,
)
from .connector_link import LinkReader, open_connection
from .errors import EncodeError
from .sources import Source, SourceError

__all__ = ["LIMITS", "ConnectorEdge", "Sink"]

log = logging.getLogger("immortals.wallaroo.connector")

_READ_SIZE: Final = 256 * 1024
_RECORDS_PER_READ: Final = 512  # records a reader asks its source for at once
_CONNECT_TIMEOUT: Final = 5.0
_FIRST_DELAY: Final = 0.05  # seconds before the first retry; doubled up to --backoff-max
_ANSWER_SECONDS: Final = 10.0  # how long an oversize frame's connection waits for the ERROR

LIMITS: Final = ConnectionLimits(
    handshake_timeout_s=10.0, max_buffered_output=4 * 1024 * 1024, output_stall_s=30.0
)
"""What the edge bounds on each connection to a worker (see the module); it admits no
connections, so the other fields are unused."""


class Sink(Protocol):
    """Where the edge reports: the connector's impulses."""

    def connected(self, dial: int, conn: str, address: str) -> None: ...
    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None: ...
    def too_large(self, conn: str, offset: int, size: int) -> None: ...
    def closed(self, conn: str) -> None: ...
    def halted(self, conn: str, stream_id: int, generation: int, point: int, end: bool) -> None: ...
    def failed(self, conn: str, stream_id: int, generation: int, reason: str) -> None: ...
    def retry(self, conn: str, stream_id: int) -> None: ...


class _Run:
    """A source reader: one stream sent on one connection from a point."""

    __slots__ = ("generation", "last", "lead", "task")

    def __init__(self, generation: int, lead: bytes) -> None:
        self.generation = generation
        self.last: int | None = None  # the last point written; None until the start is known
        self.task: asyncio.Task[None] | None = None
        self.lead = lead  # its NOTIFY (Go.lead), until the first read succeeded


class _Link:
    """One connection to a worker: its writer, credits, and the frames waiting for them."""

    __slots__ = ("closed", "conn", "credits", "queue", "runs", "wake", "writer")

    def __init__(self, conn: str, writer: asyncio.StreamWriter) -> None:
        self.conn = conn
        self.writer = writer
        self.credits = 0
        self.queue: collections.deque[bytes] = collections.deque()  # charged control frames
        self.runs: dict[int, _Run] = {}
        self.wake = asyncio.Event()  # credits came or the queue emptied
        self.closed = asyncio.Event()

    def send_charged(self, frames: Iterable[bytes]) -> None:
        """Queue control frames that cost a credit each; they go before messages."""
        self.queue.extend(frames)
        self.flush()

    def flush(self) -> None:
        """Write the queued control frames the credits allow; they go before messages."""
        n = min(len(self.queue), self.credits)
        if n:
            self.writer.write(b"".join(self.queue.popleft() for _ in range(n)))
            self.credits -= n
        if not self.queue and self.credits > 0:
            self.wake.set()

    async def take(self, wanted: int) -> int:
        """Wait for credits no control frame is waiting for; take up to ``wanted``."""
        while self.credits <= 0 or self.queue:
            self.wake.clear()
            await self.wake.wait()
        n = min(wanted, self.credits)
        self.credits -= n
        return n


class ConnectorEdge:
    """The connector's asyncio side: dials, frames in, effects out, source readers.

    Effects arrive through :meth:`apply`, in the order handlers produced them. Every
    connection is named ``<incarnation>.<n>``. Back-off: a dial waits
    ``_FIRST_DELAY * 2^(attempt-1)`` seconds (at most ``backoff_max``) before its first
    try when the core counts failed sessions, and as long again between refused connects.
    """

    def __init__(
        self,
        sink: Sink,
        incarnation: str,
        config: ConnectorConfig,
        source: Source,
        backoff_max: float = 2.0,
    ) -> None:
        self._sink = sink
        self._incarnation = incarnation
        self._config = config
        self._source = source
        self._backoff_max = backoff_max
        self._order = DIALECTS[config.dialect].byte_order
        self._numbers = itertools.count(1)
        self._links: dict[str, _Link] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._encoders: dict[int, MessageEncoder] = {}
        self.sent = 0  # MESSAGE frames written, for benchmarks

    # -- effects ----------------------------------------------------------------------------

    def apply(self, actions: Actions) -> None:
        """Carry out what a handler decided (an effect of this incarnation)."""
        for problem in actions.problems:
            log.warning("%s", problem)
        for a in actions.actions:
            if isinstance(a, Write):
                self._write(a)
            elif isinstance(a, Go):
                self._go(a)
            elif isinstance(a, Stop):
                self._stop(a.conn, a.stream_id)
            elif isinstance(a, Halt):
                self._halt(a)
            elif isinstance(a, Commit):
                self._source.commit(a.name, a.point)
            elif isinstance(a, Dial):
                self._spawn(self._dial(a))
            elif isinstance(a, Close):
                self._close(a.conn)
            elif isinstance(a, RetryLater):
                self._spawn(self._retry_later(a))

    def _spawn(self, coro: Coroutine[None, None, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _delay(self, attempt: int) -> float:
        if attempt <= 0:
            return 0.0
        return float(min(_FIRST_DELAY * 2 ** min(attempt - 1, 30), self._backoff_max))

    def _write(self, w: Write) -> None:
        link = self._links.get(w.conn)
        if link is None:
            return  # the connection has gone; the core hears of it through ``closed``
        if w.charged:
            link.send_charged(w.frames)
        else:
            link.writer.write(b"".join(w.frames))

    def _close(self, conn: str) -> None:
        link = self._links.pop(conn, None)  # the core has forgotten it: no ``closed`` report
        if link is not None:
            self._end(link)

    def _end(self, link: _Link) -> None:
        for run in link.runs.values():
            if run.task is not None:
                run.task.cancel()
        link.runs.clear()
        link.closed.set()
        link.writer.close()

    # -- connections ----------------------------------------------------------------------

    async def _dial(self, d: Dial) -> None:
        await asyncio.sleep(self._delay(d.attempt))  # 0: at once
        addresses = (d.address, *d.others)  # tried in turn while none answers
        refused = 0
        while True:
            address = addresses[refused % len(addresses)]
            host, port = parse_address(address)
            try:
                reader, writer = await asyncio.wait_for(
                    open_connection(host, port), _CONNECT_TIMEOUT
                )
                break
            except (OSError, TimeoutError) as exc:
                refused += 1
                if refused in (1, 10) or refused % 100 == 0:
                    log.info("worker %s: %s (attempt %d)", address, exc, refused)
                if refused % len(addresses) == 0:
                    await asyncio.sleep(self._delay(max(refused // len(addresses), d.attempt)))
        conn = f"{self._incarnation}.{next(self._numbers)}"
        limit_output(writer, LIMITS)
        link = self._links[conn] = _Link(conn, writer)
        self._sink.connected(d.dial, conn, address)
        await self._read(link, reader)

    async def _read(self, link: _Link, reader: LinkReader) -> None:
        conn, sink = link.conn, self._sink
        limit, dialect = self._config.max_frame_bytes, self._config.dialect
        buf = bytearray()
        offset = 0  # stream offset of buf[0]
        heard = False  # a whole frame came (the answer to HELLO)
        try:
            while True:
                # The answer to HELLO, and the rest of a frame begun, must come in time;
                # a worker streaming nothing back to us may otherwise be quiet for good.
                wait = None if heard and not buf else LIMITS.handshake_timeout_s
                try:
                    async with asyncio.timeout(wait):
                        data = await reader.read(_READ_SIZE)
                except TimeoutError:
                    what = "in the middle of a frame" if heard else "before its first frame"
                    log.warning("connection %s closed: nothing for %g s %s", conn, wait, what)
                    break
                if not data or conn not in self._links:
                    if reader.failure is not None:  # whatever came before it was read
                        log.info("connection %s lost: %s", conn, reader.failure)
                    break
                buf += data
                frames, used, oversize = split_frames(buf, self._order, limit)
                if frames:
                    heard = True
                    sink.frames(conn, int(time.time() * 1000), frames)
                    credits = sum(granted(raw, dialect) for raw in frames)
                    if credits:  # at once: a refill does not wait for our log
                        link.credits += credits
                        link.flush()
                if oversize is not None:
                    sink.too_large(conn, offset + oversize[0], oversize[1])
                    # The core answers ERROR and closes; read no more meanwhile.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(link.closed.wait(), _ANSWER_SECONDS)
                    break
                del buf[:used]
                offset += used
        except OSError as exc:
            log.info("connection %s lost: %s", conn, exc)
        finally:
            if self._links.pop(conn, None) is not None:
                self._end(link)
                sink.closed(conn)

    async def _retry_later(self, r: RetryLater) -> None:
        await asyncio.sleep(self._delay(r.attempt + 1))
        if r.conn in self._links:
            self._sink.retry(r.conn, r.stream_id)

    # -- source readers ---------------------------------------------------------------------

    def _go(self, g: Go) -> None:
        link = self._links.get(g.conn)
        if link is None:
            return
        self._stop(g.conn, g.stream_id)
        run = link.runs[g.stream_id] = _Run(g.generation, g.lead)
        run.task = self._spawn(self._run(link, g, run))

    def _stop(self, conn: str, stream_id: int) -> _Run | None:
        link = self._links.get(conn)
        run = link.runs.pop(stream_id, None) if link is not None else None
        if run is not None and run.task is not None:
            run.task.cancel()
        if link is not None and run is not None and run.lead:
            # Stopped before its first read: its NOTIFY still answers a NACK on the stack
            # (seed 000: each NACK needs a NOTIFY), ahead of what the next reader sends.
            link.send_charged((run.lead,))
        return run

    def _halt(self, h: Halt) -> None:
        run = self._stop(h.conn, h.stream_id)
        if run is None:
            return  # it ended (its report is on the way) or its connection went
        if run.last is not None:
            self._sink.halted(h.conn, h.stream_id, h.generation, run.last, False)
            return

        async def report_origin() -> None:  # halted before it knew where it starts
            point = await self._source.origin(h.name)
            if h.conn in self._links:
                self._sink.halted(h.conn, h.stream_id, h.generation, point, False)

        self._spawn(report_origin())

    def _encoder(self, stream_id: int) -> MessageEncoder:
        enc = self._encoders.get(stream_id)
        if enc is None:
            cfg = self._config
            enc = self._encoders[stream_id] = MessageEncoder(
                cfg.dialect, stream_id, cfg.max_frame_bytes
            )
        return enc

    async def _run(self, link: _Link, g: Go, run: _Run) -> None:
        """Send ``g.name`` from ``g.start`` on while credits allow; report its end, or
        why the source cannot go on (seed 000, D5)."""
        try:
            end = await self._send(link, g, run)
        except (SourceError, EncodeError) as exc:
            reason = str(exc)
        except OutputStalled as exc:  # the worker takes nothing: reconnect, resume by points
            log.warning("connection %s closed: %s", link.conn, exc)
            link.writer.close()  # its reader sees the end and reports it closed
            return
        except ConnectionError:  # the connection failed: its reader reports it closed
            return
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a source's bug: halt its stream, never go on silently
            log.exception("the reader of %s failed", g.name)
            reason = f"the source failed: {exc!r}"
        else:
            if link.runs.get(g.stream_id) is run:
                del link.runs[g.stream_id]
                self._sink.halted(link.conn, g.stream_id, g.generation, end, True)
            return
        if link.runs.get(g.stream_id) is run:
            del link.runs[g.stream_id]
            self._sink.failed(link.conn, g.stream_id, g.generation, reason)

    async def _send(self, link: _Link, g: Go, run: _Run) -> int:
        """The reader's loop; returns the point the source ended at."""
        source = self._source
        last = g.start if g.start is not None else await source.origin(g.name)
        run.last = last
        encode = self._encoder(g.stream_id)
        pending: collections.deque[tuple[int, bytes]] = collections.deque()
        end = False
        while True:
            if not pending:
                if end:
                    return last
                batch = await source.read(g.name, last, _RECORDS_PER_READ)
                pending.extend(batch.records)
                end = batch.end
                if run.lead:  # the source reads from the point: its NOTIFY first (D5)
                    link.send_charged((run.lead,))
                    run.lead = b""
                continue
            await wait_for_room(link.writer, LIMITS)
            n = await link.take(len(pending))
            if link.writer.is_closing():  # a failed write ended it; writing on spins
                raise ConnectionResetError(f"connection {link.conn} is closed")
            chunk = [pending.popleft() for _ in range(n)]
            link.writer.write(b"".join([encode(point, data) for point, data in chunk]))
            last = run.last = chunk[-1][0]
            self.sent += n

    async def close(self) -> None:
        for link in list(self._links.values()):
            self._end(link)
        self._links.clear()
        for task in list(self._tasks):
            task.cancel()
        await self._source.close()
