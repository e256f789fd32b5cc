"""The seam calls from outside plug into: the dispatcher's ingress hook.

Calls from ordinary programs (``ambrosia_py/ingress``) enter an immortal as impulses to
one reserved method id (negative: never an ``@rpc`` method's), so the coordinator logs
them before the dispatcher sees them. The dispatcher knows nothing of their format; it
hands each one to the hook registered for that id, which says what to do:

* run a handler, as a :class:`KeyedCall` (the method, its arguments and the call's
  idempotency key): the dispatcher runs it as any call and reports its outcome with
  :meth:`IngressHook.complete`;
* answer the clients waiting on a key (a known key's outcome, a refusal): the dispatcher
  hands the answer to :attr:`~.dispatcher.Dispatcher.ingress_answer` as an effect, so
  only once the record is durable, only while primary and never in replay;
* nothing (a setting, a call already running);
* several of these, in order (:class:`Steps`): the calls of one batch, which the ingress
  logs as one impulse so that one record (and one ``fdatasync``) carries all the calls
  that reached it in one turn of its event loop.

The hook's state is replayed state: built by logged input only, checkpointed beside the
immortal's attributes (``checkpoint.py``, the snapshot's ``ingress`` field) and restored
with them. It is the hook itself that a checkpoint keeps, so a dispatcher restored from
one has the hook it was checkpointed with, whoever made it (``replay``, ``debug``). The
hook is registered where the service is started (``serve(ingress=...)``,
:meth:`~.dispatcher.Dispatcher.register_ingress`); the binding imports nothing of the
ingress.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import attrs

from ..wire import Payload, ReturnType

__all__ = ["AnswerSink", "IngressFactory", "IngressHook", "KeyedCall", "Steps"]

AnswerT_co = TypeVar("AnswerT_co", covariant=True)


@attrs.frozen
class KeyedCall:
    """A call a hook admitted: run ``method_id``'s handler on ``args``; its outcome goes
    back to the hook under ``key`` (:meth:`IngressHook.complete`)."""

    key: bytes
    method_id: int
    args: Payload


@attrs.frozen
class Steps:
    """What one logged impulse of a batch makes: each item a call to run or an answer,
    taken in order as if each came from an impulse of its own (None is not an item: a
    call already running just has no step)."""

    steps: tuple[Any, ...]


class IngressHook(Protocol[AnswerT_co]):
    """What the dispatcher needs of the ingress (the module docstring says how it is used).

    Every method but :meth:`describe` is called with logged input only, in log order, and
    must decide from it and the hook's own state alone: replay calls them again.
    """

    @property
    def method_id(self) -> int:
        """The reserved (negative) method id its calls are logged under, as impulses."""
        ...

    def admit(self, data: Payload) -> KeyedCall | Steps | AnswerT_co | None:
        """A logged impulse to :attr:`method_id`: a call to run, an answer for the clients
        waiting on a key, several of these (:class:`Steps`), or None. Raises
        :class:`ValueError` for a malformed impulse (the dispatcher logs it and goes on:
        there is nothing to run)."""
        ...

    def complete(self, call: KeyedCall, kind: ReturnType, value: bytes) -> AnswerT_co:
        """``call`` (as :meth:`admit` gave it) ended: its outcome, in its method's codec.
        Returns the answer for the clients waiting on its key."""
        ...

    def describe(self, data: Payload) -> tuple[int | None, str]:
        """A logged impulse in words, for reports: the method id it calls (None if it
        calls none) and what it is ("ingress call, key 'order-17'"). Raises
        :class:`ValueError` for a malformed one."""
        ...

    def copy(self) -> IngressHook[AnswerT_co]:
        """An independent copy of the hook's state, for a checkpoint."""
        ...


# What registers a hook: a fresh one, as a service's first start has it.
IngressFactory = Callable[[], IngressHook[Any]]
# What delivers a hook's answers to the outside world: run as an effect.
AnswerSink = Callable[[Any], object]
