"""The floor under calls through the ingress: the same path with no work behind it.

A call through the ingress crosses four connections between three processes (the
caller's, the service's, its coordinator's) and waits for one ``fdatasync``: the caller
sends it to the service's ingress, the ingress hands the calls of one turn of its event
loop to the coordinator as one batch, the coordinator writes the batch to its log and
syncs it before handing it back, and the answers go to their callers. This measures that
path with nothing else on it:

- callers: threads of the measuring process, each with its own connection, a blocking
  socket, one call in flight, as :class:`~ambrosia_py.client.Client`'s callers are;
- the ingress: an asyncio ``Protocol`` per connection on the event loop ours run on
  (:mod:`ambrosia_py.eventloop`); the frames read in one turn of the loop, from every
  connection, go to the coordinator in one write at its end; the batch that comes back
  goes to the connections, one write each;
- the coordinator: an asyncio ``Protocol`` that appends what one read brought to a file
  allocated ahead (as our logs are), ``fdatasync``s it, and sends it back.

No secret, no tags, no keys, no handler: what is left is the processes, the sockets, the
event loops and the disk. Ours over this says how much of a call is its own work. Two
checks keep the skeleton honest: every answer must be the call it answers (a counter in
the payload), and the coordinator's file must hold every call relayed.
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

import attrs

from .. import eventloop
from ..allocator import prime_allocator
from .compare_floor import allocate_ahead

__all__ = ["IngressFloor", "hop", "in_threads", "measure_ingress_floor"]

_HEADER = struct.Struct("<I")  # a frame: its length, then its bytes
_ROUTE = struct.Struct("<I")  # in a batch, before each frame: the connection it came on
_LOG = "coordinator.log"
_READ_SIZE = 64 * 1024


@attrs.frozen
class IngressFloor:
    """What :func:`measure_ingress_floor` measured.

    ``calls_per_s``: calls answered per second with ``callers`` threads calling at once;
    ``sequential_p50_s``: the median round trip of one call at a time, in seconds;
    ``records``: the coordinator's syncs while the callers called at once (so ``calls /
    records`` calls shared each ``fdatasync``); ``calls``: how many calls that was.
    """

    callers: int
    calls: int
    calls_per_s: float
    records: int
    sequential_p50_s: float


def measure_ingress_floor(
    directory: Path,
    *,
    callers: int = 16,
    seconds: float = 3.0,
    sequential: int = 1000,
    size: int = 16,
) -> IngressFloor:
    """Start the skeleton's two processes (their file in ``directory``), time
    ``sequential`` calls one at a time (after a tenth as many unmeasured), then
    ``callers`` threads calling for ``seconds``; ``size``-byte calls (at least 8: a
    counter)."""
    if size < 8 or callers < 1 or seconds <= 0 or sequential < 1:
        raise ValueError("size >= 8 (a counter), callers >= 1, seconds > 0, sequential >= 1")
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / _LOG
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        allocate_ahead(fd, 256 * 1024 * 1024)
    finally:
        os.close(fd)
    front, back = _listen(), _listen()
    procs: list[subprocess.Popen[bytes]] = []

    def start(role: str, *args: object, fds: tuple[socket.socket, ...]) -> None:
        argv = [sys.executable, "-c", f"from {__name__} import hop; hop()", role, *map(str, args)]
        procs.append(subprocess.Popen(argv, pass_fds=[s.fileno() for s in fds]))

    watchdog = threading.Timer(120.0 + seconds + 0.05 * sequential, lambda: _kill(procs))
    try:
        start("coordinator", back.fileno(), log, fds=(back,))
        start("ingress", front.fileno(), back.getsockname()[1], fds=(front,))
        watchdog.start()
        address = front.getsockname()
        warm = max(1, sequential // 10)
        with _connect(address) as one:
            times = _calls(one, size, warm + sequential, 0, None)[warm:]
        socks = [_connect(address) for _ in range(callers)]
        counts = [0] * callers
        failures: list[BaseException] = []
        stop = time.perf_counter() + seconds

        def caller(i: int) -> None:
            try:
                counts[i] = len(_calls(socks[i], size, None, (i + 1) << 40, stop))
            except BaseException as exc:
                failures.append(exc)

        took = in_threads(caller, callers)
        for sock in socks:
            sock.close()
        if failures:
            raise RuntimeError(f"the ingress floor's skeleton failed: {failures[0]!r}")
    finally:
        watchdog.cancel()
        front.close()
        back.close()
        _kill(procs)
    calls = sum(counts)
    records = _check_log(log, warm + sequential + calls)
    return IngressFloor(
        callers=callers,
        calls=calls,
        calls_per_s=calls / took,
        records=records - (warm + sequential),  # one each, one call at a time
        sequential_p50_s=statistics.median(times),
    )


def in_threads(target: Callable[[int], None], n: int) -> float:
    """Run ``target(0)`` .. ``target(n - 1)`` in ``n`` threads at once; the seconds from
    starting the first to the end of the last."""
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - began


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(256)
    return s


def _connect(address: tuple[str, int]) -> socket.socket:
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _call(counter: int, size: int) -> bytes:
    return _HEADER.pack(size) + counter.to_bytes(8, "little") + bytes(size - 8)


def _calls(
    sock: socket.socket, size: int, count: int | None, first: int, stop: float | None
) -> list[float]:
    """Calls one after the other (``count`` of them, or until ``stop``), each checked to
    be answered by itself; the round trip of each, in seconds."""
    times = []
    pending = b""
    i = 0
    while (count is None or i < count) and (stop is None or time.perf_counter() < stop):
        call = _call(first + i, size)
        began = time.perf_counter()
        sock.sendall(call)
        while len(pending) < len(call):
            data = sock.recv(_READ_SIZE)
            if not data:
                raise EOFError("the skeleton closed the connection")
            pending += data
        times.append(time.perf_counter() - began)
        if pending[: len(call)] != call:
            raise RuntimeError(f"call {first + i}: the answer is not the call it answers")
        pending = pending[len(call) :]
        i += 1
    return times


def _check_log(path: Path, calls: int) -> int:
    """The records (syncs) the coordinator's file holds, checked to hold ``calls`` calls:
    each record holds batches, each batch a connection's number and a call, per call."""
    data = path.read_bytes()
    at = records = found = 0
    while at + _HEADER.size <= len(data) and (length := _HEADER.unpack_from(data, at)[0]):
        records += 1
        end = at + _HEADER.size + length
        at += _HEADER.size
        while at < end:  # the batches of the record
            batch_end = at + _HEADER.size + _HEADER.unpack_from(data, at)[0]
            at += _HEADER.size
            while at < batch_end:  # the calls of the batch
                at += _ROUTE.size + _HEADER.size + _HEADER.unpack_from(data, at + _ROUTE.size)[0]
                found += 1
    if found != calls:
        raise RuntimeError(f"the coordinator's file holds {found} calls, not the {calls} relayed")
    return records


class _Frames(asyncio.Protocol):
    """Hands the whole frames of each read to ``on_frames(self, frames)``."""

    def __init__(self, on_frames: Callable[[_Frames, list[bytes]], None], route: int = 0) -> None:
        self.on_frames = on_frames
        self.route = route  # which caller's connection it is, in the ingress
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        frames = []
        at = 0
        while len(self.buf) - at >= _HEADER.size:
            end = at + _HEADER.size + _HEADER.unpack_from(self.buf, at)[0]
            if len(self.buf) < end:
                break
            frames.append(bytes(self.buf[at:end]))
            at = end
        del self.buf[:at]
        if frames:
            self.on_frames(self, frames)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


def hop() -> None:
    """A skeleton process: ``ROLE ARGS`` on the command line (see the module)."""
    role, *args = sys.argv[1:]
    prime_allocator()  # as ours: asyncio's reads ask for 256 KiB
    if role == "coordinator":
        eventloop.run(_coordinator(int(args[0]), args[1]))
    else:
        eventloop.run(_ingress(int(args[0]), int(args[1])))


async def _coordinator(listener: int, path: str) -> None:
    """One connection from the ingress: each read's batches written, synced, sent back."""
    log = os.open(path, os.O_WRONLY)
    with socket.socket(fileno=listener) as s:
        conn, _ = s.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def durable(end: _Frames, frames: list[bytes]) -> None:
        data = b"".join(frames)
        os.write(log, _HEADER.pack(len(data)) + data)  # a record: what one sync made durable
        os.fdatasync(log)
        assert end.transport is not None
        end.transport.write(data)

    end = _Frames(durable)
    await asyncio.get_running_loop().connect_accepted_socket(lambda: end, conn)
    await end.closed


async def _ingress(listener: int, coordinator_port: int) -> None:
    """Callers' connections in; each turn's calls to the coordinator as one batch; the
    batch that comes back out to the callers, one write per connection."""
    loop = asyncio.get_running_loop()
    callers: dict[int, _Frames] = {}
    batch: list[bytes] = []

    def send_batch() -> None:
        body = b"".join(batch)
        batch.clear()
        assert coordinator.transport is not None
        coordinator.transport.write(_HEADER.pack(len(body)) + body)

    def from_caller(end: _Frames, frames: list[bytes]) -> None:
        if not batch:
            loop.call_soon(send_batch)
        route = _ROUTE.pack(end.route)
        for frame in frames:
            batch.append(route + frame)

    def from_coordinator(_: _Frames, records: list[bytes]) -> None:
        out: dict[int, list[bytes]] = {}
        for record in records:
            at = _HEADER.size
            while at < len(record):
                (route,) = _ROUTE.unpack_from(record, at)
                end = at + _ROUTE.size + _HEADER.size + _HEADER.unpack_from(record, at + 4)[0]
                out.setdefault(route, []).append(record[at + _ROUTE.size : end])
                at = end
        for route, frames in out.items():
            transport = callers[route].transport
            assert transport is not None
            transport.write(b"".join(frames))

    def accepted() -> _Frames:
        end = _Frames(from_caller, len(callers))
        callers[end.route] = end
        return end

    coordinator = _Frames(from_coordinator)
    await loop.create_connection(lambda: coordinator, "127.0.0.1", coordinator_port)
    server = await loop.create_server(accepted, sock=socket.socket(fileno=listener))
    async with server:
        await coordinator.closed
