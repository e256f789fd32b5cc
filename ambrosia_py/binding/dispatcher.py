"""The deterministic dispatcher, sans-IO: log records in, messages for the coordinator out.

This module owns the determinism boundary (seed 002, *Normal processing* and *Receive
logged replay messages*):

* Handlers run one message at a time, in log order. ``async def`` handlers are driven by
  hand (``coroutine.send``), never by an event loop: the only thing they may await is a
  call to an immortal (:class:`CallFuture`), and they resume when the record carrying the
  reply is dispatched. While a handler runs, the real event loop is hidden, so a handler
  that sleeps, opens a socket or awaits anything else gets a :class:`DeterminismError`.
* Modes: *starting* (first start), *recovering* (a checkpoint was restored; logged
  records are being replayed), *primary*. Outputs (calls, forks, return values) are sent
  in every mode — after a crash the coordinator drops the ones it already logged — but
  effects run only when primary, and impulses may only be sent by background code while
  primary.
* Checkpoints are taken the moment the coordinator asks, even with handlers suspended:
  see :mod:`checkpoint` for the state-plus-tail design.
* A return value is taken only from the instance the call went to, for a call a handler
  is awaiting or made and will await (a reply that comes first is kept, undecoded, until
  the await); anything else is dropped, logged and never decoded. The test reads only
  state that logged input built (the handlers and their calls), so it gives the same answer
  live, in replay and when a checkpoint's tail is replayed. Exceptions are decoded with
  the awaited method's codec: a json method never unpickles a reply.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .. import wire
from ..ingress.envelope import INGRESS_METHOD_ID
from ..ingress.errors import IngressProtocolError
from ..ingress.frames import Outcome, OutcomeKind, Refusal
from ..ingress.keys import Answer, IngressAnswer, IngressCall, KeyTable
from ..wire import (
    AttachTo,
    BecomingPrimary,
    Checkpoint,
    CountReplayableRpcBatch,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    LogRecord,
    Message,
    OutgoingReturnValue,
    OutgoingRpc,
    ReturnType,
    RpcBatch,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    UpgradeService,
    UpgradeTakeCheckpoint,
)
from ..wire.messages import new_outgoing_rpc
from . import codec
from .checkpoint import Snapshot
from .dispatch_state import DispatcherState, Mode, ReplyTo, Task
from .errors import (
    BindingError,
    DeterminismError,
    ImpulseDuringRecoveryError,
    UnknownMethodError,
)
from .immortal import CallFuture, Immortal, MethodSpec, Proxy

__all__ = ["Dispatcher", "Mode"]

log = logging.getLogger("ambrosia_py.binding")
_TAIL_KEEP = 1024  # messages the tail may hold with nothing in flight (see handle)
_AWAITED = RpcType.ASYNC_AWAIT


class Dispatcher(DispatcherState):
    """Runs one immortal: feed it records with :meth:`handle`, send what it returns.

    ``upgrade_to`` is the class to switch to when the coordinator says UpgradeTakeCheckpoint
    or UpgradeService. ``live_send`` is set by the I/O adapter for impulses, which
    background code sends between records.
    """

    def __init__(
        self,
        service: type[Immortal],
        instance: str,
        *,
        upgrade_to: type[Immortal] | None = None,
        options: Any = None,
    ) -> None:
        self.cls = service
        self.options = options
        self.instance = instance
        self.upgrade_to = upgrade_to
        self.mode = Mode.STARTING
        self.immortal = self._attach(service())
        self.live_send: Callable[[Message], None] | None = None
        self.became_primary = False  # set when the adapter should start background tasks
        self._call_seq = 0
        self._attached: set[str] = set()
        self._waiting: dict[int, Task] = {}
        # Calls a running handler made and has not awaited yet, and replies that came
        # before their await (several calls in flight at once, answered out of order).
        self._issued: dict[int, tuple[Task, CallFuture]] = {}
        self._early: dict[int, IncomingReturnValue] = {}
        self._current: Task | None = None  # the async handler running right now
        self._out: list[Message] = []
        self._effects: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._in_handler = False
        self._suppress = False  # replaying a checkpoint's tail: outputs were sent already
        # The last state taken with nothing in flight, and the incoming messages handled
        # since: a checkpoint with handlers in flight is the two. No base: none taken since
        # the tail was dropped (see handle) or ever; then nothing is in flight.
        self._base: Snapshot | None = None
        self._tail: list[Message] = []
        self._loop_hidden = False  # handle() hid the running event loop for a record
        self.me: Proxy | None = None  # the immortal's proxy for itself, made once
        self.keys = KeyTable()  # ingress outcomes by idempotency key: state, checkpointed
        self.ingress_answer: IngressAnswer | None = None  # set by the ingress (ingress/)
        self.record_seq = 0  # the record being handled (see handle_run)

    # -- the record stream ---------------------------------------------------------------

    def handle(self, record: LogRecord) -> list[Message]:
        """Process one record from the coordinator; return the messages to send back."""
        return self.handle_run([(record.seq, record.messages)])

    def handle_run(self, run: Sequence[tuple[int, Sequence[Message]]]) -> list[Message]:
        """Process records given as (seq, messages), one after the other, as :meth:`handle`
        would one by one; return the messages to send back for all of them, in order.
        While it runs, :attr:`record_seq` is the sequence id of the record being handled.

        The real event loop is hidden for the whole run (handlers run one after the
        other, synchronously): a handler that reaches for it gets a clear error, and
        hiding it once per run rather than per message keeps the hot path short.
        """
        self._out = []
        loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        self._loop_hidden = True
        plain = type(self.immortal)._plain_by_id
        loads = pickle.loads
        try:
            for seq, messages in run:
                self.record_seq = seq
                for msg in messages:
                    # Inline, the common case: a fork or impulse to a plain (sync) handler
                    # with pickled arguments. Anything else, or arguments that do not
                    # unpickle as (args, kwargs), takes the general path, which says what
                    # went wrong.
                    if type(msg) is IncomingRpc and msg.rpc_type is not _AWAITED:
                        name = plain.get(msg.method_id)
                        if name is not None:
                            try:
                                args, kwargs = loads(msg.args)
                                method = getattr(self.immortal, name)
                            except Exception:
                                self._message(msg, seq)
                                continue
                            self._tail.append(msg)
                            self._in_handler = True
                            try:
                                method(*args, **kwargs)
                            except Exception as exc:
                                spec = type(self.immortal).rpc_methods()[msg.method_id]
                                self._finish(spec, None, None, exc)
                            finally:
                                self._in_handler = False
                            continue
                    self._message(msg, seq)
                    plain = type(self.immortal)._plain_by_id  # an upgrade changes them
        finally:
            self._loop_hidden = False
            asyncio.events._set_running_loop(loop)
        if len(self._tail) > _TAIL_KEEP and not self._waiting:
            # Nothing in flight: the tail is needed only from the next handler that may
            # suspend on (_incoming takes a base then). Kept, it would hold every call's
            # arguments (and the buffers they are views of) until the next checkpoint.
            self._base, self._tail = None, []
        out, self._out = self._out, []
        return out

    def take_effects(self) -> list[tuple[Callable[..., Any], tuple[Any, ...]]]:
        """Effects to run in the outside world, in order (none while replaying)."""
        effects, self._effects = self._effects, []
        return effects

    def _message(self, msg: Message, seq: int) -> None:
        if isinstance(msg, IncomingRpc | IncomingReturnValue):
            self._incoming(msg, seq)
        elif isinstance(msg, RpcBatch | CountReplayableRpcBatch):
            for inner in msg.messages:
                self._message(inner, seq)
        elif isinstance(msg, Checkpoint):
            self.restore(msg.blob)
        elif isinstance(msg, TakeBecomingPrimaryCheckpoint):
            if self.mode is Mode.STARTING:
                self._first_start()
            self._become_primary()
        elif isinstance(msg, UpgradeTakeCheckpoint):
            self._upgrade()
            self._become_primary()
        elif isinstance(msg, UpgradeService):
            self._upgrade()
        elif isinstance(msg, TakeCheckpoint):
            self._out.append(Checkpoint(self.checkpoint()))
        elif isinstance(msg, BecomingPrimary):
            self.mode = Mode.PRIMARY
            self.became_primary = True
        elif isinstance(msg, InitialMessage):
            pass  # the echo of our own InitialMessage: record 0
        else:
            raise BindingError(f"unexpected {type(msg).__name__} in record {seq}")

    def _first_start(self) -> None:
        with self._handler_context():
            self.immortal.on_first_start()
        self._out.append(InitialMessage(b""))

    def _become_primary(self) -> None:
        self._out.append(Checkpoint(self.checkpoint()))
        self.mode = Mode.PRIMARY
        self.became_primary = True

    # -- dispatching calls ---------------------------------------------------------------

    @contextmanager
    def _handler_context(self) -> Iterator[None]:
        saved = self._enter()
        try:
            yield
        finally:
            self._leave(saved)

    # The hot path uses these directly: a context manager per message costs ~40%.
    def _enter(self) -> asyncio.AbstractEventLoop | None:
        self._in_handler = True
        if self._loop_hidden:  # by handle(), for the whole record
            return None
        loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        return loop

    def _leave(self, loop: asyncio.AbstractEventLoop | None) -> None:
        self._in_handler = False
        if not self._loop_hidden:
            asyncio.events._set_running_loop(loop)

    def _incoming(self, msg: IncomingRpc | IncomingReturnValue, seq: int | None) -> None:
        """Handle a call or a reply (from record ``seq``; None: a checkpoint's tail)."""
        if isinstance(msg, IncomingRpc):
            spec = type(self.immortal).rpc_methods().get(msg.method_id)
            # A handler that may await (an async one, or an ingress call to one) could be
            # in flight at a checkpoint: the tail starts here.
            if self._base is None and (spec is None or spec.is_async):
                self._base, self._tail = self._snapshot_now(), []
            self._tail.append(msg)
            self._dispatch(msg, spec)
            return
        task = self._awaiting(msg, seq)
        if task is not None:  # a dropped reply changed nothing: it is not part of the tail
            self._tail.append(msg)
            self._step(task, *self._reply_outcome(task.waiting_on, msg))

    def _dispatch(self, msg: IncomingRpc, spec: MethodSpec | None) -> None:
        if spec is None and msg.method_id == INGRESS_METHOD_ID and msg.rpc_type == RpcType.IMPULSE:
            self._ingress(msg)  # only this binding sends impulses: links refuse them
            return
        reply_to = (msg.sender, msg.call_seq) if msg.rpc_type == RpcType.ASYNC_AWAIT else None
        self._invoke(spec, msg.method_id, msg.args, reply_to)

    def _invoke(
        self, spec: MethodSpec | None, method_id: int, data: wire.Payload, reply_to: ReplyTo
    ) -> None:
        if spec is None:
            err = UnknownMethodError(
                f"{type(self.immortal).__name__} has no @rpc method with id {method_id}"
            )
            self._finish(None, reply_to, None, err)
            return
        try:
            args, kwargs = codec.decode_args(spec.codec, data)
        except Exception as exc:
            self._finish(spec, reply_to, None, exc)
            return
        method = getattr(self.immortal, spec.name)
        if not spec.is_async:
            saved = self._enter()
            try:
                result = method(*args, **kwargs)
            except Exception as exc:
                self._leave(saved)
                self._finish(spec, reply_to, None, exc)
            else:
                self._leave(saved)
                self._finish(spec, reply_to, result, None)
            return
        with self._handler_context():
            coro = method(*args, **kwargs)
        self._step(Task(coro, spec, reply_to), None, None)

    def _ingress(self, msg: IncomingRpc) -> None:
        """A call from outside (``ambrosia_py/ingress``): run only if its key is new."""
        try:
            step = self.keys.admit(msg.args)
        except IngressProtocolError as exc:
            log.error("dropped an ingress impulse: %s", exc)
            return
        if isinstance(step, Answer):
            self._answer(step.key, step.method_id, step.answer)
        elif step is not None:  # a new key: its outcome is kept under it (_finish)
            spec = type(self.immortal).rpc_methods().get(step.method_id)
            self._invoke(spec, step.method_id, step.args, IngressCall(step.key, step.method_id))

    def _answer(self, key: bytes, method_id: int, answer: Outcome | Refusal) -> None:
        """Answer the clients waiting on ``key``: an effect, so never while replaying."""
        if self.mode is Mode.PRIMARY and not self._suppress and self.ingress_answer is not None:
            self._effects.append((self.ingress_answer, (key, method_id, answer)))

    def _step(self, task: Task, value: Any, error: BaseException | None) -> None:
        """Run ``task`` on until it awaits a reply that has not come yet, or finishes."""
        while True:
            self._current = task
            try:
                saved = self._enter()  # _handler_context, spelled out on the hot path
                try:
                    awaited = task.coro.throw(error) if error is not None else task.coro.send(value)
                    while not isinstance(awaited, CallFuture):
                        awaited = task.coro.throw(
                            DeterminismError(
                                f"handler {task.spec.name!r} awaited {awaited!r}: handlers may "
                                "only await calls to immortals; do I/O in a @background task"
                            )
                        )
                finally:
                    self._leave(saved)
            except StopIteration as stop:
                self._done(task)
                self._finish(task.spec, task.reply_to, stop.value, None)
                return
            except Exception as exc:
                self._done(task)
                self._finish(task.spec, task.reply_to, None, exc)
                return
            finally:
                self._current = None
            self._issued.pop(awaited.call_seq, None)
            task.issued.discard(awaited.call_seq)
            early = self._early.pop(awaited.call_seq, None)
            if early is None:
                task.waiting_on = awaited
                self._waiting[awaited.call_seq] = task
                return
            value, error = self._reply_outcome(awaited, early)

    def _done(self, task: Task) -> None:
        """A handler finished: calls it made and never awaited are no longer awaitable."""
        for call_seq in sorted(task.issued):
            self._issued.pop(call_seq, None)
            if self._early.pop(call_seq, None) is not None:
                log.info("%s finished without awaiting call %d", task.spec.name, call_seq)

    def _awaiting(self, reply: IncomingReturnValue, seq: int | None) -> Task | None:
        """The handler awaiting ``reply``, or None: then the reply is dropped undecoded.

        A pure function of logged input (which handlers await which calls), so replay
        and a checkpoint's tail drop exactly what the live run dropped.
        """
        task = self._waiting.get(reply.call_seq)
        issued = self._issued.get(reply.call_seq)
        if task is None and issued is not None and reply.sender == issued[1].callee:
            # Its handler will await it later: keep it (undecoded) until then. It is
            # part of the checkpoint's tail, like any reply that changes what happens.
            del self._issued[reply.call_seq]
            self._early[reply.call_seq] = reply
            self._tail.append(reply)
            return None
        if task is None and issued is not None:
            why = f"call {reply.call_seq} went to {issued[1].callee!r}"
        elif task is None or task.waiting_on is None:
            why = f"no handler awaits call {reply.call_seq}"
        elif reply.sender != task.waiting_on.callee:
            why = f"call {reply.call_seq} went to {task.waiting_on.callee!r}"
        else:
            del self._waiting[reply.call_seq]
            return task
        log.warning(
            "dropped a return value (%s, %d bytes) from %r for call %d in %s: %s; not decoded",
            reply.return_type.name,
            len(reply.value),
            reply.sender,
            reply.call_seq,
            "the checkpoint's tail" if seq is None else f"record {seq}",
            why,
        )
        return None

    def _reply_outcome(
        self, awaited: CallFuture | None, reply: IncomingReturnValue
    ) -> tuple[Any, BaseException | None]:
        """What the ``await`` of ``awaited`` gives: a value, or an exception to raise."""
        assert awaited is not None
        method_codec = awaited.method.codec
        if reply.return_type == ReturnType.EXCEPTION:
            return None, codec.decode_exception(method_codec, reply.value)
        if reply.return_type == ReturnType.NO_VALUE:
            return None, None
        return codec.decode_value(method_codec, reply.value), None

    def _finish(
        self, spec: MethodSpec | None, reply_to: ReplyTo, result: Any, error: BaseException | None
    ) -> None:
        if error is not None:
            if isinstance(error, RuntimeError) and "no running event loop" in str(error):
                name = spec.name if spec else "?"
                error = DeterminismError(
                    f"handler {name!r} used the event loop ({error}); handlers see only "
                    "logged input: do I/O in a @background task"
                )
            if reply_to is None:
                log.error("handler %s raised %r", spec.name if spec else "?", error)
        if reply_to is None:
            return
        kind, value = codec.encode_outcome(spec, result, error)
        if isinstance(reply_to, IngressCall):  # kept under its key, then answered
            outcome = Outcome(OutcomeKind(kind), value)
            self.keys.finish(reply_to.key, reply_to.method_id, outcome)
            self._answer(reply_to.key, reply_to.method_id, outcome)
            return
        sender, call_seq = reply_to
        self._emit(OutgoingReturnValue(sender, kind, self.instance, call_seq, value))

    # -- what handlers (and background code) call ----------------------------------------

    def _emit(self, msg: Message) -> None:
        if not self._suppress:
            self._out.append(msg)

    def _require_handler(self, what: str) -> None:
        if not self._in_handler:
            raise DeterminismError(
                f"{what} outside a handler: background code feeds the immortal through "
                "impulses (self.impulse.method(...))"
            )

    def _outgoing(
        self,
        destination: str,
        spec: MethodSpec,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rpc_type: RpcType,
        call_seq: int = 0,
    ) -> None:
        data = codec.encode_args(spec.codec, spec.signature, args, kwargs)
        if destination in ("", self.instance):
            destination = ""
        elif destination not in self._attached:
            self._attached.add(destination)
            self._emit(AttachTo(destination))
        sender = self.instance if rpc_type == RpcType.ASYNC_AWAIT else ""
        self._emit(new_outgoing_rpc(destination, spec.id, rpc_type, data, sender, call_seq))

    def call(
        self, destination: str, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> CallFuture:
        """An async/await call from a handler."""
        self._require_handler(f"calling {spec.name}")
        self._call_seq += 1
        self._outgoing(destination, spec, args, kwargs, RpcType.ASYNC_AWAIT, self._call_seq)
        callee = self.instance if destination in ("", self.instance) else destination
        future = CallFuture(self._call_seq, spec, callee)
        if self._current is not None:  # an async handler: it may await this call later
            self._issued[future.call_seq] = (self._current, future)
            self._current.issued.add(future.call_seq)
        return future

    def fork(
        self, destination: str, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        """A fire-and-forget call from a handler."""
        self._require_handler(f"forking {spec.name}")
        self._outgoing(destination, spec, args, kwargs, RpcType.FORK)

    def impulse(self, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """An impulse to this immortal, from background code while primary."""
        data = codec.encode_args(spec.codec, spec.signature, args, kwargs)
        self._send_impulse(spec.id, data, f"impulse {spec.name}")

    def ingress_impulse(self, envelope: bytes) -> None:
        """A call from outside (``ingress/envelope.py``), from the ingress while primary."""
        self._send_impulse(INGRESS_METHOD_ID, envelope, "an ingress call")

    def _send_impulse(self, method_id: int, data: bytes, what: str) -> None:
        if self.mode is not Mode.PRIMARY:
            raise ImpulseDuringRecoveryError(
                f"{what} sent while {self.mode.value}: impulses are input from "
                "the outside world and may only be sent once the immortal is primary"
            )
        if self._in_handler:
            raise DeterminismError(
                f"{what} sent from a handler: replay would send it again; handlers fork instead"
            )
        if self.live_send is None:
            raise BindingError("no connection to the coordinator for impulses")
        self.live_send(OutgoingRpc("", method_id, RpcType.IMPULSE, data))

    def effect(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._require_handler("an effect")
        if self.mode is Mode.PRIMARY and not self._suppress:
            self._effects.append((fn, args))
