"""Calls handlers made and the replies they await: suspended handlers and their futures.

An ``async def`` handler suspends when it awaits a call whose reply has not come yet
(:class:`Task`). A reply is taken only from the instance the call went to, for a call a
handler is awaiting or made and will await: a reply that comes before its await is kept,
undecoded, until the await (several calls in flight at once, answered out of order).
Anything else is dropped, logged and never decoded. The decision reads only state that
logged input built (the handlers and their calls), so it is the same live, in replay and
when a checkpoint's tail is replayed. Exceptions are decoded with the awaited method's
codec: a json method never unpickles a reply.
"""

from __future__ import annotations

import logging
from collections.abc import Coroutine
from typing import Any

from ..wire import IncomingReturnValue, ReturnType
from . import codec
from .hooks import KeyedCall
from .immortal import CallFuture, MethodSpec

__all__ = ["Outstanding", "ReplyTo", "Task", "reply_outcome"]

log = logging.getLogger("ambrosia_py.binding")
ReplyTo = tuple[str, int] | KeyedCall | None  # an async/await caller, an ingress call, none


class Task:
    """A suspended ``async def`` handler."""

    __slots__ = ("coro", "issued", "reply_to", "spec", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], spec: MethodSpec, reply_to: ReplyTo) -> None:
        self.coro = coro
        self.spec = spec
        self.reply_to = reply_to
        self.waiting_on: CallFuture | None = None
        self.issued: set[int] = set()  # calls it made and has not awaited yet


class Outstanding:
    """The calls of running handlers, by call sequence number: awaited, made and not yet
    awaited, and replies that came before their await."""

    __slots__ = ("early", "issued", "waiting")

    def __init__(self) -> None:
        self.waiting: dict[int, Task] = {}
        self.issued: dict[int, tuple[Task, CallFuture]] = {}
        self.early: dict[int, IncomingReturnValue] = {}

    def issue(self, task: Task, future: CallFuture) -> None:
        """``task`` made the call ``future`` stands for: it may await it later."""
        self.issued[future.call_seq] = (task, future)
        task.issued.add(future.call_seq)

    def suspend(self, task: Task, awaited: CallFuture) -> IncomingReturnValue | None:
        """``task`` awaits ``awaited``: its reply if it came already (the task runs on
        with it), else None and the task waits for it."""
        call_seq = awaited.call_seq
        self.issued.pop(call_seq, None)
        task.issued.discard(call_seq)
        early = self.early.pop(call_seq, None)
        if early is None:
            task.waiting_on = awaited
            self.waiting[call_seq] = task
        return early

    def done(self, task: Task) -> None:
        """A handler finished: calls it made and never awaited are no longer awaitable."""
        for call_seq in sorted(task.issued):
            self.issued.pop(call_seq, None)
            if self.early.pop(call_seq, None) is not None:
                log.info("%s finished without awaiting call %d", task.spec.name, call_seq)

    def reply(self, reply: IncomingReturnValue, seq: int | None) -> tuple[bool, Task | None]:
        """A reply arrived (in record ``seq``; None: a checkpoint's tail): whether it
        counts (it is part of a checkpoint's tail then), and the handler to resume with
        it, if one awaits it now. A reply that does not count is dropped undecoded.

        A pure function of logged input (which handlers await which calls), so replay
        and a checkpoint's tail drop exactly what the live run dropped.
        """
        task = self.waiting.get(reply.call_seq)
        issued = self.issued.get(reply.call_seq)
        if task is None and issued is not None and reply.sender == issued[1].callee:
            # Its handler will await it later: keep it (undecoded) until then.
            del self.issued[reply.call_seq]
            self.early[reply.call_seq] = reply
            return True, None
        if task is None and issued is not None:
            why = f"call {reply.call_seq} went to {issued[1].callee!r}"
        elif task is None or task.waiting_on is None:
            why = f"no handler awaits call {reply.call_seq}"
        elif reply.sender != task.waiting_on.callee:
            why = f"call {reply.call_seq} went to {task.waiting_on.callee!r}"
        else:
            del self.waiting[reply.call_seq]
            return True, task
        log.warning(
            "dropped a return value (%s, %d bytes) from %r for call %d in %s: %s; not decoded",
            reply.return_type.name,
            len(reply.value),
            reply.sender,
            reply.call_seq,
            "the checkpoint's tail" if seq is None else f"record {seq}",
            why,
        )
        return False, None


def reply_outcome(
    awaited: CallFuture | None, reply: IncomingReturnValue
) -> tuple[Any, BaseException | None]:
    """What the ``await`` of ``awaited`` gives: a value, or an exception to raise."""
    assert awaited is not None
    method_codec = awaited.method.codec
    if reply.return_type == ReturnType.EXCEPTION:
        return None, codec.decode_exception(method_codec, reply.value)
    if reply.return_type == ReturnType.NO_VALUE:
        return None, None
    return codec.decode_value(method_codec, reply.value), None
