"""One ingress connection on a blocking socket, used by the calling threads themselves.

:class:`~.sync_client.Client` runs its :class:`~.asyncio_client.AsyncClient` on an
event loop in a thread of its own, and every call crossing to that thread and back cost
the caller more than the rest of the call: two thread wake-ups, a task, a future for
each thread, and the loop's own turns, for every call (about 150 of the 220 µs a call
cost in the client's process with 16 threads calling). Once the service has been
reached, a :class:`BlockingLink` carries the calls instead: the calling thread encodes,
seals and sends its frame, then reads the socket itself until its answer has come, so a
call costs a ``sendall`` and a ``recv`` in the caller's thread and nothing in any other.

Many threads may share one link. Sending is serialised by a lock (frames are numbered
by their tags, so they must leave in the order they were sealed). Reading is done by
one waiting thread at a time, whichever comes first: it hands every answer it reads to
the thread waiting for it and wakes them, and when its own answer is in it stops
reading and another waiting thread takes over. The two directions share nothing in the
sans-IO :class:`~ambrosia_py.ingress.connection.ClientConnection` but its failure flag:
the send lock guards one, the state lock the other.

A failed connection fails every call waiting on it with :class:`LinkLost`; the client
sends those calls again, with their keys, through its event loop, which reconnects with
backoff (``asyncio_client.py``): retries, timeouts and the errors a user sees have one
implementation.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time

from ..ingress.connection import ClientConnection, ConnectionState
from ..ingress.errors import IngressProtocolError
from ..ingress.frames import Outcome, Refusal, Reply, ServiceInfo

__all__ = ["BlockingLink", "LinkLost"]

# What one read takes. Kept under glibc's threshold for a fresh memory mapping (128 KiB
# at first): a 256 KiB read buffer was mapped and unmapped on every read of a thread
# with no arena of its own, which cost as much as the rest of the call.
_READ_SIZE = 64 * 1024
# The longest a read blocks before the reading thread looks at its deadline again.
_READ_SLICE = 0.05


def _timeval(seconds: float) -> bytes:
    """``seconds`` as a ``struct timeval``, for SO_RCVTIMEO and SO_SNDTIMEO."""
    whole = int(seconds)
    return struct.pack("@ll", whole, int((seconds - whole) * 1_000_000))


class LinkLost(ConnectionError):
    """The connection failed while a call waited on it: send the call again."""


class BlockingLink:
    """An authenticated ingress connection that calling threads use directly (see the
    module docstring). :meth:`connect`, then :meth:`call` from any thread."""

    def __init__(self, sock: socket.socket, conn: ClientConnection, info: ServiceInfo) -> None:
        self._sock = sock
        self._conn = conn
        self.info = info
        self._send_lock = threading.Lock()
        self._state = threading.Condition(threading.Lock())
        self._next_id = 0
        self._waiting: set[int] = set()  # request ids whose answer a thread waits for
        self._answers: dict[int, Outcome | Refusal] = {}
        self._reading = False  # a thread is reading the socket for everyone
        self._failed: BaseException | None = None

    @property
    def open(self) -> bool:
        return self._failed is None

    @property
    def waiting(self) -> int:
        """Calls sent on it that wait for their answer."""
        with self._state:
            return len(self._waiting)

    @classmethod
    def connect(
        cls, host: str, port: int, secret: bytes, max_reply_frame: int, timeout: float
    ) -> BlockingLink:
        """Connect and complete the handshake within ``timeout`` seconds; raises
        :class:`OSError` or :class:`IngressProtocolError` (the caller falls back to its
        event loop's connection, which says what went wrong)."""
        deadline = time.monotonic() + timeout
        sock = socket.create_connection((host, port), timeout=timeout)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = ClientConnection(secret, max_reply_frame=max_reply_frame)
            while conn.state is not ConnectionState.OPEN:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                data = sock.recv(_READ_SIZE)
                if not data:
                    raise ConnectionResetError(f"{host}:{port} closed during the handshake")
                conn.receive_data(data)
                sock.sendall(conn.data_to_send())
            # Blocking from now on, its waits bounded by the kernel: a socket with a
            # Python timeout polls before every read and write, and each system call
            # gives up the interpreter lock and takes it back, which with many threads
            # calling costs more than the call itself.
            sock.settimeout(None)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(_READ_SLICE))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, _timeval(timeout))
        except BaseException:
            sock.close()
            raise
        assert conn.info is not None
        return cls(sock, conn, conn.info)

    def call(self, key: bytes, method_id: int, args: bytes, deadline: float) -> Outcome | Refusal:
        """Send a CALL and wait for its answer until ``deadline`` (``time.monotonic()``);
        raises :class:`LinkLost` if the connection fails, :class:`TimeoutError` at the
        deadline (the connection stays usable: a late answer is dropped).

        A call takes the send lock once and the state lock twice, once to be waited for
        and once to wait, held but while this thread reads the socket for everyone."""
        with self._send_lock:
            if self._failed is not None:
                raise LinkLost(f"the connection failed: {self._failed}")
            request_id = self._next_id
            self._next_id = (request_id + 1) & 0xFFFF_FFFF
            with self._state:  # waited for before it can be answered
                self._waiting.add(request_id)
            try:
                self._conn.call(request_id, key, method_id, args)
                self._sock.sendall(self._conn.data_to_send())
            except (OSError, IngressProtocolError) as exc:  # a send timeout too
                with self._state:
                    self._waiting.discard(request_id)
                raise self._fail(exc) from None
        return self._wait(request_id, deadline)

    def _wait(self, request_id: int, deadline: float) -> Outcome | Refusal:
        """The answer to ``request_id``: read by another thread, or by this one when no
        other reads. The state lock is held throughout but while this thread reads."""
        state = self._state
        with state:
            try:
                while True:
                    answer = self._answers.pop(request_id, None)
                    if answer is not None:
                        return answer
                    if self._failed is not None:
                        raise LinkLost(f"the connection failed: {self._failed}")
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError("no answer in time")
                    if self._reading:
                        state.wait(remaining)
                        continue
                    self._reading = True
                    events: list[ServiceInfo | Reply] = []
                    state.release()
                    try:
                        events = self._read()
                    finally:
                        state.acquire()
                        self._reading = False
                        for event in events:
                            if isinstance(event, Reply) and event.request_id in self._waiting:
                                self._answers[event.request_id] = event.answer
                        state.notify_all()
            finally:  # answered, failed or late: a late answer is dropped
                self._waiting.discard(request_id)
                self._answers.pop(request_id, None)

    def _read(self) -> list[ServiceInfo | Reply]:
        """One read of the socket, for every waiting thread (the state lock not held)."""
        try:
            data = self._sock.recv(_READ_SIZE)
            if not data:
                raise ConnectionResetError("the service closed the connection")
            return self._conn.receive_data(data)
        except BlockingIOError:
            return []  # a read slice passed: the caller looks at its deadline
        except (OSError, IngressProtocolError) as exc:
            self._fail(exc)
            return []

    def _fail(self, exc: BaseException) -> LinkLost:
        """The connection is unusable: every waiting call fails, the socket closes."""
        with self._state:
            if self._failed is None:
                self._failed = exc
                with contextlib.suppress(OSError):  # wakes a thread blocked reading it
                    self._sock.shutdown(socket.SHUT_RDWR)
                self._sock.close()
            self._state.notify_all()
        return LinkLost(f"the connection failed: {exc}")

    def close(self) -> None:
        """Close the connection; calls waiting on it raise :class:`LinkLost`."""
        self._fail(ConnectionAbortedError("the client closed the connection"))
