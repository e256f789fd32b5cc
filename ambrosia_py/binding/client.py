"""The binding's two-socket client: the thin asyncio adapter around the dispatcher.

It connects to the coordinator's receive port first (where it writes), then to its send
port (where it reads), and sends nothing until the first record arrives (reference
ambrosia.md, *The two local sockets*) — nothing but, given this start's token, the
42-byte preamble first on each socket that proves it was started for this coordinator
(``coordinator/core/binding_auth.py``). Records are verified as they are read (check
bytes, committer id, consecutive sequence ids); a bad one stops the binding. When the
coordinator goes away the binding stops: they live and die together. When the binding
must stop (a failed background task, a record it cannot go on from) it closes both
connections and the coordinator stops too.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from .. import crashpoints, wire
from ..allocator import prime_allocator
from ..coordinator.core.binding_auth import Socket, encode_preamble
from ..wire import Message, RecordReader
from .background_tasks import BackgroundFailure, BackgroundTasks
from .dispatcher import Dispatcher
from .errors import BindingError
from .hooks import IngressFactory
from .immortal import Immortal
from .pickling import find_unpicklable
from .socket_io import SocketStream, open_socket

__all__ = ["Connection", "ServiceFailedError", "connect", "record_failure", "serve"]

log = logging.getLogger("ambrosia_py.binding")


async def _open(
    host: str, port: int, deadline: float, refused: asyncio.Future[bytes] | None = None
) -> SocketStream:
    """Connect, retrying while the port is not listening yet (the send port opens late).

    ``refused`` completes when the coordinator closed the receive connection already.
    """
    while True:
        if refused is not None and refused.done():
            raise ConnectionRefusedError(
                f"the coordinator closed the connection to its receive port before opening "
                f"{host}:{port}: it refused this binding (a wrong or missing binding token? "
                "its log says why)"
            )
        try:
            return SocketStream(await open_socket(host, port))
        except (ConnectionRefusedError, OSError) as exc:
            if time.monotonic() >= deadline:
                raise ConnectionRefusedError(
                    f"no coordinator listening on {host}:{port} ({exc})"
                ) from None
            await asyncio.sleep(0.01)


class Connection:
    """The binding's two connections: it writes to the receive port, reads the send port.

    Raw sockets (``socket_io.py``), not asyncio streams: every byte of every call goes
    through them, and the stream classes copy each read and write.
    """

    def __init__(self, receive: SocketStream, send: SocketStream) -> None:
        self._receive = receive
        self._send = send
        self.reader = send
        self.writer = receive

    def close(self) -> None:
        self._receive.close()
        self._send.close()


async def connect(
    receive_port: int,
    send_port: int,
    *,
    host: str = "127.0.0.1",
    timeout: float = 30.0,
    token: bytes | None = None,
) -> Connection:
    """Connect to a coordinator: its receive port first, then its send port.

    With ``token`` (what the coordinator wrote to its token file for this start) the
    preamble goes first on each socket; without it the coordinator must run with
    ``--binding-auth none``.
    """
    deadline = time.monotonic() + timeout
    receive = await _open(host, receive_port, deadline)
    if token is not None:
        receive.write(encode_preamble(token, Socket.RECEIVE))
    # The coordinator never writes on this socket: a read ends only when it closes it,
    # which, before the send port opens, means it refused the token.
    refused = asyncio.ensure_future(receive.read(1))
    try:
        send = await _open(host, send_port, deadline, refused)
    except BaseException:
        receive.close()
        raise
    finally:
        refused.cancel()
    if token is not None:
        send.write(encode_preamble(token, Socket.SEND))
    return Connection(receive, send)


async def serve(
    service: type[Immortal],
    instance: str,
    receive_port: int,
    send_port: int,
    *,
    host: str = "127.0.0.1",
    upgrade_to: type[Immortal] | None = None,
    timeout: float = 30.0,
    dispatcher: Dispatcher | None = None,
    options: Any = None,
    token: bytes | None = None,
    on_primary: Callable[[Dispatcher], None] | None = None,
    background_failure: BackgroundFailure = BackgroundFailure.STOP,
    ingress: IngressFactory | None = None,
) -> Dispatcher:
    """Run ``service`` as ``instance`` until the coordinator goes away; return the dispatcher.

    ``token``: this start's binding token (see :func:`connect`). ``on_primary`` runs
    once, when the immortal first becomes primary, beside its background tasks (the
    ingress starts serving there). ``ingress`` registers the ingress hook
    (``hooks.py``), before any record is read. ``background_failure``: what a failing
    ``@background`` task does (``background.py``); with ``STOP`` the binding disconnects
    and this raises :class:`BackgroundTaskError`. A record the binding cannot go on from
    (a state that cannot be pickled for a checkpoint, ...) raises
    :class:`ServiceFailedError`.
    """
    prime_allocator()  # every read asks for 256 KiB: from the heap, not a fresh mapping
    conn = await connect(receive_port, send_port, host=host, timeout=timeout, token=token)
    d = dispatcher or Dispatcher(service, instance, upgrade_to=upgrade_to, options=options)
    if ingress is not None:
        d.register_ingress(ingress)
    await _Serving(conn, d, on_primary, background_failure).run()
    return d


class _Serving:
    """One dispatcher served over one connection, until the coordinator goes away.

    Records are handled as they are read, on the loop's read callback (:meth:`on_data`);
    what they produce goes out in one write. When the coordinator falls behind, reading
    pauses until it has taken what was written (:meth:`drained`).
    """

    def __init__(
        self,
        conn: Connection,
        d: Dispatcher,
        on_primary: Callable[[Dispatcher], None] | None,
        background_failure: BackgroundFailure,
    ) -> None:
        self.conn = conn
        self.d = d
        self.on_primary = on_primary  # run once, then None
        self.records = RecordReader()
        self.impulses: list[Message] = []  # sent by background code in this step of the loop
        self.failures: list[BindingError] = []  # what stopped the binding, first first
        self.background = BackgroundTasks(lambda: d.immortal, background_failure, self.stop)
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.draining: list[asyncio.Task[None]] = []  # while the coordinator is behind
        d.live_send = self.impulse

    async def run(self) -> None:
        """Serve until the stream ends; raise what stopped the binding, if anything did."""
        reader = self.conn.reader
        try:
            reader.read_each(self.on_data, self.on_error)
            try:
                await self.ended
            finally:
                for task in self.draining:
                    task.cancel()
            try:
                self.records.close()
            except wire.TruncatedInputError as exc:  # it died mid-send: it stopped, as below
                log.info("the coordinator's stream ended inside a record: %s", exc)
            if self.records.offset == 0 and not self.failures:
                log.error(
                    "the coordinator closed the connection before sending anything: it "
                    "refused this binding (a wrong or missing binding token?) or stopped; "
                    "see its log"
                )
            if not self.failures:
                log.info("coordinator went away; stopping")
        except ConnectionError as exc:
            if not self.failures:
                log.info("coordinator connection lost (%s); stopping", exc)
        finally:
            self.background.cancel()
            self.conn.close()
        if self.failures:
            raise self.failures[0]

    def send(self, msgs: list[Message]) -> None:
        """One transport write for everything a record produced, not one per message;
        impulses sent before it go first, in order."""
        if self.impulses:
            msgs = [*self.impulses, *msgs]
            self.impulses.clear()
        if msgs:
            parts = wire.encode_messages_parts(msgs)
            writer = self.conn.writer
            writer.reach_midway("binding.mid_send", parts)
            writer.writelines(parts)

    def impulse(self, msg: Message) -> None:
        """An impulse from background code (or the ingress). Those sent in one step of the
        loop (an ingress read of many calls) go in one write at its end: a system call
        each would cost more than logging them."""
        if not self.impulses:
            asyncio.get_running_loop().call_soon(self.send, [])
        self.impulses.append(msg)

    def stop(self, error: BindingError) -> None:
        """Stop the binding: closing the connection ends the read; the coordinator sees
        the binding go, makes what it holds durable and exits."""
        if not self.failures:
            self.failures.append(error)
            self.conn.close()

    def after_run(self) -> None:
        """What follows records once their output is written: their effects, and the
        start of background tasks (and of ``on_primary``) once primary."""
        crashpoints.reach("binding.before_effects")
        d = self.d
        for fn, args in d.take_effects():
            _run_effect(fn, args)
        if d.became_primary:
            d.became_primary = False
            self.background.start()
            if self.on_primary is not None:
                on_primary, self.on_primary = self.on_primary, None
                on_primary(d)

    def handle(self) -> None:
        """Handle the records read so far, in order, until one's output leaves more
        queued than the high-water mark: reading pauses then until the coordinator has
        taken it (:meth:`drained`), and goes on from there."""
        records, d, writer = self.records, self.d, self.conn.writer
        while not records.drained:
            # A run of records made only of calls is handled in one go (one write of what
            # they produce); any other record is read and handled alone. Replay is mostly
            # such runs.
            run: Sequence[tuple[int, Sequence[wire.Message]]] = records.take_calls()
            if not run:
                record = records.next_record()
                if record is None:
                    return
                run = [(record.seq, record.messages)]
            try:
                out = d.handle_run(run)
            except Exception as exc:
                raise record_failure(d, d.record_seq, exc) from exc
            if out:  # most replayed records produce nothing: no write
                self.send(out)
                if writer.behind:
                    self.conn.reader.pause_reading()
                    self.draining.append(asyncio.ensure_future(self.drained()))
                    return
            self.after_run()

    async def drained(self) -> None:
        """The coordinator took what was written: go on handling what was read."""
        try:
            await self.conn.writer.drain()
            self.draining.clear()
            self.after_run()
            self.handle()
            if not self.draining:
                self.conn.reader.resume_reading()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            if not self.ended.done():
                self.ended.set_exception(exc)

    def on_data(self, data: bytes) -> None:
        """Called by the loop for each read (a loop turn less than a task per read, on
        every awaited call's path); what goes wrong ends the serving, as it is."""
        if self.ended.done():
            return
        if not data:
            self.ended.set_result(None)
            return
        try:
            self.records.feed(data)  # a fresh bytes: kept by reference, not copied
            if not self.draining:
                self.handle()
        except BaseException as exc:
            self.conn.reader.pause_reading()
            self.ended.set_exception(exc)

    def on_error(self, exc: OSError) -> None:
        if not self.ended.done():
            self.ended.set_exception(exc)


class ServiceFailedError(BindingError):
    """The binding cannot go on from a record; the message says which record and why."""


def record_failure(d: Dispatcher, seq: int, exc: Exception) -> ServiceFailedError:
    """What stopped the binding at record ``seq``, in one sentence.

    The usual cause is a state attribute that cannot be pickled, met when the
    coordinator asks for a checkpoint; pickle does not say which attribute, so it is
    looked for.
    """
    cls = type(d.immortal).__name__
    state = d.state()
    for name, value in state.items():
        found = find_unpicklable(value, name)
        if found is not None:
            return ServiceFailedError(
                f"{cls}: {found.describe('state attribute')}. Every attribute is state, "
                "pickled into each checkpoint: keep sockets, locks, files and the like in a "
                "@background task, not in self"
            )
    # Control records (a checkpoint, a request for one) have negative sequence ids.
    where = f"record {seq}" if seq >= 0 else "a control record"
    return ServiceFailedError(f"{cls} stopped at {where}: {type(exc).__name__}: {exc}")


_effect_tasks: set[asyncio.Future[Any]] = set()  # keeps running async effects referenced


def _run_effect(fn: Any, args: tuple[Any, ...]) -> None:
    try:
        result = fn(*args)
        if result is not None and inspect.isawaitable(result):
            task = asyncio.ensure_future(result)
            _effect_tasks.add(task)
            task.add_done_callback(_effect_done)
    except Exception:
        log.exception("effect %r failed", fn)


def _effect_done(task: asyncio.Future[Any]) -> None:
    """An async effect ended: one that raised is logged (an effect runs at most once and
    nothing awaits it, so its exception would otherwise go unseen)."""
    _effect_tasks.discard(task)
    if not task.cancelled() and task.exception() is not None:
        log.error("async effect failed", exc_info=task.exception())
