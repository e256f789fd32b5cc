"""The floor under an awaited round trip, for ``bench compare``: its path with no work.

An awaited call between two instances crosses six connections between four processes
(the caller's binding, its coordinator, the callee's coordinator, the callee's binding,
and back) and waits for two ``fdatasync``s: the callee's coordinator makes the call
durable before its binding sees it, and the caller's makes the reply durable before
its binding sees that. This measures that path with nothing else on it: four processes
relay length-prefixed frames over 127.0.0.1, and the two coordinators append each frame
that comes from the link to a file in the data dir and ``fdatasync`` it before passing
it on. The files are preallocated, as our logs are (:mod:`ambrosia_py.wire.logfile`):
each sync overwrites space the file has. Two ways:

- **asyncio**: each process an asyncio ``Protocol`` on the event loop ours run on
  (:mod:`ambrosia_py.eventloop`: uvloop where it is installed);
- **blocking**: blocking reads and writes in a fixed order, no event loop: what the
  kernel, the disk and the scheduler cost on this machine with no runtime at all.

Ours over these says how much of its round trip is its own work. Two checks keep the
skeleton honest: every reply must be the call it answers (a counter in the payload),
and each coordinator's file must hold every frame it relayed from the link.

The caller's binding is the measuring process; the others run ``python -c`` with
:func:`hop`, given the listening sockets they accept on (made here first, so nothing
waits for a port).
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
from functools import partial
from pathlib import Path
from typing import Literal, cast

from .. import eventloop
from ..allocator import prime_allocator

__all__ = ["MODES", "Mode", "allocate_ahead", "hop", "measure_await_floor"]

Mode = Literal["asyncio", "blocking"]
MODES: tuple[Mode, ...] = ("asyncio", "blocking")
_HEADER = struct.Struct(">I")
_LOGS = ("coordinator-a.log", "coordinator-b.log")


def _listen() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


def measure_await_floor(directory: Path, mode: Mode, size: int, count: int) -> float:
    """p50 seconds of ``count`` round trips of ``size``-byte calls (at least 8 bytes: a
    counter) through the skeleton, after ``count // 10 + 1`` unmeasured ones. The two
    coordinators' files stay in ``directory``."""
    if size < 8:
        raise ValueError(f"size {size}: the payload carries an 8-byte counter")
    directory.mkdir(parents=True, exist_ok=True)
    warm = count // 10 + 1
    frame = _HEADER.size + size
    for name in _LOGS:
        _preallocate(directory / name, (warm + count) * frame)
    to_a, to_b, link = _listen(), _listen(), _listen()
    procs: list[subprocess.Popen[bytes]] = []

    def start(role: str, *args: str | int | Path, fds: tuple[socket.socket, ...] = ()) -> None:
        code = f"from {__name__} import hop; hop()"
        argv = [sys.executable, "-c", code, mode, role, *map(str, args)]
        procs.append(subprocess.Popen(argv, pass_fds=[s.fileno() for s in fds]))

    def stop() -> None:
        for proc in procs:
            proc.kill()

    # A skeleton that stops answering is killed: the caller's read then ends, and raises.
    deadline = 60.0 + 0.05 * (warm + count)
    watchdog = threading.Timer(deadline, stop)
    try:
        start("coordinator-b", to_b.fileno(), link.fileno(), directory / _LOGS[1], fds=(to_b, link))
        start("binding-b", to_b.getsockname()[1])
        start(
            "coordinator-a", to_a.fileno(), link.getsockname()[1], directory / _LOGS[0], fds=(to_a,)
        )
        caller = socket.create_connection(to_a.getsockname())
        caller.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        run = _call_blocking if mode == "blocking" else _call_asyncio
        prime_allocator()
        watchdog.start()
        try:
            times = run(caller, size, warm + count)[warm:]
        except (EOFError, asyncio.IncompleteReadError, ConnectionError) as exc:
            raise RuntimeError(f"the await floor's skeleton stopped answering ({exc})") from None
    finally:
        watchdog.cancel()
        for s in (to_a, to_b, link):
            s.close()
        stop()
        for proc in procs:
            proc.wait()
    relayed = b"".join(_call(i, size) for i in range(warm + count))
    for name in _LOGS:
        if (directory / name).read_bytes() != relayed:
            raise RuntimeError(f"{name} does not hold the {warm + count} frames relayed")
    return statistics.median(times)


def allocate_ahead(fd: int, size: int) -> None:
    """Allocate the first ``size`` bytes of ``fd``'s file where the platform can
    (``posix_fallocate``: writes there then change no file size, as in a coordinator's
    log), and make that durable."""
    if hasattr(os, "posix_fallocate"):
        os.posix_fallocate(fd, 0, size)
    os.fsync(fd)


def _preallocate(path: Path, size: int) -> None:
    """Create ``path`` with ``size`` bytes allocated ahead (:func:`allocate_ahead`)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        allocate_ahead(fd, size)
    finally:
        os.close(fd)


def _call(i: int, size: int) -> bytes:
    return _HEADER.pack(size) + i.to_bytes(8, "big") + bytes(size - 8)


def _call_blocking(sock: socket.socket, size: int, n: int) -> list[float]:
    times = []
    with sock:
        for i in range(n):
            call = _call(i, size)
            start = time.perf_counter()
            sock.sendall(call)
            reply = _read_frame(sock)
            times.append(time.perf_counter() - start)
            if reply != call:
                raise RuntimeError(f"round trip {i}: the reply is not the call it answers")
    return times


def _call_asyncio(sock: socket.socket, size: int, n: int) -> list[float]:
    async def calls() -> list[float]:
        reader, writer = await asyncio.open_connection(sock=sock)
        times = []
        try:
            for i in range(n):
                call = _call(i, size)
                start = time.perf_counter()
                writer.write(call)
                reply = await reader.readexactly(len(call))
                times.append(time.perf_counter() - start)
                if reply != call:
                    raise RuntimeError(f"round trip {i}: the reply is not the call it answers")
        finally:
            writer.close()
        return times

    return eventloop.run(calls())


def _read_frame(sock: socket.socket) -> bytes:
    head = _read_exactly(sock, _HEADER.size)
    return head + _read_exactly(sock, _HEADER.unpack(head)[0])


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the connection closed")
        buf += chunk
    return bytes(buf)


def _durable(fd: int, frame: bytes) -> None:
    os.write(fd, frame)
    os.fdatasync(fd)


def hop() -> None:
    """A skeleton process: ``MODE ROLE ARGS`` on the command line (see the module)."""
    mode, role, *args = sys.argv[1:]
    prime_allocator()  # as ours: asyncio's reads ask for 256 KiB
    # Written from its start, over the space allocated ahead (_preallocate).
    log = os.open(args[-1], os.O_WRONLY) if len(args) == 3 else -1
    if mode == "blocking":
        _hop_blocking(role, args, log)
    else:
        eventloop.run(_hop_asyncio(role, args, log))


def _accept(fd: str) -> socket.socket:
    with socket.socket(fileno=int(fd)) as listener:
        conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _connect(port: str) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", int(port)))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def _hop_blocking(role: str, args: list[str], log: int) -> None:
    try:
        if role == "binding-b":
            coordinator = _connect(args[0])
            while True:
                coordinator.sendall(_read_frame(coordinator))
        elif role == "coordinator-b":
            binding, link = _accept(args[0]), _accept(args[1])
            while True:
                call = _read_frame(link)
                _durable(log, call)
                binding.sendall(call)
                link.sendall(_read_frame(binding))
        else:  # coordinator-a
            link = _connect(args[1])
            binding = _accept(args[0])
            while True:
                link.sendall(_read_frame(binding))
                reply = _read_frame(link)
                _durable(log, reply)
                binding.sendall(reply)
    except (EOFError, ConnectionError):
        return  # the measuring process is done


class _Frames(asyncio.Protocol):
    """Hands each whole frame it reads to ``on_frame(self, frame)``; what it is given to
    send before its connection is made is sent then."""

    def __init__(self, on_frame: Callable[[_Frames, bytes], None]) -> None:
        self.on_frame = on_frame
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.early: list[bytes] = []
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's too
        transport.writelines(self.early)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while len(self.buf) >= _HEADER.size:
            end = _HEADER.size + _HEADER.unpack_from(self.buf)[0]
            if len(self.buf) < end:
                return
            frame = bytes(self.buf[:end])
            del self.buf[:end]
            self.on_frame(self, frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    def send(self, frame: bytes) -> None:
        if self.transport is None:
            self.early.append(frame)
        else:
            self.transport.write(frame)


def _same(end: _Frames) -> _Frames:
    return end


async def _hop_asyncio(role: str, args: list[str], log: int) -> None:
    loop = asyncio.get_running_loop()
    if role == "binding-b":
        echo = _Frames(lambda me, frame: me.send(frame))
        await loop.create_connection(lambda: echo, sock=_connect(args[0]))
        await echo.closed
        return

    # A coordinator: frames from the link are made durable, then passed to the binding;
    # frames from the binding go out on the link as they are.
    def from_link(_: _Frames, frame: bytes) -> None:
        _durable(log, frame)
        binding.send(frame)

    binding = _Frames(lambda _, frame: link.send(frame))
    link = _Frames(from_link)
    if role == "coordinator-b":
        socks = _accept(args[0]), _accept(args[1])
    else:
        socks = _accept(args[0]), _connect(args[1])
    for end, sock in zip((binding, link), socks, strict=True):
        await loop.create_connection(partial(_same, end), sock=sock)
    await binding.closed
