"""The dispatcher, sans-IO: records in, messages out."""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import DeterminismError, Dispatcher, MethodIdCollisionError, method_id_for
from ambrosia_py.wire import (
    AttachTo,
    Checkpoint,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    LogRecord,
    Message,
    OutgoingReturnValue,
    OutgoingRpc,
    ReturnType,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
)

P = pickle.HIGHEST_PROTOCOL


class Chain(Immortal):
    """Each ``relay`` asks ``double`` (a self-call) and keeps the answers."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    @rpc
    def double(self, x: int) -> int:
        return 2 * x

    @rpc
    async def relay(self, x: int) -> int:
        y: int = await self.me.double(x)
        self.seen.append(y)
        return y

    @rpc(codec="json")
    def add(self, a: int, b: int) -> None:
        self.seen.append(a + b)

    @rpc
    async def sleepy(self) -> None:
        await asyncio.sleep(0)

    @rpc
    def impulsive(self) -> None:
        self.impulse.double(1)


def args(*a: object) -> bytes:
    return pickle.dumps((a, {}), protocol=P)


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def started(cls: type[Immortal] = Chain) -> Dispatcher:
    d = Dispatcher(cls, "chain")
    out = d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    assert [type(m) for m in out] == [InitialMessage, Checkpoint]
    d.handle(rec(0, InitialMessage(b"")))
    return d


def relay_call(x: int, call_seq: int) -> IncomingRpc:
    spec = Chain.rpc_methods_by_name()["relay"]
    return IncomingRpc(spec.id, RpcType.ASYNC_AWAIT, args(x), "client", call_seq)


def reply(call_seq: int, value: object) -> IncomingReturnValue:
    return IncomingReturnValue(ReturnType.VALUE, "chain", call_seq, pickle.dumps(value, protocol=P))


def test_checkpoint_while_a_handler_awaits_restores_to_the_same_outcome() -> None:
    d = started()
    out = d.handle(rec(1, relay_call(5, 70)))
    (self_call,) = out
    assert isinstance(self_call, OutgoingRpc) and self_call.destination == ""
    assert (self_call.rpc_type, self_call.call_seq, self_call.sender) == (
        RpcType.ASYNC_AWAIT,
        1,
        "chain",
    )
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)

    # Without the checkpoint: the reply resumes the handler, which answers the client.
    (answer,) = d.handle(rec(2, reply(1, 10)))
    # From the checkpoint: a new dispatcher restores it (the awaiting handler is rebuilt by
    # replaying the tail, outputs suppressed), then gets the same reply.
    restored = Dispatcher(Chain, "chain")
    assert restored.handle(rec(-2, Checkpoint(cp.blob))) == []
    assert restored.handle(rec(2, reply(1, 10))) == [answer]
    assert answer == OutgoingReturnValue(
        "client", ReturnType.VALUE, "chain", 70, pickle.dumps(10, protocol=P)
    )
    for disp in (d, restored):
        assert isinstance(disp.immortal, Chain) and disp.immortal.seen == [10]


def test_a_checkpoint_with_nothing_in_flight_has_no_tail() -> None:
    d = started()
    d.handle(rec(1, relay_call(1, 1)))
    d.handle(rec(2, reply(1, 2)))
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    restored = Dispatcher(Chain, "chain")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    assert isinstance(restored.immortal, Chain) and restored.immortal.seen == [2]
    assert restored.checkpoint() == d.checkpoint()  # same state, same call counter


def test_negative_method_ids_are_reserved_for_the_system() -> None:
    """Seed 002, *Incoming RPC*: "Negative method ID's are reserved for system use"."""
    with pytest.raises(ValueError, match="negative ids are reserved"):
        rpc(id=-1)
    assert rpc(id=0x7FFF_FFFF) is not None
    with pytest.raises(ValueError, match=r"outside 0\.\.2"):
        rpc(id=0x8000_0000)


def test_method_ids_are_stable_and_collisions_fail_at_class_definition() -> None:
    assert Chain.rpc_methods_by_name()["double"].id == method_id_for("double")
    assert method_id_for("double") == method_id_for("double") >= 0
    with pytest.raises(MethodIdCollisionError, match="'a' and 'b' both have method id 7"):

        class Clash(Immortal):
            @rpc(id=7)
            def a(self) -> None: ...

            @rpc(id=7)
            def b(self) -> None: ...


def test_json_codec_is_the_node_format() -> None:
    d = started()
    spec = Chain.rpc_methods_by_name()["add"]
    d.handle(rec(1, IncomingRpc(spec.id, RpcType.FORK, b'{"a":2,"b":3}')))
    assert isinstance(d.immortal, Chain) and d.immortal.seen == [5]


def test_json_codec_encodes_outgoing_calls_as_one_object() -> None:
    class Caller(Immortal):
        @rpc
        def go(self) -> None:
            self.proxy("node-service", Chain).add.fork(1, b=2)

    d = started(Caller)
    go = Caller.rpc_methods_by_name()["go"].id
    out = d.handle(rec(1, IncomingRpc(go, RpcType.FORK, args())))
    attach, call = out
    assert attach == AttachTo("node-service") and isinstance(call, OutgoingRpc)
    assert call.destination == "node-service" and call.rpc_type == RpcType.FORK
    assert json.loads(bytes(call.args)) == {"a": 1, "b": 2}
    assert bytes(call.args) == b'{"a":1,"b":2}'


def test_a_handler_touching_the_event_loop_gets_a_determinism_error() -> None:
    async def in_a_loop() -> list[Message]:
        d = started()
        spec = Chain.rpc_methods_by_name()["sleepy"]
        return d.handle(rec(1, IncomingRpc(spec.id, RpcType.ASYNC_AWAIT, args(), "client", 3)))

    (answer,) = asyncio.run(in_a_loop())
    assert isinstance(answer, OutgoingReturnValue) and answer.return_type == ReturnType.EXCEPTION
    exc = pickle.loads(answer.value)
    assert isinstance(exc, DeterminismError) and "do I/O in a @background task" in str(exc)


def test_an_impulse_from_a_handler_is_refused() -> None:
    d = started()
    spec = Chain.rpc_methods_by_name()["impulsive"]
    (answer,) = d.handle(rec(1, IncomingRpc(spec.id, RpcType.ASYNC_AWAIT, args(), "c", 1)))
    assert isinstance(answer, OutgoingReturnValue)
    assert "handlers fork instead" in str(pickle.loads(answer.value))


def test_effects_run_when_primary_and_are_suppressed_in_replay() -> None:
    ran: list[int] = []

    class Eff(Immortal):
        @rpc
        def poke(self, n: int) -> None:
            self.effect(ran.append, n)

    d = started(Eff)
    poke = Eff.rpc_methods_by_name()["poke"].id
    d.handle(rec(1, IncomingRpc(poke, RpcType.FORK, args(1))))
    for fn, a in d.take_effects():
        fn(*a)
    assert ran == [1]
    blob = d.checkpoint()
    replaying = Dispatcher(Eff, "eff")
    replaying.handle(rec(-2, Checkpoint(blob)))
    replaying.handle(rec(2, IncomingRpc(poke, RpcType.FORK, args(2))))
    assert replaying.take_effects() == []  # this message was handled before the crash


def test_a_wrongly_shaped_call_fails_at_the_caller_every_time() -> None:
    class Caller(Immortal):
        @rpc
        def double(self, x: int) -> int:
            return 2 * x

        @rpc
        def go(self, extra: bool) -> None:
            if extra:
                self.me.double.fork(1, 2)  # double takes one argument
            else:
                self.me.double.fork(1)

    d = started(Caller)
    go = Caller.rpc_methods_by_name()["go"].id
    for extra in (False, True, False, True):
        call = IncomingRpc(go, RpcType.ASYNC_AWAIT, args(extra), "c", 1)
        out = d.handle(rec(1, call))
        if extra:
            (answer,) = out
            assert isinstance(answer, OutgoingReturnValue)
            assert answer.return_type == ReturnType.EXCEPTION
            assert isinstance(pickle.loads(answer.value), TypeError)
        else:
            assert [type(m) for m in out] == [OutgoingRpc, OutgoingReturnValue]


class Tally(Immortal):
    def __init__(self) -> None:
        self.got: list[int] = []

    @rpc
    def take(self, x: int) -> None:
        if x < 0:
            raise ValueError(f"negative {x}")
        self.got.append(x)


@pytest.mark.parametrize("rpc_type", [RpcType.FORK, RpcType.IMPULSE])
def test_forks_that_raise_or_do_not_decode_are_logged_and_the_rest_still_run(
    rpc_type: RpcType, caplog: pytest.LogCaptureFixture
) -> None:
    """The inline path for forks and impulses (``Dispatcher.handle``) fails as the
    general one does: a handler that raises, arguments that are not a pickle, and a
    pickle that is not (args, kwargs) each log an error naming the handler; the calls
    around them in the same record still run, and the tail keeps all of them."""
    d = started(Tally)
    take = Tally.rpc_methods_by_name()["take"].id
    calls = [
        IncomingRpc(take, rpc_type, args(1)),
        IncomingRpc(take, rpc_type, args(-2)),
        IncomingRpc(take, rpc_type, b"not a pickle"),
        IncomingRpc(take, rpc_type, pickle.dumps([1, 2, 3], protocol=P)),
        IncomingRpc(take, rpc_type, pickle.dumps(((), {"x": 4}), protocol=P)),
    ]
    with caplog.at_level("ERROR", logger="ambrosia_py"):
        assert d.handle(rec(1, *calls)) == []
    assert isinstance(d.immortal, Tally) and d.immortal.got == [1, 4]
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 3 and all(e.startswith("handler take raised") for e in errors)
    assert "negative -2" in errors[0]
    assert d._checkpoints.tail[-5:] == calls


class Busy(Chain):
    """Chain with a fire-and-forget counter beside its awaiting handler."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    @rpc
    def bump(self, by: int) -> None:
        self.count += by


def test_the_tail_is_dropped_with_nothing_in_flight_and_checkpoints_still_restore() -> None:
    """With nothing in flight the dispatcher forgets the calls it ran (kept, they would
    hold every argument until the next checkpoint); a handler that may suspend takes a
    base first, so a checkpoint taken while it awaits still restores to the same outcome."""
    d = started(Busy)
    bump = Busy.rpc_methods_by_name()["bump"].id
    for seq in range(1, 31):  # 30 records of 100 forks: past the tail's 1,024
        d.handle(rec(seq, *(IncomingRpc(bump, RpcType.FORK, args(1)) for _ in range(100))))
    assert len(d._checkpoints.tail) <= 1024 and d._checkpoints.base is None
    relay = Busy.rpc_methods_by_name()["relay"].id
    (self_call,) = d.handle(rec(31, IncomingRpc(relay, RpcType.ASYNC_AWAIT, args(5), "c", 9)))
    assert (
        isinstance(self_call, OutgoingRpc)
        and d._checkpoints.base is not None
        and len(d._checkpoints.tail) == 1
    )
    d.handle(rec(32, IncomingRpc(bump, RpcType.FORK, args(7))))
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    (answer,) = d.handle(rec(33, reply(self_call.call_seq, 10)))
    restored = Dispatcher(Busy, "chain")
    assert restored.handle(rec(-2, Checkpoint(cp.blob))) == []
    assert restored.handle(rec(33, reply(self_call.call_seq, 10))) == [answer]
    for disp in (d, restored):
        assert isinstance(disp.immortal, Busy)
        assert (disp.immortal.count, disp.immortal.seen) == (3007, [10])
