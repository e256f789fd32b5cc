"""The ingress's asyncio edge: clients in, impulses to the immortal, answers out.

A thin adapter around :class:`~ambrosia_py.ingress.connection.ServerConnection`: each
connection is a :class:`~ambrosia_py.ingress.peer.Peer` (an ``asyncio.Protocol``), this
module what they share. The socket is bound when ``ambrosia-py run`` starts (a port in
use is one line before anything else starts); connections are accepted only once the
immortal is primary (:meth:`IngressServer.attach`), so a client that connects during
recovery just waits.

A call goes one of three ways, decided on the event loop between two records:

- its key's call finished: the stored outcome is sent at once. It was computed from
  logged input (the coordinator hands the binding only durable records), so this
  answer is as durable as one sent by an effect, and nothing is logged again;
- its key's call is running, or this incarnation already sent it to the log: the client
  waits for the outcome, which answers everyone waiting on the key;
- else it becomes an impulse (``envelope.py``: key, method, arguments, arrival time),
  logged by the coordinator before the dispatcher runs it; its outcome goes into the
  key table and comes back here as an effect (:meth:`IngressServer.answer`), which runs
  only once the record is durable and never during replay. The calls of one turn of the
  event loop, from all connections, make one impulse (a BATCH): one record and one
  ``fdatasync`` serve them all, and the answers to one connection leave in one write.

Waiting clients belong to this incarnation: after a crash they reconnect and send the
same key again. A connection may have ``max_in_flight`` calls waiting; past that it is
not read until answers go out.

Connections are admitted through one :class:`~ambrosia_py.serving.Admission`: a client
is pending until it proved the secret, and a newcomer that finds every slot taken
evicts the oldest pending one, so connections that send nothing cannot lock out a
client that proves itself within a round trip. A connection is admitted as it is
accepted (:class:`~ambrosia_py.serving.Listener`), before its TLS handshake, so that
connections that never finish TLS count and are evicted too. Refusals and closes a
client can cause at will are logged through one :class:`~ambrosia_py.serving.RefusalLog`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING

import attrs

from ..binding.errors import BindingError
from ..serving import Admission, ConnectionLimits, Incoming, Listener, RefusalLog, Slot
from .connection import ServerConnection
from .envelope import (
    RetentionEnvelope,
    encode_batch_envelope,
    encode_call_envelope,
    encode_retention_envelope,
)
from .frames import DEFAULT_MAX_CALL_FRAME, Call, Outcome, Refusal, RefusalReason, ServiceInfo
from .keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS, Answer, KeyTable, describe_key
from .peer import Peer

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
_SHARED = ConnectionLimits()  # every server's defaults (ambrosia_py.serving)
DEFAULT_MAX_PENDING_PER_SOURCE = _SHARED.max_pending_per_source
DEFAULT_MAX_BUFFERED_OUTPUT = _SHARED.max_buffered_output
DEFAULT_OUTPUT_STALL_S = _SHARED.output_stall_s
# Calls (their arguments and keys) queued for one BATCH impulse before it goes at once,
# without waiting for the end of the loop's turn: a record's size stays moderate.
_BATCH_BYTES = 1024 * 1024


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

    ``max_connections`` bounds the connections open at once, from accept on (TLS
    handshake included); past it a newcomer evicts the oldest that has not proved the
    secret yet, and is refused only when all have. ``max_pending_per_source``:
    connections from one address that have not proved it (past it that address's oldest
    goes). ``handshake_timeout_s``: the time a client has to finish its TLS handshake
    (from accept), and then as long to prove the secret. ``max_buffered_output``: unsent
    answers a connection may have before it is not read; ``output_stall_s``: how long it
    may stay over that before it is closed.
    """

    host: str = DEFAULT_HOST
    port: int = 0
    keep_count: int = DEFAULT_KEEP_COUNT
    keep_seconds: float = DEFAULT_KEEP_SECONDS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    max_call_frame: int = DEFAULT_MAX_CALL_FRAME
    max_pending_per_source: int = DEFAULT_MAX_PENDING_PER_SOURCE
    max_buffered_output: int = DEFAULT_MAX_BUFFERED_OUTPUT
    output_stall_s: float = DEFAULT_OUTPUT_STALL_S

    @property
    def retention(self) -> RetentionEnvelope:
        return RetentionEnvelope(self.keep_count, int(self.keep_seconds * 1000))

    @property
    def limits(self) -> ConnectionLimits:
        """The connection limits these settings give (checked when the server is made)."""
        return ConnectionLimits(
            max_connections=self.max_connections,
            max_pending_per_source=self.max_pending_per_source,
            handshake_timeout_s=self.handshake_timeout_s,
            max_buffered_output=self.max_buffered_output,
            output_stall_s=self.output_stall_s,
        )


class IngressServer:
    """The ingress of one immortal: :meth:`bind`, then :meth:`attach` once primary."""

    def __init__(
        self, secret: bytes, settings: IngressSettings, tls: ssl.SSLContext | None = None
    ) -> None:
        self._secret = secret
        self.settings = settings
        self.limits = settings.limits  # checked here: a bad limit stops start-up
        self.tls = tls  # the links' server context (run --tls-cert): calls in TLS too
        self.admission = Admission(self.limits)
        self._refused = RefusalLog(log, "ingress connections refused or closed")
        self._listener: Listener | None = None
        self._dispatcher: Dispatcher | None = None
        self._info: ServiceInfo | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # asked once, at bind
        self._clients: set[Peer] = set()
        # (key, method id) -> the connections and request ids waiting for its outcome
        self._waiting: dict[tuple[bytes, int], list[tuple[Peer, int]]] = {}
        self._connections: set[Incoming] = set()  # accepted, until their task ends
        # Calls to log, queued in this turn of the loop: (key, method id, arguments).
        self._batch: list[tuple[bytes, int, bytes]] = []
        self._batch_bytes = 0
        self._batch_scheduled = False

    @property
    def address(self) -> tuple[str, int]:
        if self._listener is None or not self._listener.sockets:
            raise RuntimeError("the ingress is not bound")
        return self._listener.address

    async def bind(self) -> tuple[str, int]:
        """Listen on the configured address; accept nothing until :meth:`attach`."""
        self._loop = asyncio.get_running_loop()
        self._listener = await Listener.open(
            self.settings.host, self.settings.port, self._accept, log, start=False
        )
        return self.address

    def attach(self, dispatcher: Dispatcher) -> None:
        """Start serving calls to ``dispatcher``'s immortal (it must be primary)."""
        if self._listener is None:
            raise RuntimeError("bind the ingress before attaching it")
        self._dispatcher = dispatcher
        self._info = ServiceInfo(
            dispatcher.instance, type(dispatcher.immortal).__name__, self.settings.max_call_frame
        )
        # The key table is registered where the service starts (ambrosia-py run), so that
        # replay finds it; a dispatcher started without it gets an empty one here, before
        # this incarnation logs any call.
        dispatcher.register_ingress(KeyTable)
        dispatcher.ingress_answer = self.answer
        wanted = self.settings.retention
        if _table(dispatcher).retention != wanted:  # logged before any call of this incarnation
            dispatcher.ingress_impulse(encode_retention_envelope(wanted))
        self._listener.start()

    def close(self) -> None:
        if self._dispatcher is not None:
            self._dispatcher.ingress_answer = None
        if self._listener is not None:
            self._listener.close()
        for client in list(self._clients):
            client.close()
        for incoming in list(self._connections):
            if incoming.transport is None:  # still in its TLS handshake
                incoming.drop()
        self._refused.flush()

    # -- the effect ----------------------------------------------------------------------

    def answer(self, answer: Answer) -> None:
        """Answer everyone waiting on its key (an effect of the record that decided it)."""
        key, method_id = answer.key, answer.method_id
        for client, request_id in self._waiting.pop((key, method_id), ()):
            client.send(request_id, answer.answer)
            client.answered(key, method_id, request_id)

    # -- connections ---------------------------------------------------------------------

    def _accept(self, incoming: Incoming) -> None:
        """A connection was accepted: admitted (perhaps evicting a pending one to make
        room) at once, before any byte of it is read, TLS included, or refused."""
        source, peer = incoming.source, incoming.address

        def evict(why: str) -> None:  # the table makes room for a newcomer
            self._refused(source, "closing the ingress connection from %s: %s", peer, why)
            incoming.drop()  # at once, in its TLS handshake too; its task ends

        slot = self.admission.admit(source, evict)
        if slot is None:
            self._refused(
                source,
                "refusing an ingress connection from %s: all %d connections have proved the "
                "secret (the limit)",
                peer,
                self.limits.max_connections,
            )
            incoming.drop()
            return
        self._connections.add(incoming)
        task = incoming.start(self._serve(incoming, slot))
        task.add_done_callback(lambda _: self._connections.discard(incoming))

    async def _serve(self, incoming: Incoming, slot: Slot) -> None:
        """Hand the connection to the loop, in TLS if the ingress has it (its handshake
        done within the handshake timeout of accept), with a :class:`Peer` on it, which
        serves it from then on; say why if that failed."""
        assert self._loop is not None
        peer = Peer(
            self,
            incoming,
            slot,
            self.limits,
            max_in_flight=self.settings.max_in_flight,
            loop=self._loop,
        )
        timeout = self.settings.handshake_timeout_s
        try:
            await incoming.connect(lambda: peer, self.tls, timeout)
        except TimeoutError:
            self._refused(
                incoming.source,
                "closing the ingress connection from %s: no TLS handshake within %g s",
                incoming.address,
                timeout,
            )
        except ssl.SSLError as exc:  # a client TLS refuses (certificate, version, ...)
            self._refused(
                incoming.source, "TLS with the ingress client %s failed: %s", incoming.address, exc
            )
        except (ConnectionError, OSError) as exc:
            self._refused(
                incoming.source,
                "ingress connection from %s lost: %s",
                incoming.address,
                exc,
                level=logging.INFO,
            )
        finally:
            if not peer.started:  # else the peer frees its slot when its connection ends
                self.admission.release(slot)

    # -- what each connection's Peer calls -----------------------------------------------

    def new_connection(self) -> ServerConnection:
        assert self._info is not None
        return ServerConnection(self._secret, self._info)

    def opened(self, peer: Peer) -> None:
        self._clients.add(peer)

    def proved(self, peer: Peer) -> None:
        self.admission.establish(peer.slot)  # proved the secret: never evicted from now on

    def refuse(self, key: str, message: str, *args: object, level: int = logging.WARNING) -> None:
        """Why a connection closed, through the refusal log: counted under its address
        or, once the client proved the secret, under a count of its own
        (:meth:`~ambrosia_py.serving.Slot.refusal_key`), so that a flood from the same
        address cannot hide an honest client's trouble."""
        self._refused(key, message, *args, level=level)

    def ended(self, peer: Peer) -> None:
        self.admission.release(peer.slot)
        self._forget(peer)

    def take(self, client: Peer, calls: list[Call]) -> list[Call]:
        """Answer or log ``calls`` in order; return those left once the answers sent at
        once pass the output bound (one read's calls for a large stored outcome would
        otherwise each queue a copy of it, unread)."""
        d = self._dispatcher
        assert d is not None
        methods = type(d.immortal).rpc_methods()
        bound = self.limits.max_buffered_output
        for at, call in enumerate(calls):
            if client.unsent > bound:
                return calls[at:]
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
            found = _table(d).lookup(call.key, call.method_id)
            if isinstance(found, Outcome | Refusal):
                client.send(call.request_id, found)
                continue
            slot = (call.key, call.method_id)
            sent = slot in self._waiting  # this incarnation logs it already
            self._waiting.setdefault(slot, []).append((client, call.request_id))
            client.waiting.add((call.key, call.method_id, call.request_id))
            if found is None and not sent:
                self._log_call(call)
        return []

    def _log_call(self, call: Call) -> None:
        """Queue ``call`` for the log. The calls queued in one turn of the event loop,
        from every connection, go to the coordinator as one BATCH impulse at its end
        (``envelope.py``): one record, one ``fdatasync`` and one dispatch for all of
        them. A batch that grows past :data:`_BATCH_BYTES` goes at once."""
        self._batch.append((call.key, call.method_id, call.args))
        self._batch_bytes += len(call.args) + len(call.key)
        if self._batch_bytes >= _BATCH_BYTES:
            self._send_batch()
        elif not self._batch_scheduled:
            self._batch_scheduled = True
            assert self._loop is not None
            self._loop.call_soon(self._send_batch)

    def _send_batch(self) -> None:
        """Log the queued calls as one impulse (a lone call as a CALL, as before)."""
        self._batch_scheduled = False
        batch, self._batch, self._batch_bytes = self._batch, [], 0
        if not batch or self._dispatcher is None:
            return
        now_ms = int(time.time() * 1000)
        if len(batch) == 1:
            envelope = encode_call_envelope(now_ms, *batch[0])
        else:
            envelope = encode_batch_envelope(now_ms, batch)
        try:
            self._dispatcher.ingress_impulse(envelope)
        except BindingError as exc:  # the binding is stopping: callers retry elsewhere
            log.info("closing the ingress connections: %s", exc)
            for client in list(self._clients):
                client.close()
            return
        if log.isEnabledFor(logging.DEBUG):
            for key, _, _ in batch:
                log.debug("ingress call %s logged", describe_key(key))

    def _forget(self, client: Peer) -> None:
        client.closed = True
        self._clients.discard(client)
        for key, method_id, request_id in client.waiting:
            waiters = self._waiting.get((key, method_id))
            if waiters is None:
                continue
            waiters.remove((client, request_id))
            # The impulse went to the log: the outcome comes anyway, and a retry on another
            # connection finds it stored. The slot goes so that a retry sends it again only
            # if this incarnation did not (see take): keep it while others wait.
            if not waiters:
                del self._waiting[(key, method_id)]
        client.waiting.clear()


def _table(dispatcher: Dispatcher) -> KeyTable:
    """The dispatcher's key table: its ingress hook (registered by :meth:`attach`, or
    restored from a checkpoint)."""
    table = dispatcher.ingress
    if not isinstance(table, KeyTable):
        raise TypeError(
            f"the dispatcher's ingress hook is a {type(table).__name__}, not a KeyTable"
        )
    return table
