"""The worker's TCP edges: the asyncio side, outside the determinism boundary.

:class:`WorkerTransport` accepts connectors. Each connection is named
``<incarnation>.<n>``, so no name outlives its incarnation, and reported to the immortal
as impulses in the order things happen: ``opened``, then the whole frames each read
brought (one impulse per read, with the wall-clock arrival time), then ``closed``. The
coordinator logs each impulse before a handler sees it. Replies come back as effects of
this incarnation: :meth:`WorkerTransport.write` writes all replies to one read with one
call, and closes the connection when the worker decided to (after an ERROR, a RESTART,
a MIGRATION_ACK).

Splitting is all the edge does to the bytes: it reads length prefixes (the codec's
width and byte order, seed 000 *Wire Format*) and hands on each frame's tag and body.
Decoding, and so every judgement of a frame, happens in the worker core, in logged
order. A length over the limit is refused here, before its body is buffered (seed 000,
B1), as a ``too_large`` impulse: the core answers ERROR and closes, in logged order too.
(:class:`~.framing.FrameReader` decodes as it hands frames out, which would decode each
frame twice.)

Back-pressure: a connector may send at most its credits between two writes of the
worker, and a worker's credits never exceed ``max_credits`` (the core's ledger). A
connection that has sent more frames than that since the worker last wrote to it stops
being read until the worker writes (the ERROR for its missing credits, or a refill), so
a connector ignoring credits cannot fill the log.

:class:`ControlServer` is the operators' port (``--control``): JSON lines, checked
against the cookie, turned into impulses (``nack``, ``move``) or answered from the
state (``status``); :mod:`immortals.wallaroo.worker_ctl` is its client.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import time
from collections.abc import Callable
from typing import Any, Literal, Protocol

from .codec import DIALECTS, LENGTH_PREFIX_BYTES, Dialect

__all__ = ["ControlServer", "Sink", "WorkerTransport", "parse_host_port", "split_frames"]

log = logging.getLogger("immortals.wallaroo.transport")
_READ_SIZE = 256 * 1024
_ANSWER_SECONDS = 30.0  # how long a refused connection waits for the worker's ERROR


def parse_host_port(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as a pair; a clear ValueError otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def split_frames(
    buf: bytearray, byte_order: Literal["little", "big"], limit: int
) -> tuple[list[bytes], int, tuple[int, int] | None]:
    """The whole frames at the start of ``buf`` (tag and body each), the bytes they take,
    and ``(offset in buf, length)`` of a length prefix over ``limit``, if one came."""
    frames: list[bytes] = []
    at, end, prefix = 0, len(buf), LENGTH_PREFIX_BYTES
    view = memoryview(buf)
    try:
        while end - at >= prefix:
            size = int.from_bytes(view[at : at + prefix], byte_order)
            if size > limit:
                return frames, at, (at, size)
            if end - at - prefix < size:
                break
            frames.append(bytes(view[at + prefix : at + prefix + size]))
            at += prefix + size
    finally:
        view.release()
    return frames, at, None


class Sink(Protocol):
    """Where the transport reports: the worker's impulses."""

    def opened(self, conn: str, peer: str) -> None: ...
    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None: ...
    def too_large(self, conn: str, offset: int, size: int) -> None: ...
    def closed(self, conn: str) -> None: ...


class _Conn:
    __slots__ = ("unanswered", "writer", "wrote")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.unanswered = 0  # frames delivered since the worker last wrote here
        self.wrote = asyncio.Event()


class WorkerTransport:
    """Accepts connectors and reports their frames to ``sink`` (see the module)."""

    def __init__(
        self, sink: Sink, incarnation: str, dialect: Dialect, max_frame_bytes: int, credits: int
    ) -> None:
        self._sink = sink
        self._incarnation = incarnation
        self._order = DIALECTS[dialect].byte_order
        self._limit = max_frame_bytes
        self._window = credits + 2  # a HELLO or an ERROR beyond the credits
        self._numbers = itertools.count(1)
        self._conns: dict[str, _Conn] = {}
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        conn = f"{self._incarnation}.{next(self._numbers)}"
        me = self._conns[conn] = _Conn(writer)
        sink = self._sink
        buf = bytearray()
        offset = 0  # stream offset of buf[0]
        sink.opened(conn, peer)
        try:
            while True:
                if me.unanswered > self._window:  # more than its credits: wait for us
                    me.wrote.clear()
                    await me.wrote.wait()
                    continue
                data = await reader.read(_READ_SIZE)
                if not data or conn not in self._conns:
                    break
                buf += data
                frames, used, oversize = split_frames(buf, self._order, self._limit)
                if frames:
                    me.unanswered += len(frames)
                    sink.frames(conn, int(time.time() * 1000), frames)
                if oversize is not None:
                    me.wrote.clear()
                    sink.too_large(conn, offset + oversize[0], oversize[1])
                    # The worker answers ERROR and closes; read no more meanwhile.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(me.wrote.wait(), _ANSWER_SECONDS)
                    break
                del buf[:used]
                offset += used
        except ConnectionError as exc:
            log.info("connection %s (%s) lost: %s", conn, peer, exc)
        finally:
            if self._conns.pop(conn, None) is not None:
                sink.closed(conn)
            writer.close()

    def write(self, conn: str, wire: bytes, close: bool) -> None:
        """Write a connection's replies (an effect), then close it if the worker said so.

        A connection that has gone takes nothing: its connector reconnects.
        """
        me = self._conns.get(conn)
        if me is None:
            if wire:
                log.info("replies to %s dropped: the connection has gone", conn)
            return
        if wire:
            me.writer.write(wire)
        me.unanswered = 0
        me.wrote.set()
        if close:
            del self._conns[conn]  # the worker has forgotten it already: no closed impulse
            me.writer.close()

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for me in list(self._conns.values()):
            me.writer.close()
        self._conns.clear()


class ControlServer:
    """The operators' port: one JSON object per line in, one per line out.

    Requests: ``{"cookie": C, "op": "status"}``, ``{"cookie": C, "op": "nack", "stream":
    NAME_OR_ID, "point": N_OR_NULL}``, ``{"cookie": C, "op": "move", "target":
    "HOST:PORT"}``. ``status`` is answered at once from the state; the others become
    impulses, answered by ``answer`` (an effect) once handled.
    """

    def __init__(
        self,
        cookie: str,
        status: Callable[[], dict[str, Any]],
        command: Callable[[int, dict[str, Any]], None],
    ) -> None:
        self._cookie = cookie.encode()
        self._status = status
        self._command = command
        self._requests = itertools.count(1)
        self._waiting: dict[int, asyncio.StreamWriter] = {}
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._serve, host, port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                self._one(line, writer)
                await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError) as exc:
            log.info("control connection ended: %s", exc)
        finally:
            writer.close()

    def _one(self, line: bytes, writer: asyncio.StreamWriter) -> None:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            return _reply(writer, {"ok": False, "error": f"not a JSON request: {exc}"})
        given = str(request.get("cookie", "")).encode()
        if not hmac.compare_digest(given, self._cookie):
            return _reply(writer, {"ok": False, "error": "Bad cookie"})
        op = request.get("op")
        if op == "status":
            return _reply(writer, {"ok": True, "status": self._status()})
        if op not in ("nack", "move"):
            return _reply(writer, {"ok": False, "error": f"unknown op {op!r}"})
        number = next(self._requests)
        self._waiting[number] = writer
        try:
            self._command(number, request)
        except (TypeError, ValueError) as exc:  # a field of the wrong kind
            self._waiting.pop(number, None)
            return _reply(writer, {"ok": False, "error": f"bad {op} request: {exc}"})
        return None

    def answer(self, request: int, reply: dict[str, Any]) -> None:
        """Answer a command once the worker handled it (an effect)."""
        writer = self._waiting.pop(request, None)
        if writer is not None and not writer.is_closing():
            _reply(writer, reply)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()


def _reply(writer: asyncio.StreamWriter, reply: dict[str, Any]) -> None:
    writer.write(json.dumps(reply, default=repr).encode() + b"\n")
