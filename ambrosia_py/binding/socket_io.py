"""The binding's end of one coordinator socket, moving bytes without copying them.

asyncio's streams copy every payload several times: ``writelines`` joins the buffers,
the transport copies what the socket does not take at once into its own buffer and
shifts that buffer as it empties; ``StreamReader`` copies each received chunk into its
buffer and again out of it. At 64 KiB per call those copies (and the page faults of the
fresh memory they need) cost more than the kernel's own copy. Here:

* writing sends the caller's buffers as they are with a non-blocking ``sendmsg``; what
  the socket does not take waits in a queue as the same buffers (the one cut in two as a
  view of its rest) and goes out, in order, when the socket is writable;
* reading returns the fresh ``bytes`` of one ``recv`` (the kernel's copy only), which
  :class:`~ambrosia_py.wire.RecordReader` keeps by reference.

Buffers handed to :meth:`SocketStream.writelines` must not change afterwards: the wire
encoders hand out immutable ``bytes`` and views of them.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable, Iterable
from functools import partial
from itertools import islice
from typing import Any, Final, TypeVar

from .. import crashpoints
from ..iov import IOV_MAX, advance, byte_sized, send_all
from ..wire import Payload as Buffer

__all__ = ["HIGH_WATER", "READ_SIZE", "SocketStream", "open_socket"]

READ_SIZE: Final = 256 * 1024  # bytes asked of one recv (asyncio's transports ask as much)
# drain() waits while more than this is queued. Queued buffers are the encoder's own (no
# copy), so the mark bounds memory the binding holds anyway, not memory it adds; it is
# large enough that the binding goes on handling records while the coordinator takes a
# few 64 KiB calls (a socket buffer's worth, about a group commit's), small enough that a
# binding producing faster than its coordinator logs is held back within a few
# milliseconds of the coordinator's work.
HIGH_WATER: Final = 1 << 20
_T = TypeVar("_T")


async def open_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP connection to ``host:port`` (each address in turn), Nagle off.

    Nagle's algorithm off as asyncio's transports have it: the binding writes whole
    records and waits for answers, which Nagle would hold back for an acknowledgement.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"cannot connect to {host}:{port}: " + "; ".join(map(str, errors)))


class SocketStream:
    """Reading and writing one connected non-blocking socket on the running event loop.

    Owns the socket: :meth:`close` closes it. Meant for one reader at a time; writes may
    come from anywhere on the loop and keep their order.
    """

    def __init__(self, sock: socket.socket, high_water: int = HIGH_WATER) -> None:
        sock.setblocking(False)
        self._sock = sock
        self._fd = sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._high_water = high_water
        self._queue: deque[Buffer] = deque()  # what the socket has not taken yet, in order
        self._queued = 0  # bytes in _queue
        self._writing = False  # a writable callback is registered
        self._drainers: list[asyncio.Future[None]] = []
        # the waiting read: its future, what it gets at the end, how it reads
        self._reading: tuple[asyncio.Future[Any], object, Callable[[], Any]] | None = None
        self._watching = False  # the socket is registered with the loop for reading
        self._error: OSError | None = None  # the write that found the peer gone
        self._closed = False
        # read_each's callbacks: each read's bytes (b"" at the end), a failed read
        self._on_data: Callable[[bytes], None] | None = None
        self._on_error: Callable[[OSError], None] | None = None
        self._paused = False

    @property
    def queued(self) -> int:
        """Bytes written but not yet taken by the socket."""
        return self._queued

    # -- reading -----------------------------------------------------------------------

    async def read(self, n: int = READ_SIZE) -> bytes:
        """Up to ``n`` bytes as one fresh ``bytes``; ``b""`` at the end of the stream or
        once :meth:`close` was called. A reset connection raises its ``OSError``."""
        return await self._receive(partial(self._sock.recv, n), b"")

    async def _receive(self, recv: Callable[[], _T], at_end: _T) -> _T:
        """``recv()`` once the socket is readable; ``at_end`` once closed.

        The socket stays registered with the loop between reads while readers keep
        coming (a request and its answer: two system calls and the selector's
        bookkeeping saved per read); it is dropped only when it turns readable with no
        reader waiting, which would otherwise wake the loop again and again.
        """
        if self._closed:
            return at_end
        try:
            return recv()
        except BlockingIOError:
            pass
        waiter: asyncio.Future[_T] = self._loop.create_future()
        self._reading = (waiter, at_end, recv)
        if not self._watching:
            self._loop.add_reader(self._fd, self._readable)
            self._watching = True
        try:
            return await waiter
        finally:
            self._reading = None

    def _readable(self) -> None:
        reading = self._reading
        if reading is None or reading[0].done():  # no one to read for: stop watching
            self._loop.remove_reader(self._fd)
            self._watching = False
            return
        waiter, _, recv = reading
        try:
            data = recv()
        except BlockingIOError:
            return
        except OSError as exc:
            waiter.set_exception(exc)
        else:
            waiter.set_result(data)

    def read_each(
        self, on_data: Callable[[bytes], None], on_error: Callable[[OSError], None]
    ) -> None:
        """Hand each read to ``on_data`` as the socket turns readable, in the loop's
        callback (no task woken for it: a loop turn less per read than :meth:`read`);
        ``b""`` once, at the end of the stream or on :meth:`close`. A failed read goes to
        ``on_error`` instead, and nothing after it. Instead of :meth:`read`, for good."""
        assert self._reading is None and self._on_data is None, "one reader at a time"
        self._on_data, self._on_error = on_data, on_error
        if self._closed:
            self._end_reads()
            return
        self._watch()

    def pause_reading(self) -> None:
        """Stop handing reads to ``read_each``'s callback until :meth:`resume_reading`."""
        self._paused = True
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False

    def resume_reading(self) -> None:
        self._paused = False
        if self._on_data is not None and not self._closed:
            self._watch()

    def _watch(self) -> None:
        if not self._watching:
            self._loop.add_reader(self._fd, self._read_ready)
            self._watching = True

    def _read_ready(self) -> None:
        if self._paused or self._on_data is None:
            return
        try:
            data = self._sock.recv(READ_SIZE)
        except BlockingIOError:
            return
        except OSError as exc:
            on_error = self._on_error
            self._end_reads(None)
            if on_error is not None:
                on_error(exc)
            return
        if not data:
            self._end_reads()
            return
        self._on_data(data)

    def _end_reads(self, last: bytes | None = b"") -> None:
        """No more reads for ``read_each``'s callback; ``last`` is its final call."""
        on_data, self._on_data, self._on_error = self._on_data, None, None
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False
        if on_data is not None and last is not None:
            on_data(last)

    # -- writing -----------------------------------------------------------------------

    def write(self, data: Buffer) -> None:
        """:meth:`writelines` of one buffer."""
        self.writelines((data,))

    def writelines(self, parts: Iterable[Buffer]) -> None:
        """Send ``parts`` after what is queued, without copying: as much as the socket
        takes now, the rest when it is writable. Once the peer is gone (or after
        :meth:`close`) writes are dropped; :meth:`drain` reports the loss."""
        if self._error is not None or self._closed:
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
    def behind(self) -> bool:
        """Whether :meth:`drain` would not return at once: more than the high-water mark
        is queued, or a write found the peer gone (drain raises that)."""
        return self._queued > self._high_water or self._error is not None

    async def drain(self) -> None:
        """Wait while more than the high-water mark is queued (the back-pressure).

        Raises ``ConnectionError`` once a write found the peer gone.
        """
        if self._queued > self._high_water and self._error is None and not self._closed:
            waiter = self._loop.create_future()
            self._drainers.append(waiter)
            await waiter
        if self._error is not None:
            raise ConnectionResetError(
                f"the connection to the coordinator is lost ({self._error})"
            ) from self._error

    def _flush(self) -> None:
        """Send from the queue until it is empty or the socket is full."""
        queue = self._queue
        sock = self._sock
        while queue:
            if len(queue) <= IOV_MAX:
                batch: Iterable[Buffer] = queue
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
        self._error = exc
        self._drop_queue()

    def _drop_queue(self) -> None:
        self._queue.clear()
        self._queued = 0
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        self._wake_drainers()

    def _wake_drainers(self) -> None:
        drainers, self._drainers = self._drainers, []
        for waiter in drainers:
            if not waiter.done():
                waiter.set_result(None)

    # -- crash point, closing -----------------------------------------------------------

    def reach_midway(self, name: str, parts: list[Buffer]) -> None:
        """Crash point ``name`` halfway through writing ``parts`` (``crashpoints``).

        Armed (in tests only), what is queued is sent first, blocking, so the half of
        ``parts`` the point writes lands right after it in the stream: the peer sees the
        stream cut inside these parts, as the point promises.
        """
        if crashpoints.armed() != name or self._error is not None or self._closed:
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
        """Close the socket: a read waiting ends with ``b""``, a drain waiting returns.

        What is still queued gets one last non-blocking try, as much as the socket takes.
        """
        if self._closed:
            return
        if self._queue and self._error is None:
            self._flush()
        self._drop_queue()
        self._closed = True
        if self._watching:
            self._loop.remove_reader(self._fd)
            self._watching = False
        if self._on_data is not None:
            self._end_reads()
        if self._reading is not None:
            waiter, at_end, _ = self._reading
            if not waiter.done():
                waiter.set_result(at_end)
        self._sock.close()
