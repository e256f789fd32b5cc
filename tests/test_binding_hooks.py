"""The dispatcher's ingress hook (binding/hooks.py), sans-IO: the binding runs calls from
outside through whatever hook is registered, checkpoints it, brings it back from a
checkpoint (one the earlier binding wrote included), and stops at a logged call from
outside that no hook takes. The binding imports nothing of the ingress."""

from __future__ import annotations

import ast
import pickle
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import BindingError
from ambrosia_py.binding.checkpoint import decode_snapshot
from ambrosia_py.binding.dispatcher import Dispatcher
from ambrosia_py.binding.hooks import KeyedCall
from ambrosia_py.ingress import INGRESS_METHOD_ID, KeyTable, Outcome, OutcomeKind
from ambrosia_py.ingress.envelope import RetentionEnvelope, encode_call_envelope
from ambrosia_py.ingress.keys import Running
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
BINDING = Path(__file__).resolve().parents[1] / "ambrosia_py" / "binding"


class Tally(Immortal):
    """No async handler: nothing it runs can be suspended at a checkpoint."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    @rpc
    def apply(self, what: str) -> int:
        self.applied.append(what)
        return len(self.applied)


class Ledger(Tally):
    @rpc
    async def via_self(self, what: str) -> int:
        return 100 * await self.me.apply(what)


APPLY = Ledger.rpc_methods_by_name()["apply"].id
VIA_SELF = Ledger.rpc_methods_by_name()["via_self"].id


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def args(*a: object) -> bytes:
    return pickle.dumps((a, {}), protocol=P)


def started(d: Dispatcher) -> Dispatcher:
    d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    d.handle(rec(0, InitialMessage(b"")))
    return d


def test_the_binding_imports_nothing_of_the_ingress() -> None:
    for path in sorted(BINDING.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):
                module = node.module or ""
                assert "ingress" not in module.split("."), f"{path.name} imports {module}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    assert ".ingress" not in alias.name, f"{path.name} imports {alias.name}"


def test_a_logged_call_from_outside_with_no_hook_stops_the_binding_naming_it() -> None:
    d = started(Dispatcher(Ledger, "ledger"))
    envelope = encode_call_envelope(1000, b"k", APPLY, args("a"))
    with pytest.raises(BindingError, match=rf"reserved method id {INGRESS_METHOD_ID} in record 7"):
        d.handle(rec(7, IncomingRpc(INGRESS_METHOD_ID, RpcType.IMPULSE, envelope)))
    assert isinstance(d.immortal, Ledger) and d.immortal.applied == []


# A checkpoint the binding wrote before the hook existed (its key table then lived in the
# dispatcher): the primary's checkpoint as base, and as tail a RETENTION impulse (keep 50
# calls, 60,000 ms), key b"done" calling apply("a") at 1000 ms, and key b"slow" calling
# via_self("b") at 2000 ms, suspended on its self-call (call 1) to apply("b").
EARLIER_CHECKPOINT = bytes.fromhex(
    "414d425059434b020004224d1868408d01000000000000ae57010000618005958201000100f33f8c1e616d62"
    "726f7369615f70792e62696e64696e672e636865636b706f696e74948c08536e617073686f74949394298194"
    "7d94288c0a636c6173735f6e616d65948c1f74657374732e746573745f4000f2015f686f6f6b733a4c656467"
    "6572948c0d2f00f01c76657273696f6e944b008c057374617465947d948c076170706c696564945d94738c08"
    "63616c6c5f7365712400f111086174746163686564942891948c047461696c9443193000008db9ca04020232"
    "bf0040000060ea06006300009443305e1c003001e8031200f000000004646f6e6516ff31668005950b1100e8"
    "0000008c01619485947d9486942e330021d0071e00a90004736c6f773d01291c330015623300e887948c0769"
    "6e6772657373948c183c01031600f2012e6b657973948c084b65795461626c653601f00c284b014aa0860100"
    "4a005c26054b004b005d947d9474946275622e00000000"
)


def test_a_checkpoint_the_earlier_binding_wrote_brings_its_key_table_back() -> None:
    d = Dispatcher(Ledger, "ledger")  # nothing registered: the checkpoint holds the table
    d.handle(rec(-2, Checkpoint(EARLIER_CHECKPOINT)))
    table = d.ingress
    assert isinstance(table, KeyTable)
    assert table.retention == RetentionEnvelope(50, 60_000) and table.now_ms == 2000
    assert table.lookup(b"done", APPLY) == Outcome(OutcomeKind.VALUE, pickle.dumps(1, protocol=P))
    assert table.lookup(b"slow", VIA_SELF) is Running.RUNNING
    assert isinstance(d.immortal, Ledger) and d.immortal.applied == ["a"]
    # The log goes on: the self-call, then its reply, and the slow call's outcome is kept.
    d.handle(rec(4, IncomingRpc(APPLY, RpcType.ASYNC_AWAIT, args("b"), "ledger", 1)))
    d.handle(rec(5, IncomingReturnValue(ReturnType.VALUE, "ledger", 1, pickle.dumps(2))))
    assert table.lookup(b"slow", VIA_SELF) == Outcome(
        OutcomeKind.VALUE, pickle.dumps(200, protocol=P)
    )
    assert table.running == 0 and table.finished == 2


def test_registering_keeps_a_restored_table_and_a_checkpoint_without_one_gets_a_fresh_one() -> None:
    d = Dispatcher(Ledger, "ledger")
    d.handle(rec(-2, Checkpoint(EARLIER_CHECKPOINT)))
    restored = d.ingress
    assert d.register_ingress(KeyTable) is restored  # built by logged input: kept

    bare = started(Dispatcher(Ledger, "ledger"))  # no hook: its checkpoints hold none
    (cp,) = bare.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint) and decode_snapshot(cp.blob).ingress is None
    registered = Dispatcher(Ledger, "ledger", ingress=KeyTable)
    registered.handle(rec(-2, Checkpoint(cp.blob)))
    assert isinstance(registered.ingress, KeyTable) and registered.ingress == KeyTable()
    unregistered = Dispatcher(Ledger, "ledger")
    unregistered.handle(rec(-2, Checkpoint(cp.blob)))
    assert unregistered.ingress is None


class FirstByteKeys:
    """A hook of another kind, to show the seam is the protocol, not the key table: the
    first byte of a logged impulse is the key, the rest ``apply``'s arguments."""

    method_id = -7

    def __init__(self) -> None:
        self.outcomes: dict[bytes, tuple[int, bytes]] = {}

    def admit(self, data: Any) -> KeyedCall | tuple[bytes, tuple[int, bytes]] | None:
        key, rest = bytes(data[:1]), bytes(data[1:])
        if key in self.outcomes:
            return (key, self.outcomes[key])
        return KeyedCall(key, APPLY, rest)

    def complete(
        self, call: KeyedCall, kind: ReturnType, value: bytes
    ) -> tuple[bytes, tuple[int, bytes]]:
        self.outcomes[call.key] = (int(kind), value)
        return (call.key, self.outcomes[call.key])

    def describe(self, data: Any) -> tuple[int | None, str]:
        return APPLY, f"key {bytes(data[:1])!r}"

    def copy(self) -> FirstByteKeys:
        other = FirstByteKeys()
        other.outcomes = dict(self.outcomes)
        return other


def test_any_hook_runs_calls_once_answers_as_effects_and_is_checkpointed() -> None:
    d = started(Dispatcher(Ledger, "ledger", ingress=FirstByteKeys))
    answers: list[object] = []
    d.ingress_answer = answers.append
    impulse = IncomingRpc(-7, RpcType.IMPULSE, b"x" + args("a"))
    for seq in (1, 2):  # the second is a retry: it is answered, not run
        d.handle(rec(seq, impulse))
        for fn, fn_args in d.take_effects():
            fn(*fn_args)
    one = (int(ReturnType.VALUE), pickle.dumps(1, protocol=P))
    assert answers == [(b"x", one), (b"x", one)]
    assert isinstance(d.immortal, Ledger) and d.immortal.applied == ["a"]

    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    restored = Dispatcher(Ledger, "ledger")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    assert isinstance(restored.ingress, FirstByteKeys)
    assert restored.ingress is not d.ingress and restored.ingress.outcomes == {b"x": one}


def test_an_ingress_call_is_sent_under_the_hooks_method_id() -> None:
    sent: list[Message] = []
    d = started(Dispatcher(Ledger, "ledger", ingress=FirstByteKeys))
    d.live_send = sent.append
    d.ingress_impulse(b"x" + args("a"))
    assert sent == [OutgoingRpc("", -7, RpcType.IMPULSE, b"x" + args("a"))]
    with pytest.raises(BindingError, match="no ingress hook"):
        started(Dispatcher(Ledger, "ledger")).ingress_impulse(b"")


class CountedKeys(FirstByteKeys):
    """FirstByteKeys that counts its copies; key ``s`` runs ``via_self`` (Ledger's
    async handler), every other key ``apply``."""

    copies = 0

    def admit(self, data: Any) -> KeyedCall | tuple[bytes, tuple[int, bytes]] | None:
        step = super().admit(data)
        if isinstance(step, KeyedCall) and step.key == b"s":
            return KeyedCall(step.key, VIA_SELF, step.args)
        return step

    def copy(self) -> CountedKeys:
        CountedKeys.copies += 1
        other = CountedKeys()
        other.outcomes = dict(self.outcomes)
        return other


def test_without_async_handlers_calls_from_outside_never_copy_the_hook() -> None:
    """A checkpoint's base (the hook's copy among it) is only read back while a handler
    waits; a class with no async handler never has one waiting, so the binding takes
    none between checkpoints however long the tail grows."""
    d = started(Dispatcher(Tally, "tally", ingress=CountedKeys))
    CountedKeys.copies = 0
    for seq in range(1, 3001):  # past the tail's trim, several times over
        key = bytes([seq % 100])  # never b"s"
        d.handle(rec(seq, IncomingRpc(-7, RpcType.IMPULSE, key + args(str(seq)))))
    assert CountedKeys.copies == 0
    assert isinstance(d.immortal, Tally) and len(d.immortal.applied) == 100  # the rest retried

    (cp,) = d.handle(rec(3001, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint) and CountedKeys.copies == 1  # the checkpoint's own
    restored = Dispatcher(Tally, "tally")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    assert isinstance(restored.ingress, CountedKeys) and isinstance(restored.immortal, Tally)
    assert restored.ingress.outcomes == d.ingress.outcomes  # type: ignore[union-attr]
    assert restored.immortal.applied == d.immortal.applied


def test_with_an_async_handler_a_call_from_outside_after_a_trim_is_checkpointed_waiting() -> None:
    """Once the tail was trimmed (no base), a call from outside to an async handler
    starts a new base: a checkpoint taken while it waits brings it back waiting."""
    d = started(Dispatcher(Ledger, "ledger", ingress=CountedKeys))
    answers: list[object] = []
    d.ingress_answer = answers.append
    CountedKeys.copies = 0
    for seq in range(1, 1100):  # the tail passes its trim with nothing in flight
        d.handle(rec(seq, IncomingRpc(-7, RpcType.IMPULSE, b"x" + args("a"))))
    assert CountedKeys.copies == 1  # the new base, at the first call after the trim
    (out,) = d.handle(rec(1100, IncomingRpc(-7, RpcType.IMPULSE, b"s" + args("b"))))
    assert isinstance(out, OutgoingRpc) and out.method_id == APPLY
    (cp,) = d.handle(rec(1101, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    restored = Dispatcher(Ledger, "ledger")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    for disp in (d, restored):  # the self-call and its reply finish the waiting call
        disp.handle(rec(1102, IncomingRpc(APPLY, RpcType.ASYNC_AWAIT, args("b"), "ledger", 1)))
        disp.handle(rec(1103, IncomingReturnValue(ReturnType.VALUE, "ledger", 1, pickle.dumps(2))))
        hook = disp.ingress
        assert isinstance(hook, CountedKeys)
        assert hook.outcomes[b"s"] == (int(ReturnType.VALUE), pickle.dumps(200, protocol=P))
        assert isinstance(disp.immortal, Ledger) and disp.immortal.applied == ["a", "b"]
