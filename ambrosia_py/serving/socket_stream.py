"""A :class:`~.stream.Stream` over a raw non-blocking socket on the event loop.

Beyond the stream copies of reading, asyncio's transports copy every write:
``writelines`` joins the buffers, and the transport copies what the socket does not take
at once into its own buffer and shifts that buffer as it empties. At 64 KiB per call
those copies (and the page faults of the fresh memory they need) cost more than the
kernel's own copy. Here:

* writing sends the caller's buffers as they are with a non-blocking ``sendmsg``; what
  the socket does not take waits in a queue as the same buffers (the one cut in two as a
  view of its rest) and goes out, in order, when the socket is writable;
* reading hands on the fresh ``bytes`` of one ``recv`` (the kernel's copy only).

Buffers handed to :meth:`SocketStream.writelines` must not change afterwards: the wire
encoders hand out immutable ``bytes`` and views of them.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable, Iterable
from itertools import islice
from typing import Final

from .. import crashpoints
from ..iov import IOV_MAX, advance, byte_sized, send_all
from ..wire import Payload
from .stream import Stream

__all__ = ["DEFAULT_HIGH_WATER", "READ_SIZE", "SocketStream"]

READ_SIZE: Final = 256 * 1024  # bytes asked of one recv (asyncio's transports ask as much)
DEFAULT_HIGH_WATER: Final = 64 * 1024  # asyncio's transports' own default


class SocketStream(Stream[OSError]):
    """One connected non-blocking socket, read and written on the running event loop.

    Owns the socket: :meth:`close` closes it. Besides :meth:`read_each`, :meth:`read`
    waits for one read (a start-up's few reads, where a callback would only be a future
    in disguise).
    """

    def __init__(
        self,
        sock: socket.socket,
        high_water: int = DEFAULT_HIGH_WATER,
        what: str = "the connection",
    ) -> None:
        super().__init__(what)
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._high_water = high_water
        self._queue: deque[Payload] = deque()  # what the socket has not taken yet, in order
        self._queued = 0  # bytes in _queue
        self._writing = False  # a writable callback is registered
        # the readable callback registered, one of the two readers' (or None)
        self._watching: Callable[[], None] | None = None
        self._each: Callable[[], None] = self._read_ready  # read_each's reader
        self._once: Callable[[], None] = self._readable  # read()'s reader
        self._reading: tuple[asyncio.Future[bytes], int] | None = None  # read()'s wait
        self._closed = False

    # -- reading -----------------------------------------------------------------------

    async def read(self, n: int = READ_SIZE) -> bytes:
        """Up to ``n`` bytes as one fresh ``bytes``; ``b""`` at the end of the stream or
        once :meth:`close` was called. A reset connection raises its ``OSError`` (and
        :meth:`drain` raises after it). Not while :meth:`read_each`'s reader is
        registered.

        The socket stays registered with the loop between reads while readers keep
        coming (a request and its answer: two system calls and the selector's
        bookkeeping saved per read); it is dropped only when it turns readable with no
        reader waiting, which would otherwise wake the loop again and again.
        """
        if self._closed:
            return b""
        assert self._on_data is None, "one reader at a time"
        try:
            return self._sock.recv(n)
        except BlockingIOError:
            pass
        except OSError as exc:
            self._fail(exc)
            raise
        waiter: asyncio.Future[bytes] = self._loop.create_future()
        self._reading = (waiter, n)
        self._register(self._once)
        try:
            return await waiter
        finally:
            self._reading = None

    def _readable(self) -> None:
        """:meth:`read`'s callback."""
        reading = self._reading
        if reading is None or reading[0].done():  # no one to read for: stop watching
            self._unwatch()
            return
        waiter, n = reading
        try:
            data = self._sock.recv(n)
        except BlockingIOError:
            return
        except OSError as exc:  # reset: writes go nowhere now either
            self._fail(exc)
            waiter.set_exception(exc)
        else:
            waiter.set_result(data)

    def _read_ready(self) -> None:
        """:meth:`read_each`'s callback: one ``recv``, handed on as it is."""
        on_data = self._on_data
        if on_data is None or self._paused:
            self._unwatch()
            return
        try:
            data = self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:  # reset: writes go nowhere now either
            self._unwatch()
            self._fail(exc)
            self._fail_reads(exc)
            return
        if not data:
            self._unwatch()
            self._end_reads()
            return
        on_data(data)

    def _watch(self) -> None:
        self._register(self._each)

    def _register(self, callback: Callable[[], None]) -> None:
        """``callback`` (one of the two readers') runs when the socket is readable."""
        if self._watching is not callback and not self._closed:
            self._loop.add_reader(self._fd, callback)
            self._watching = callback

    def _unwatch(self) -> None:
        if self._watching is not None:
            self._loop.remove_reader(self._fd)
            self._watching = None

    # -- writing -----------------------------------------------------------------------

    def writelines(self, parts: Iterable[Payload]) -> None:
        """Send ``parts`` after what is queued, without copying: as much as the socket
        takes now, the rest when it is writable. Once the peer is gone (or after
        :meth:`close`) writes are dropped; :meth:`drain` reports the loss."""
        if self._gone is not None or self._closed:
            return
        queue = self._queue
        for part in parts:
            if type(part) is not bytes:
                part = byte_sized(part)
            size = len(part)
            if size:
                queue.append(part)
                self._queued += size
        if not self._writing and queue:
            self._flush()

    @property
    def queued(self) -> int:
        return self._queued

    @property
    def closing(self) -> bool:
        return self._closed or self._gone is not None

    @property
    def _full(self) -> bool:
        return self._queued > self._high_water

    def _flush(self) -> None:
        """Send from the queue until it is empty or the socket is full."""
        queue = self._queue
        sock = self._sock
        while queue:
            if len(queue) <= IOV_MAX:
                batch: Iterable[Payload] = queue
                size = self._queued
            else:
                batch = list(islice(queue, IOV_MAX))
                size = sum(map(len, batch))
            try:
                sent = sock.sendmsg(batch)
            except BlockingIOError:
                break
            except OSError as exc:
                self._fail(exc)
                return
            self._queued -= sent
            if sent < size:  # the socket is full
                advance(queue, sent)
                break
            if batch is queue:
                queue.clear()
            else:
                advance(queue, sent)
        if queue and not self._writing:
            self._writing = True
            self._loop.add_writer(self._fd, self._flush)
        elif not queue and self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        if self._queued <= self._high_water:
            self._wake_drainers()

    def _fail(self, exc: OSError) -> None:
        """A write found the peer gone: what is queued is dropped, drain raises."""
        self._gone = exc
        self._drop_queue()

    def _drop_queue(self) -> None:
        self._queue.clear()
        self._queued = 0
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        self._wake_drainers()

    # -- crash point, closing -----------------------------------------------------------

    def reach_midway(self, name: str, parts: list[Payload]) -> None:
        """Crash point ``name`` halfway through writing ``parts`` (``crashpoints``).

        Armed (in tests only), what is queued is sent first, blocking, so the half of
        ``parts`` the point writes lands right after it in the stream: the peer sees the
        stream cut inside these parts, as the point promises.
        """
        if crashpoints.armed() != name or self.closing:
            return
        self._sock.setblocking(True)
        try:
            send_all(self._sock, self._queue)
            self._queued = 0
            crashpoints.reach_midway(name, self._sock, parts)
        except OSError as exc:
            self._fail(exc)
        finally:
            self._sock.setblocking(False)
        self._flush()

    def close(self) -> None:
        """Close the socket: the reader gets ``b""`` (a read waiting returns it), a drain
        waiting returns: closing is no loss.

        What is still queued gets one last non-blocking try, as much as the socket takes.
        """
        if self._closed:
            return
        if self._queue and self._gone is None:
            self._flush()
        self._drop_queue()
        self._closed = True
        self._unwatch()
        self._end_reads()
        if self._reading is not None:
            waiter, _ = self._reading
            if not waiter.done():
                waiter.set_result(b"")
        self._sock.close()
