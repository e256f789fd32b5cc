"""Which impulses are durable yet: the test runner's count of them, sent and logged.

An impulse is input from the outside world: background code (or a test) sends it, the
binding writes it to its coordinator, and the coordinator appends it to a log record.
It is durable once that record is written and ``fdatasync``ed; only then does the
coordinator forward the record to the binding (``coordinator/core/commit.py``), and only
then does the handler run. Before that it is in a socket or the coordinator's memory,
and a crash of either process loses it: nothing replays an input that was never logged.

So the binding knows an impulse is logged when the record holding it comes back.
:class:`CountingDispatcher` counts, for one incarnation, the impulses sent and the
impulses in records handled once primary (replay, before, only brings back impulses of
earlier incarnations; links refuse impulses, so every one after it is this binding's).
One binding writes its impulses to its coordinator in order over one connection, and the
coordinator logs them in that order, so "logged >= sent at some moment" means every
impulse sent until then is durable.

It is the test runner's dispatcher only (and the benches' that use the runner): the
service's own dispatcher (``binding/dispatcher.py``) counts nothing. Even here, records
are looked through only while impulses are outstanding.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .. import wire
from ..binding.dispatcher import Dispatcher, Mode
from ..binding.immortal import MethodSpec

__all__ = ["CountingDispatcher"]

_IMPULSE = wire.RpcType.IMPULSE


def _impulses_in(messages: Iterable[wire.Message]) -> int:
    n = 0
    for msg in messages:
        if type(msg) is wire.IncomingRpc:
            n += msg.rpc_type is _IMPULSE
        elif isinstance(msg, wire.RpcBatch | wire.CountReplayableRpcBatch):
            n += _impulses_in(msg.messages)
    return n


class CountingDispatcher(Dispatcher):
    """A :class:`Dispatcher` that counts this incarnation's impulses, sent and logged.

    Both counters are changed on the binding's event loop only.
    """

    impulses_sent = 0  # sent by this incarnation (refused ones are not counted)
    impulses_logged = 0  # of those, seen in a record the coordinator made durable

    def handle_run(self, run: Sequence[tuple[int, Sequence[wire.Message]]]) -> list[wire.Message]:
        # With none outstanding no record can hold one (they are all ours, and a record
        # comes on this loop after the send it holds was counted): no pass over it, so a
        # bench run through this runner pays a comparison per run of records.
        if self.impulses_logged < self.impulses_sent and self.mode is Mode.PRIMARY:
            self.impulses_logged += sum(_impulses_in(messages) for _, messages in run)
        return super().handle_run(run)

    def impulse(self, spec: MethodSpec, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        super().impulse(spec, args, kwargs)
        self.impulses_sent += 1

    def ingress_impulse(self, envelope: bytes) -> None:
        super().ingress_impulse(envelope)
        self.impulses_sent += 1
