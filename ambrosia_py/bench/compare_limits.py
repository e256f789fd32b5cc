"""The machine's limits for ``bench compare``: the disk and raw asyncio loopback.

Every durable figure is bounded by how often the data dir's disk can ``fdatasync`` and
how fast it writes sequentially with ``fdatasync``; every figure between two processes
is bounded by what plain asyncio moves over 127.0.0.1. Measuring both in the same run as
the peers and ours turns "fast" into a share of what this machine can do right now (its
disk and CPU swing by 2-4x from minute to minute, so a limit taken at another time says
little).

Loopback: a server process (:func:`serve`)
counts length-prefixed messages on an asyncio ``Protocol``; the client writes one frame
per message through a ``StreamWriter`` (as a binding or a gRPC stream would: one send
per message, the transport coalesces) and then a zero-length frame, and the server
answers with how many it counted. Two processes, like gRPC's and ours.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

from .. import eventloop
from .coordinator import measure_bandwidth, measure_fsync_rate, measure_prealloc_fsync_rate

__all__ = [
    "ServerProcess",
    "loopback_server",
    "measure_disk_limits",
    "measure_loopback",
    "serve",
    "wait_for_port",
]

_HEADER = struct.Struct(">I")
_DONE = _HEADER.pack(0)
# Messages between two awaits of drain() (flow control), for small messages: awaiting per
# message would cost more than the send. Large ones drain each time: a long queue of them
# in the transport's buffer is copied around and is several times slower at 64 KiB.
DRAIN_EVERY = 256
DRAIN_EACH_FROM = 4096


def measure_disk_limits(directory: Path, seconds: float) -> dict[str, float]:
    """``fdatasync``ed 4 KiB appends per second, ``fdatasync``ed 256 B writes per second
    into preallocated space (what a coordinator's log does for a small record) and MB/s
    of 4 MiB writes each ``fdatasync``ed, in ``directory``'s filesystem (the probes of
    ``bench coordinator``)."""
    directory.mkdir(parents=True, exist_ok=True)
    return {
        "fdatasync_writes_per_s": measure_fsync_rate(directory, seconds),
        "fdatasync_small_prealloc_writes_per_s": measure_prealloc_fsync_rate(directory, seconds),
        "fdatasync_seq_write_mb_per_s": measure_bandwidth(directory, seconds),
    }


class _Counter(asyncio.Protocol):
    """Counts frames until the zero-length one, then answers the count (8 bytes)."""

    def __init__(self) -> None:
        self.buf = bytearray()
        self.count = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's: no isinstance

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        at = 0
        while len(buf) - at >= 4:
            (n,) = _HEADER.unpack_from(buf, at)
            if n == 0:
                assert self.transport is not None
                self.transport.write(self.count.to_bytes(8, "big"))
                self.count = 0
                at += 4
                continue
            if len(buf) - at < 4 + n:
                break
            self.count += 1
            at += 4 + n
        del buf[:at]


def serve(port_file: str) -> None:
    """The server process: listen on a free port, write it to ``port_file``, count."""
    eventloop.run(_serve(Path(port_file)))


async def _serve(port_file: Path) -> None:
    server = await asyncio.get_running_loop().create_server(_Counter, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    port_file.write_text(str(port))
    async with server:
        await server.serve_forever()


def wait_for_port(proc: subprocess.Popen[bytes], port_file: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        text = port_file.read_text() if port_file.exists() else ""
        if text.strip():
            return int(text)
        if proc.poll() is not None:
            raise RuntimeError(f"the loopback server exited ({proc.returncode})")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the loopback server did not write {port_file} in {timeout:g} s")
        time.sleep(0.01)  # polling for its port, bounded by the deadline


class ServerProcess:
    """A server in its own process, ``serve(PORT_FILE)`` of ``module``, where it writes the
    port it listens on (``with ServerProcess(...).running() as port:``)."""

    def __init__(self, module: str, port_file: Path, timeout: float) -> None:
        # Not ``-m`` the module: runpy warns when the package has imported it already.
        self._code = f"import sys; from {module} import serve; serve(sys.argv[1])"
        self.port_file = port_file
        self.timeout = timeout

    @contextlib.contextmanager
    def running(self) -> Iterator[int]:
        self.port_file.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", self._code, str(self.port_file)], stdin=subprocess.DEVNULL
        )
        try:
            yield wait_for_port(proc, self.port_file, self.timeout)
        finally:
            proc.kill()
            proc.wait()


def loopback_server(directory: Path) -> ServerProcess:
    """The counting server (:func:`serve`) in its own process."""
    return ServerProcess(__name__, directory / "loopback.port", 30.0)


async def _send(port: int, size: int, count: int) -> float:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    frame = _HEADER.pack(size) + b"x" * size
    every = 1 if size >= DRAIN_EACH_FROM else DRAIN_EVERY
    try:
        start = time.perf_counter()
        for i in range(count):
            writer.write(frame)
            if i % every == 0:
                await writer.drain()
        writer.write(_DONE)
        got = int.from_bytes(await reader.readexactly(8), "big")
        elapsed = time.perf_counter() - start
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    if got != count:
        raise RuntimeError(f"loopback server counted {got} messages of {size} B, sent {count}")
    return count / elapsed


def measure_loopback(port: int, size: int, count: int) -> float:
    """Messages per second of ``size`` bytes from this process to the server's."""
    return eventloop.run(_send(port, size, count))
