"""The worker's operators' port (``--control``): JSON lines, checked against the cookie.

One JSON object per line in, one per line out. Requests: ``{"cookie": C, "op":
"status"}``, ``{"cookie": C, "op": "nack", "stream": NAME_OR_ID, "point": N_OR_NULL}``,
``{"cookie": C, "op": "move", "target": "HOST:PORT", "instance": NAME}``. ``status`` is
answered at once from the state; the others become impulses, answered by
:meth:`ControlServer.answer` (an effect) once handled.
:mod:`immortals.wallaroo.worker_client` is its client.

Like the connectors' port (:mod:`.worker_transport`), it bounds what a peer can make the
worker hold (:data:`CONTROL_LIMITS`, one place for the defaults): a line is at most
``max_pre_handshake_frame`` bytes (a longer one is answered with an error and closed);
at most ``max_connections`` at once, a newcomer evicting the oldest connection that has
not yet sent a request with the right cookie (*pending*), at most
``max_pending_per_source`` of those per address; a pending connection has
``handshake_timeout_s`` from its accept to send that request, and one that has
``idle_timeout_s`` between an answer and its next request line. A client that leaves
more than ``max_buffered_output`` of answers unread is not read until it takes them, and
closed if it stays over for ``output_stall_s``. Nothing here is logged in the service's
record but the commands themselves (``nack``, ``move``), which need the cookie.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import json
import logging
from collections.abc import Callable
from typing import Any, Final

from ambrosia_py.serving import (
    Admission,
    ConnectionLimits,
    OutputStalled,
    RefusalLog,
    limit_output,
    source_of,
    wait_for_room,
)

from .errors import WallarooError

__all__ = ["CONTROL_LIMITS", "ControlRequestError", "ControlServer", "parse_request"]

log = logging.getLogger("immortals.wallaroo.worker_control")
_CLOSED: Final = "operators' connection closed"

CONTROL_LIMITS: Final = ConnectionLimits(
    max_connections=16,
    max_pending_per_source=8,
    handshake_timeout_s=10.0,
    max_pre_handshake_frame=64 * 1024,  # a request line (a stream name is at most 64 KiB)
    idle_timeout_s=300.0,
    max_buffered_output=4 * 1024 * 1024,
    output_stall_s=30.0,
)
"""The operators' port's limits by default (the worker's ``control_*`` options)."""


class ControlRequestError(WallarooError, ValueError):
    """A request line that is not one JSON object (or is too long, or nested too deep)."""


# The kinds of the fields a request may carry, checked before anything reads them.
_FIELDS: Final[dict[str, type | tuple[type, ...]]] = {
    "cookie": str,
    "op": str,
    "target": str,
    "stream": (str, int),
    "point": int,
}
_KIND: Final = {
    "cookie": "a string",
    "op": "a string",
    "target": "a string",
    "stream": "a string or an integer",
    "point": "an integer or null",
}


def parse_request(
    line: bytes, max_line: int = CONTROL_LIMITS.max_pre_handshake_frame
) -> dict[str, Any]:
    """One request line as a JSON object whose known fields have their kinds (``cookie``,
    ``op`` and ``target`` strings, ``stream`` a string or an integer, ``point`` an
    integer or null); :class:`ControlRequestError` saying why not."""
    if len(line) > max_line:
        raise ControlRequestError(f"a request line of {len(line)} bytes is over {max_line}")
    try:
        request = json.loads(line)
    except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deep
        raise ControlRequestError(f"not a JSON request: {exc}") from None
    if not isinstance(request, dict):
        raise ControlRequestError("a request is a JSON object")
    for name, kinds in _FIELDS.items():
        value = request.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            op = request.get("op")
            what = f"bad {op} request" if op in ("nack", "move") else "bad request"
            kind = type(value).__name__
            raise ControlRequestError(f"{what}: {name} is {kind}, not {_KIND[name]}")
    return request


class ControlServer:
    """The operators' port (see the module)."""

    def __init__(
        self,
        cookie: str,
        status: Callable[[], dict[str, Any]],
        command: Callable[[int, dict[str, Any]], None],
        limits: ConnectionLimits = CONTROL_LIMITS,
    ) -> None:
        self._cookie = cookie.encode()
        self._status = status
        self._command = command
        self._limits = limits
        self._requests = itertools.count(1)
        self._waiting: dict[int, asyncio.StreamWriter] = {}
        self._admission = Admission(limits)
        self._refusals = RefusalLog(log, "operators' connections refused or closed")
        self.server: asyncio.Server | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self.server is not None
        host, port = self.server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def start(self, host: str, port: int) -> None:
        # The reader's limit bounds a line: past it readline raises, holding no more.
        self.server = await asyncio.start_server(
            self._serve, host, port, limit=self._limits.max_pre_handshake_frame
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        peer = f"{peername[0]}:{peername[1]}" if peername else "?"
        source = source_of(peername) if peername else "?"
        limits = self._limits

        def evicted(why: str) -> None:
            self._refusals(source, "%s from %s: %s", _CLOSED, peer, why)
            writer.close()

        slot = self._admission.admit(source, evicted)
        if slot is None:
            most = limits.max_connections
            self._refusals(source, "operators' connection from %s refused: %d open", peer, most)
            writer.close()
            return
        limit_output(writer, limits)
        loop = asyncio.get_running_loop()
        deadline: float | None = loop.time() + limits.handshake_timeout_s  # from the accept
        try:
            while True:
                try:
                    async with asyncio.timeout_at(deadline):
                        line = await reader.readline()
                except ValueError:  # over the reader's limit: it dropped what it held
                    most = limits.max_pre_handshake_frame
                    _reply(
                        writer, {"ok": False, "error": f"a request line is at most {most} bytes"}
                    )
                    self._refusals(source, "%s from %s: a line over %d bytes", _CLOSED, peer, most)
                    break
                if not line:
                    break
                if self._one(line, writer):
                    self._admission.establish(slot)
                await wait_for_room(writer, limits)
                if slot.established:  # from now on each request has the idle limit
                    idle = limits.idle_timeout_s
                    deadline = loop.time() + idle if idle else None
        except OutputStalled as exc:
            self._refusals(source, "%s from %s: %s", _CLOSED, peer, exc)
        except TimeoutError:
            self._refusals(source, "%s from %s: no request line in time", _CLOSED, peer)
        except ConnectionError as exc:
            log.info("operators' connection from %s ended: %s", peer, exc)
        finally:
            self._admission.release(slot)
            writer.close()

    def _one(self, line: bytes, writer: asyncio.StreamWriter) -> bool:
        """Answer or pass on one request; whether it carried the right cookie."""
        try:
            request = parse_request(line, self._limits.max_pre_handshake_frame)
        except ControlRequestError as exc:
            _reply(writer, {"ok": False, "error": str(exc)})
            return False
        given = (request.get("cookie") or "").encode()
        if not hmac.compare_digest(given, self._cookie):
            _reply(writer, {"ok": False, "error": "Bad cookie"})
            return False
        op = request.get("op")
        if op == "status":
            _reply(writer, {"ok": True, "status": self._status()})
            return True
        if op not in ("nack", "move"):
            _reply(writer, {"ok": False, "error": f"unknown op {op!r}"})
            return True
        number = next(self._requests)
        self._waiting[number] = writer
        try:
            self._command(number, request)
        except (TypeError, ValueError) as exc:  # a field of the wrong kind
            self._waiting.pop(number, None)
            _reply(writer, {"ok": False, "error": f"bad {op} request: {exc}"})
        return True

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
