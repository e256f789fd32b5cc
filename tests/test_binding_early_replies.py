"""Several calls in flight from one handler, answered in any order.

A handler may make several calls before it awaits any of them (``f = a.m(); g = b.m();
await f; await g``). A reply that comes before its ``await`` is kept, undecoded, until
the handler awaits it; a reply for a call the handler never awaits is forgotten when the
handler finishes; a reply from anyone but the callee is still dropped. All of it is a
function of logged input, so live runs, replays and checkpoints agree.
"""

from __future__ import annotations

import logging
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import Dispatcher
from ambrosia_py.binding.checkpoint import decode_snapshot
from ambrosia_py.wire import (
    Checkpoint,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    LogRecord,
    Message,
    OutgoingRpc,
    ReturnType,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
)

P = pickle.HIGHEST_PROTOCOL
SERVERS = ("east", "west", "north")


class Server(Immortal):
    @rpc
    def value(self, x: int) -> int:
        return x


class FanOut(Immortal):
    """``gather`` calls every server at once, then awaits them in the order given."""

    def __init__(self) -> None:
        self.results: list[list[int]] = []
        self.failures: list[str] = []

    @rpc
    async def gather(self, order: list[int]) -> None:
        calls = [self.proxy(name, Server).value(i) for i, name in enumerate(SERVERS)]
        got = []
        for i in order:
            try:
                got.append(await calls[i])
            except ValueError as exc:
                self.failures.append(str(exc))
        self.results.append(got)

    @rpc
    async def first_only(self) -> None:
        a = self.proxy("east", Server).value(1)
        self.proxy("west", Server).value(2)  # never awaited
        self.results.append([await a])


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def started() -> Dispatcher:
    d = Dispatcher(FanOut, "fan")
    d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    d.handle(rec(0, InitialMessage(b"")))
    return d


def fork(method: str, *args: object) -> IncomingRpc:
    spec = FanOut.rpc_methods_by_name()[method]
    return IncomingRpc(spec.id, RpcType.FORK, pickle.dumps((args, {}), protocol=P))


def answer(sender: str, call_seq: int, value: object) -> IncomingReturnValue:
    return IncomingReturnValue(ReturnType.VALUE, sender, call_seq, pickle.dumps(value, protocol=P))


def fan(d: Dispatcher) -> FanOut:
    assert isinstance(d.immortal, FanOut)
    return d.immortal


def test_replies_before_their_await_are_kept_until_it() -> None:
    d = started()
    out = d.handle(rec(1, fork("gather", [0, 1, 2])))
    calls = [m for m in out if isinstance(m, OutgoingRpc)]
    assert [(c.destination, c.call_seq) for c in calls] == [("east", 1), ("west", 2), ("north", 3)]
    # north and west answer first; the handler still awaits east.
    d.handle(rec(2, answer("north", 3, 30)))
    d.handle(rec(3, answer("west", 2, 20)))
    assert fan(d).results == []
    d.handle(rec(4, answer("east", 1, 10)))
    assert fan(d).results == [[10, 20, 30]]


def test_an_early_reply_from_the_wrong_instance_is_dropped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d = started()
    d.handle(rec(1, fork("gather", [0, 1, 2])))
    caplog.set_level(logging.WARNING, "ambrosia_py.binding")
    d.handle(rec(2, answer("mallory", 2, 666)))
    assert "call 2 went to 'west'" in caplog.text and "not decoded" in caplog.text
    for seq, (name, value) in enumerate([("east", 1), ("west", 2), ("north", 3)], 1):
        d.handle(rec(2 + seq, answer(name, seq, value)))
    assert fan(d).results == [[1, 2, 3]]


def test_an_early_exception_is_raised_at_its_await() -> None:
    d = started()
    d.handle(rec(1, fork("gather", [2, 0, 1])))
    boom = pickle.dumps(ValueError("west is down"), protocol=P)
    d.handle(rec(2, IncomingReturnValue(ReturnType.EXCEPTION, "west", 2, boom)))
    d.handle(rec(3, answer("east", 1, 1)))
    d.handle(rec(4, answer("north", 3, 3)))
    assert fan(d).results == [[3, 1]] and fan(d).failures == ["west is down"]


def test_a_reply_never_awaited_is_forgotten_when_its_handler_ends() -> None:
    d = started()
    d.handle(rec(1, fork("first_only")))
    d.handle(rec(2, answer("west", 2, 2)))  # kept: the handler might still await it
    d.handle(rec(3, answer("east", 1, 1)))
    assert fan(d).results == [[1]]
    # Nothing is in flight any more: the checkpoint has no tail, nothing is held.
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint) and decode_snapshot(cp.blob).tail == ()


@settings(max_examples=60, deadline=None)
@given(
    order=st.permutations([0, 1, 2]),
    arrival=st.permutations([0, 1, 2]),
    checkpoint_after=st.integers(0, 3),
)
def test_live_replay_and_checkpoint_agree_in_any_order(
    order: list[int], arrival: list[int], checkpoint_after: int
) -> None:
    """Any await order, any arrival order, a checkpoint anywhere in between: the same
    results, and the ones restored from the checkpoint finish the same way."""
    replies = [rec(2 + k, answer(SERVERS[i], i + 1, 10 * (i + 1))) for k, i in enumerate(arrival)]
    start = [rec(1, fork("gather", order))]
    live = started()
    for r in start + replies[:checkpoint_after]:
        live.handle(r)
    (cp,) = live.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    for r in replies[checkpoint_after:]:
        live.handle(r)
    expected = [[10 * (i + 1) for i in order]]
    assert fan(live).results == expected

    replayed = started()
    for r in start + replies:
        replayed.handle(r)
    restored = Dispatcher(FanOut, "fan")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    for r in replies[checkpoint_after:]:
        restored.handle(r)
    assert fan(replayed).results == expected
    assert fan(restored).results == expected
