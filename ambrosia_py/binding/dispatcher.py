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

The dispatcher is composed of the rest of its concerns: the calls its handlers await
(:mod:`outstanding`), the base and tail of its next checkpoint (:mod:`dispatch_state`),
and calls from outside through its ingress hook (:mod:`hooks`).
"""

from __future__ import annotations

import asyncio
import logging
import pickle
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import cloudpickle

from .. import wire
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
from .dispatch_state import Checkpoints, Mode, class_name, tail_messages
from .errors import (
    BindingError,
    DeterminismError,
    ImpulseDuringRecoveryError,
    UnknownMethodError,
)
from .files import sync_written
from .hooks import AnswerSink, IngressFactory, IngressHook, KeyedCall, Steps
from .immortal import CallFuture, Immortal, MethodSpec, Proxy
from .outstanding import Outstanding, ReplyTo, Task, reply_outcome

__all__ = ["Dispatcher", "Mode"]

log = logging.getLogger("ambrosia_py.binding")
_AWAITED = RpcType.ASYNC_AWAIT
_PRIVATE = "_ambrosia_"  # the framework's attributes of an immortal: not its state


class Dispatcher:
    """Runs one immortal: feed it records with :meth:`handle`, send what it returns.

    ``upgrade_to`` is the class to switch to when the coordinator says UpgradeTakeCheckpoint
    or UpgradeService. ``ingress`` registers the ingress hook (:meth:`register_ingress`).
    ``live_send`` is set by the I/O adapter for impulses, which background code sends
    between records.
    """

    def __init__(
        self,
        service: type[Immortal],
        instance: str,
        *,
        upgrade_to: type[Immortal] | None = None,
        options: Any = None,
        ingress: IngressFactory | None = None,
    ) -> None:
        self.cls = service
        self.options = options
        self.instance = instance
        self.upgrade_to = upgrade_to
        self.mode = Mode.STARTING
        self.immortal = self._attach(service())
        self.live_send: Callable[[Message], None] | None = None
        self.became_primary = False  # set when the adapter should start background tasks
        self.me: Proxy | None = None  # the immortal's proxy for itself, made once
        self.record_seq = 0  # the record being handled (see handle_run)
        # Calls from outside: the hook is replayed state, checkpointed (hooks.py); the
        # answers' sink is the ingress server's, set while it serves.
        self._ingress_factory = ingress
        self.ingress: IngressHook[Any] | None = ingress() if ingress is not None else None
        self.ingress_answer: AnswerSink | None = None
        self._call_seq = 0
        self._attached: set[str] = set()
        self._calls = Outstanding()
        self._checkpoints = Checkpoints()
        self._current: Task | None = None  # the async handler running right now
        self._out: list[Message] = []
        self._effects: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []
        self._in_handler = False
        self._suppress = False  # replaying a checkpoint's tail: outputs were sent already
        self._loop_hidden = False  # handle_run() hid the running event loop for a run

    def register_ingress(self, factory: IngressFactory) -> IngressHook[Any]:
        """Take calls from outside through the hook ``factory`` makes (a fresh one, as a
        first start has it); return the hook in use. One restored from a checkpoint is
        kept: it holds what logged input built."""
        self._ingress_factory = factory
        if self.ingress is None:
            self.ingress = factory()
        return self.ingress

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
        to_tail = self._checkpoints.tail.append  # one list for the dispatcher's life
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
                            to_tail(msg)
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
        self._checkpoints.trim(bool(self._calls.waiting))
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
        if self._loop_hidden:  # by handle_run(), for the whole run
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
            cls = type(self.immortal)
            spec = cls.rpc_methods().get(msg.method_id)
            # A handler that may await (an async one, or an ingress call to one) could be
            # in flight at a checkpoint: the tail starts here. A message with no method
            # of its own (an ingress impulse, an unknown id) runs only this class's
            # handlers, through _invoke; when none of them is async, nothing it runs can
            # suspend (a sync handler's calls are never awaited: _current is None), so
            # no task waits at any checkpoint taken before the next async message or
            # upgrade (which takes its own base), and Checkpoints.blob then takes the
            # state as it is, never the base. Taking one anyway would copy the ingress
            # hook's whole key table about once per tail trim.
            if self._checkpoints.base is None and (
                spec.is_async if spec is not None else cls._any_async
            ):
                self._checkpoints.rebase(self._snapshot_now())
            self._checkpoints.tail.append(msg)
            self._dispatch(msg, spec)
            return
        counts, task = self._calls.reply(msg, seq)
        if counts:  # a dropped reply changed nothing: it is not part of the tail
            self._checkpoints.tail.append(msg)
        if task is not None:
            self._step(task, *reply_outcome(task.waiting_on, msg))

    def _dispatch(self, msg: IncomingRpc, spec: MethodSpec | None) -> None:
        if spec is None and msg.method_id < 0 and msg.rpc_type == RpcType.IMPULSE:
            self._from_outside(msg)  # only this binding sends impulses: links refuse them
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

    def _from_outside(self, msg: IncomingRpc) -> None:
        """An impulse to a reserved method id: a call from outside, for the ingress hook,
        which runs it only if its key is new (``hooks.py``)."""
        hook = self.ingress
        if hook is None or msg.method_id != hook.method_id:
            raise BindingError(
                f"an impulse to the reserved method id {msg.method_id} in record "
                f"{self.record_seq}, and no ingress hook takes it: the log holds calls from "
                "outside; start the service with its ingress hook (as ambrosia-py run does)"
            )
        try:
            step = hook.admit(msg.args)
        except ValueError as exc:
            log.error("dropped an ingress impulse: %s", exc)
            return
        if isinstance(step, Steps):  # a batch of calls, logged as one impulse
            for one in step.steps:
                self._ingress_step(one)
        elif step is not None:
            self._ingress_step(step)

    def _ingress_step(self, step: object) -> None:
        """Run a call the hook admitted, or hand its answer to the clients."""
        if isinstance(step, KeyedCall):  # a new key: its outcome is kept under it (_finish)
            spec = type(self.immortal).rpc_methods().get(step.method_id)
            self._invoke(spec, step.method_id, step.args, step)
        else:
            self._answer(step)

    def _answer(self, answer: object) -> None:
        """Answer the clients of an ingress call: an effect, so never while replaying."""
        if self.mode is Mode.PRIMARY and not self._suppress and self.ingress_answer is not None:
            self._effects.append((self.ingress_answer, (answer,)))

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
                self._calls.done(task)
                self._finish(task.spec, task.reply_to, stop.value, None)
                return
            except Exception as exc:
                self._calls.done(task)
                self._finish(task.spec, task.reply_to, None, exc)
                return
            finally:
                self._current = None
            early = self._calls.suspend(task, awaited)
            if early is None:
                return
            value, error = reply_outcome(awaited, early)

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
        if isinstance(reply_to, KeyedCall):  # kept under its key, then answered
            assert self.ingress is not None
            self._answer(self.ingress.complete(reply_to, kind, value))
            return
        sender, call_seq = reply_to
        self._emit(OutgoingReturnValue(sender, kind, self.instance, call_seq, value))

    # -- checkpoints, their restore, and upgrades ----------------------------------------

    def _attach(self, immortal: Immortal) -> Immortal:
        immortal.__dict__[_PRIVATE + "dispatcher"] = self
        return immortal

    def state(self) -> dict[str, Any]:
        """The immortal's state: its attributes, but for the framework's own."""
        return {k: v for k, v in self.immortal.__dict__.items() if not k.startswith(_PRIVATE)}

    def _snapshot_now(self) -> Snapshot:
        return Snapshot(
            class_name(type(self.immortal)),
            type(self.immortal).version,
            cloudpickle.loads(cloudpickle.dumps(self.state())),  # a copy, not a reference
            self._call_seq,
            frozenset(self._attached),
            ingress=self.ingress.copy() if self.ingress is not None else None,
        )

    def checkpoint(self) -> bytes:
        """The checkpoint blob for the state right now (see :mod:`checkpoint`).

        Sealed state files written while pickling it (``files.py``) are made durable
        (their directory fsynced, once) before the blob leaves.
        """
        blob = self._checkpoints.blob(self._snapshot_now, bool(self._calls.waiting))
        sync_written()
        return blob

    def restore(self, blob: wire.Payload) -> None:
        """Load a checkpoint: its state, then its tail replayed with outputs suppressed."""
        cls = type(self.immortal)
        snap = self._checkpoints.restore(blob, cls, cls.version)
        immortal = cls.__new__(cls)
        immortal.__dict__.update(cloudpickle.loads(cloudpickle.dumps(snap.state)))
        self.immortal = self._attach(immortal)
        self._call_seq = snap.call_seq
        self._attached = set(snap.attached)
        self._calls = Outstanding()
        if snap.ingress is not None:  # the checkpoint's hook, whoever registered one
            self.ingress = snap.ingress.copy()
        else:  # taken without one (or before there were hooks): a fresh one, if registered
            factory = self._ingress_factory
            self.ingress = factory() if factory is not None else None
        self.mode = Mode.RECOVERING
        self._suppress = True
        try:
            for msg in tail_messages(snap):
                self._incoming(msg, None)
        finally:
            self._suppress = False

    def _upgrade(self) -> None:
        new = self.upgrade_to
        if new is None:
            raise BindingError("the coordinator asked for an upgrade, but no new code was given")
        if self._calls.waiting:
            raise BindingError(
                f"cannot upgrade with {len(self._calls.waiting)} handlers awaiting replies: "
                "their coroutines belong to the old code"
            )
        old = type(self.immortal)
        state = new.upgrade_state(self.state(), old.version)
        immortal = new.__new__(new)
        immortal.__dict__.update(state)
        self.immortal = self._attach(immortal)
        self.cls = new
        self.upgrade_to = None
        self._checkpoints.rebase(self._snapshot_now())
        log.info("upgraded %s v%d -> %s v%d", old.__name__, old.version, new.__name__, new.version)

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
            self._calls.issue(self._current, future)
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
        """A call from outside, from the ingress while primary: an impulse to its hook's
        reserved method id, with ``envelope`` as the hook reads it back from the log."""
        if self.ingress is None:
            raise BindingError("an ingress call with no ingress hook registered")
        self._send_impulse(self.ingress.method_id, envelope, "an ingress call")

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
