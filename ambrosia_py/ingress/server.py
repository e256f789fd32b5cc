"""The ingress's asyncio edge: clients in, impulses to the immortal, answers out.

A thin adapter around :class:`~ambrosia_py.ingress.connection.ServerConnection`. The
socket is bound when ``ambrosia-py run`` starts (a port in use is one line before
anything else starts); connections are accepted only once the immortal is primary
(:meth:`IngressServer.attach`), so a client that connects during recovery just waits.

A call goes one of three ways, decided on the event loop between two records:

- its key's call finished: the stored outcome is sent at once. It was computed from
  logged input (the coordinator hands the binding only durable records), so this
  answer is as durable as one sent by an effect, and nothing is logged again;
- its key's call is running, or this incarnation already sent it to the log: the client
  waits for the outcome, which answers everyone waiting on the key;
- else it becomes an impulse (``envelope.py``: key, method, arguments, arrival time),
  logged by the coordinator before the dispatcher runs it; its outcome goes into the
  key table and comes back here as an effect (:meth:`IngressServer.answer`), which runs
  only once the record is durable and never during replay.

Waiting clients belong to this incarnation: after a crash they reconnect and send the
same key again. A connection may have ``max_in_flight`` calls waiting; past that it is
not read until answers go out.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING

import attrs

from ..binding.errors import BindingError
from .connection import ConnectionState, ServerConnection
from .envelope import RetentionEnvelope, encode_call_envelope, encode_retention_envelope
from .errors import IngressProtocolError
from .frames import DEFAULT_MAX_CALL_FRAME, Call, Outcome, Refusal, RefusalReason, ServiceInfo
from .keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS, describe_key

if TYPE_CHECKING:
    from ..binding.dispatcher import Dispatcher

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_HOST",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_IN_FLIGHT",
    "IngressServer",
    "IngressSettings",
    "parse_address",
]

log = logging.getLogger("ambrosia_py.ingress")

DEFAULT_HOST = "127.0.0.1"  # loopback unless told otherwise
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_MAX_IN_FLIGHT = 1024  # calls waiting per connection before it is not read
_PRE_AUTH_READ = 4096  # what one read takes before the client proved the secret
_READ_SIZE = 256 * 1024


def parse_address(text: str, default_host: str = DEFAULT_HOST) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (then on ``default_host``)."""
    host, colon, port = text.rpartition(":")
    if not colon:
        host, port = "", text
    host = host.strip("[]") or default_host
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT or PORT (a port is 0 to 65535)")
    return host, int(port)


@attrs.frozen
class IngressSettings:
    """Where the ingress listens, how long keys are kept, and its limits.

    ``keep_count`` and ``keep_seconds`` (0: no limit of that kind) are the key table's
    retention; they change what handlers do, so they reach it as a logged impulse.
    """

    host: str = DEFAULT_HOST
    port: int = 0
    keep_count: int = DEFAULT_KEEP_COUNT
    keep_seconds: float = DEFAULT_KEEP_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_call_frame: int = DEFAULT_MAX_CALL_FRAME

    @property
    def retention(self) -> RetentionEnvelope:
        return RetentionEnvelope(self.keep_count, int(self.keep_seconds * 1000))


class _Client:
    """One authenticated (or authenticating) connection."""

    def __init__(self, conn: ServerConnection, writer: asyncio.StreamWriter, peer: str) -> None:
        self.conn = conn
        self.writer = writer
        self.peer = peer
        self.waiting: set[tuple[bytes, int, int]] = set()  # (key, method id, request id)
        self.room = asyncio.Event()
        self.room.set()
        self.closed = False
        self._flush_scheduled = False

    def send(self, request_id: int, answer: Outcome | Refusal) -> None:
        """Queue an answer; everything queued in one loop step goes in one write."""
        if self.closed:
            return
        self.conn.reply(request_id, answer)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self.closed:
            self.writer.write(self.conn.data_to_send())


class IngressServer:
    """The ingress of one immortal: :meth:`bind`, then :meth:`attach` once primary."""

    def __init__(
        self, secret: bytes, settings: IngressSettings, tls: ssl.SSLContext | None = None
    ) -> None:
        self._secret = secret
        self.settings = settings
        self.tls = tls  # the links' server context (run --tls-cert): calls in TLS too
        self._server: asyncio.Server | None = None
        self._dispatcher: Dispatcher | None = None
        self._info: ServiceInfo | None = None
        self._clients: set[_Client] = set()
        # (key, method id) -> the connections and request ids waiting for its outcome
        self._waiting: dict[tuple[bytes, int], list[tuple[_Client, int]]] = {}
        self._starting: asyncio.Future[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the ingress is not bound")
        host, port = self._server.sockets[0].getsockname()[:2]
        return str(host), int(port)

    async def bind(self) -> tuple[str, int]:
        """Listen on the configured address; accept nothing until :meth:`attach`."""
        self._server = await asyncio.start_server(
            self._serve,
            self.settings.host,
            self.settings.port,
            ssl=self.tls,
            ssl_handshake_timeout=self.settings.handshake_timeout_s if self.tls else None,
            start_serving=False,
        )
        return self.address

    def attach(self, dispatcher: Dispatcher) -> None:
        """Start serving calls to ``dispatcher``'s immortal (it must be primary)."""
        if self._server is None:
            raise RuntimeError("bind the ingress before attaching it")
        self._dispatcher = dispatcher
        self._info = ServiceInfo(
            dispatcher.instance, type(dispatcher.immortal).__name__, self.settings.max_call_frame
        )
        dispatcher.ingress_answer = self.answer
        wanted = self.settings.retention
        if dispatcher.keys.retention != wanted:  # logged before any call of this incarnation
            dispatcher.ingress_impulse(encode_retention_envelope(wanted))
        self._starting = asyncio.ensure_future(self._server.start_serving())

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.ingress_answer = None
        if self._server is not None:
            self._server.close()
        for client in list(self._clients):
            client.closed = True
            client.writer.close()

    # -- the effect ----------------------------------------------------------------------

    def answer(self, key: bytes, method_id: int, answer: Outcome | Refusal) -> None:
        """Answer everyone waiting on ``key`` (an effect of the record that decided it)."""
        for client, request_id in self._waiting.pop((key, method_id), ()):
            client.waiting.discard((key, method_id, request_id))
            client.send(request_id, answer)
            if len(client.waiting) < self.settings.max_in_flight:
                client.room.set()

    # -- connections ---------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = _peer(writer)
        if len(self._clients) >= self.settings.max_connections:
            log.warning(
                "refusing an ingress connection from %s: %d open already (the limit)",
                peer,
                len(self._clients),
            )
            writer.close()
            return
        assert self._info is not None
        client = _Client(ServerConnection(self._secret, self._info), writer, peer)
        self._clients.add(client)
        try:
            writer.write(client.conn.data_to_send())  # HELLO
            calls = await self._authenticate(client, reader)
            if calls is None:
                return
            self._calls(client, calls)
            while True:
                if len(client.waiting) >= self.settings.max_in_flight:
                    client.room.clear()
                    await client.room.wait()
                await writer.drain()  # a client that reads no answers is not read either
                data = await reader.read(_READ_SIZE)
                if not data:
                    return
                self._calls(client, client.conn.receive_data(data))
        except IngressProtocolError as exc:
            log.warning("closing the ingress connection from %s: %s", peer, exc)
        except BindingError as exc:  # the binding is stopping: no more impulses
            log.info("closing the ingress connection from %s: %s", peer, exc)
        except (ConnectionError, OSError) as exc:
            log.info("ingress connection from %s lost: %s", peer, exc)
        finally:
            self._forget(client)
            writer.close()

    async def _authenticate(
        self, client: _Client, reader: asyncio.StreamReader
    ) -> list[Call] | None:
        """Read until the client proved the secret; None if it went away or took too long."""
        calls: list[Call] = []
        try:
            async with asyncio.timeout(self.settings.handshake_timeout_s):
                while client.conn.state is ConnectionState.AWAIT_AUTH:
                    data = await reader.read(_PRE_AUTH_READ)
                    if not data:
                        return None
                    calls = client.conn.receive_data(data)
        except TimeoutError:
            log.warning(
                "closing the ingress connection from %s: no proof of the secret within %g s",
                client.peer,
                self.settings.handshake_timeout_s,
            )
            return None
        client.writer.write(client.conn.data_to_send())  # WELCOME
        return calls

    def _calls(self, client: _Client, calls: list[Call]) -> None:
        d = self._dispatcher
        assert d is not None
        methods = type(d.immortal).rpc_methods()
        for call in calls:
            if call.method_id not in methods:  # refused before it is logged: nothing ran
                client.send(
                    call.request_id,
                    Refusal(
                        RefusalReason.UNKNOWN_METHOD,
                        f"{type(d.immortal).__name__} (instance {d.instance!r}) has no @rpc "
                        f"method with id {call.method_id}",
                    ),
                )
                continue
            found = d.keys.lookup(call.key, call.method_id)
            if isinstance(found, Outcome | Refusal):
                client.send(call.request_id, found)
                continue
            slot = (call.key, call.method_id)
            sent = slot in self._waiting  # this incarnation logs it already
            self._waiting.setdefault(slot, []).append((client, call.request_id))
            client.waiting.add((call.key, call.method_id, call.request_id))
            if found is None and not sent:
                now_ms = int(time.time() * 1000)
                d.ingress_impulse(encode_call_envelope(now_ms, call.key, call.method_id, call.args))
                log.debug("ingress call %s logged", describe_key(call.key))

    def _forget(self, client: _Client) -> None:
        client.closed = True
        self._clients.discard(client)
        for key, method_id, request_id in client.waiting:
            waiters = self._waiting.get((key, method_id))
            if waiters is None:
                continue
            waiters.remove((client, request_id))
            # The impulse went to the log: the outcome comes anyway, and a retry on another
            # connection finds it stored. The slot goes so that a retry sends it again only
            # if this incarnation did not (see _calls): keep it while others wait.
            if not waiters:
                del self._waiting[(key, method_id)]
        client.waiting.clear()


def _peer(writer: asyncio.StreamWriter) -> str:
    name = writer.get_extra_info("peername")
    if isinstance(name, tuple) and len(name) >= 2:
        return f"{name[0]}:{name[1]}"
    return str(name)
