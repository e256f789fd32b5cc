"""The idempotency key table and the dispatcher's side of ingress calls, sans-IO: a key's
call runs once, retries get its stored outcome (or wait for it), the table is state
(checkpointed, replayed, rebuilt from a checkpoint's tail), retention by count and by
logged time, and the logged envelope byte by byte."""

from __future__ import annotations

import logging
import pickle
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding.checkpoint import decode_snapshot
from ambrosia_py.binding.dispatcher import Dispatcher
from ambrosia_py.ingress import (
    INGRESS_METHOD_ID,
    IngressProtocolError,
    KeyTable,
    Outcome,
    OutcomeKind,
    Refusal,
    RefusalReason,
)
from ambrosia_py.ingress.envelope import (
    CallEnvelope,
    RetentionEnvelope,
    decode_envelope,
    encode_call_envelope,
    encode_retention_envelope,
)
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


class Unpicklable:
    def __reduce__(self) -> Any:
        raise TypeError("not today")


class Ledger(Immortal):
    def __init__(self) -> None:
        self.applied: list[str] = []

    @rpc
    def apply(self, token: str) -> int:
        self.applied.append(token)
        return len(self.applied)

    @rpc
    def fail(self, why: str) -> None:
        self.applied.append("fail")
        raise ValueError(why)

    @rpc
    def nothing(self) -> None:
        self.applied.append("nothing")

    @rpc
    def weird(self) -> object:
        self.applied.append("weird")
        return Unpicklable()

    @rpc
    async def via_self(self, token: str) -> int:
        n: int = await self.me.apply(token)
        return n * 100


def spec(name: str) -> int:
    return Ledger.rpc_methods_by_name()[name].id


def args(*a: object) -> bytes:
    return pickle.dumps((a, {}), protocol=P)


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def ingress(key: bytes, method: str, *a: object, time_ms: int = 1000) -> IncomingRpc:
    envelope = encode_call_envelope(time_ms, key, spec(method), args(*a))
    return IncomingRpc(INGRESS_METHOD_ID, RpcType.IMPULSE, envelope)


Answers = list[tuple[bytes, int, Outcome | Refusal]]


def started() -> tuple[Dispatcher, Answers]:
    d = Dispatcher(Ledger, "ledger", ingress=KeyTable)
    d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    d.handle(rec(0, InitialMessage(b"")))
    answers: Answers = []
    d.ingress_answer = lambda a: answers.append((a.key, a.method_id, a.answer))
    return d, answers


def keys(d: Dispatcher) -> KeyTable:
    """The dispatcher's key table: its ingress hook."""
    assert isinstance(d.ingress, KeyTable)
    return d.ingress


def handle(d: Dispatcher, seq: int, *messages: Message) -> list[Message]:
    out = d.handle(rec(seq, *messages))
    for fn, fn_args in d.take_effects():
        fn(*fn_args)
    return out


def value(n: object) -> Outcome:
    return Outcome(OutcomeKind.VALUE, pickle.dumps(n, protocol=P))


def applied(d: Dispatcher) -> list[str]:
    assert isinstance(d.immortal, Ledger)
    return d.immortal.applied


# --- the envelope -------------------------------------------------------------------------


def test_the_logged_envelope_byte_by_byte() -> None:
    data = encode_call_envelope(0x0102030405, b"key", -7, b"ARGS")
    assert data == (
        b"\x01" + struct.pack("<Q", 0x0102030405) + b"\x03key" + struct.pack("<i", -7) + b"ARGS"
    )
    assert decode_envelope(data) == CallEnvelope(0x0102030405, b"key", -7, b"ARGS")
    retention = RetentionEnvelope(100, 60_000)
    assert encode_retention_envelope(retention) == b"\x02" + struct.pack("<QQ", 100, 60_000)
    assert decode_envelope(encode_retention_envelope(retention)) == retention
    assert INGRESS_METHOD_ID < 0  # never an @rpc method's id


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "empty ingress impulse"),
        (b"\x07", "unknown kind 7"),
        (b"\x02" + bytes(15), "RETENTION impulse of 16 bytes, not 17"),
        (b"\x01" + bytes(5), "ends inside its head"),
        (b"\x01" + bytes(8) + b"\x00" + bytes(4), "the key is empty"),
        (b"\x01" + bytes(8) + b"\x04abcd" + b"\x01", "the method id is cut"),
    ],
)
def test_malformed_envelopes_name_what(data: bytes, match: str) -> None:
    with pytest.raises(IngressProtocolError, match=match):
        decode_envelope(data)


@given(st.integers(0, 2**64 - 1), st.binary(min_size=1, max_size=255), st.binary())
def test_envelopes_round_trip(time_ms: int, key: bytes, data: bytes) -> None:
    envelope = encode_call_envelope(time_ms, key, spec("apply"), data)
    assert decode_envelope(envelope) == CallEnvelope(time_ms, key, spec("apply"), data)


# --- a key's call runs once ---------------------------------------------------------------


def test_a_retried_key_gets_the_stored_result_without_running_again() -> None:
    d, answers = started()
    handle(d, 1, ingress(b"k1", "apply", "a"))
    handle(d, 2, ingress(b"k2", "apply", "b"), ingress(b"k1", "apply", "a"))
    assert applied(d) == ["a", "b"]
    assert answers == [
        (b"k1", spec("apply"), value(1)),
        (b"k2", spec("apply"), value(2)),
        (b"k1", spec("apply"), value(1)),  # the stored outcome, not a second run
    ]
    assert keys(d).lookup(b"k1", spec("apply")) == value(1)


def test_exceptions_and_none_are_stored_as_outcomes_too() -> None:
    d, answers = started()
    handle(d, 1, ingress(b"e", "fail", "boom"), ingress(b"n", "nothing"))
    handle(d, 2, ingress(b"e", "fail", "boom"), ingress(b"n", "nothing"))
    assert applied(d) == ["fail", "nothing"]
    failed, nothing, failed_again, nothing_again = (a for _, _, a in answers)
    assert isinstance(failed, Outcome) and failed.kind == OutcomeKind.EXCEPTION
    assert repr(pickle.loads(failed.value)) == "ValueError('boom')"
    assert nothing == Outcome(OutcomeKind.NO_VALUE)
    assert (failed_again, nothing_again) == (failed, nothing)


def test_a_result_that_cannot_be_encoded_is_an_exception_naming_the_method() -> None:
    d, answers = started()
    handle(d, 1, ingress(b"w", "weird"))
    ((_, _, outcome),) = answers
    assert isinstance(outcome, Outcome) and outcome.kind == OutcomeKind.EXCEPTION
    assert "the result of weird cannot be encoded" in str(pickle.loads(outcome.value))


def test_a_key_reused_for_another_method_is_refused_and_runs_nothing() -> None:
    d, answers = started()
    handle(d, 1, ingress(b"k", "apply", "a"), ingress(b"k", "nothing"))
    assert applied(d) == ["a"]
    refusal = answers[1][2]
    assert isinstance(refusal, Refusal) and refusal.reason == RefusalReason.KEY_REUSED
    assert f"method id {spec('apply')}, not {spec('nothing')}" in refusal.message


def test_an_unknown_method_is_stored_as_an_unknown_method_error() -> None:
    d, answers = started()
    envelope = encode_call_envelope(1, b"u", 12345, args())
    handle(d, 1, IncomingRpc(INGRESS_METHOD_ID, RpcType.IMPULSE, envelope))
    ((_, method_id, outcome),) = answers
    assert method_id == 12345 and isinstance(outcome, Outcome)
    assert outcome.value.startswith(b'{"error":"UnknownMethodError"')


def test_only_impulses_are_ingress_calls() -> None:
    d, answers = started()
    envelope = encode_call_envelope(1, b"k", spec("apply"), args("x"))
    out = handle(d, 1, IncomingRpc(INGRESS_METHOD_ID, RpcType.ASYNC_AWAIT, envelope, "peer", 3))
    assert answers == [] and applied(d) == []
    ((reply),) = out
    assert b"UnknownMethodError" in bytes(reply.value)  # type: ignore[attr-defined]


def test_a_malformed_logged_impulse_is_dropped_with_a_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    d, _answers = started()
    with caplog.at_level(logging.ERROR, "ambrosia_py.binding"):
        handle(d, 1, IncomingRpc(INGRESS_METHOD_ID, RpcType.IMPULSE, b"\x09junk"))
    assert "dropped an ingress impulse: an ingress impulse of unknown kind 9" in caplog.text
    handle(d, 2, ingress(b"k", "apply", "a"))
    assert applied(d) == ["a"]


# --- calls that wait ----------------------------------------------------------------------


def reply_to_self(call: OutgoingRpc, n: int) -> IncomingReturnValue:
    return IncomingReturnValue(
        ReturnType.VALUE, "ledger", call.call_seq, pickle.dumps(n, protocol=P)
    )


def self_call(call: OutgoingRpc) -> IncomingRpc:
    return IncomingRpc(call.method_id, call.rpc_type, call.args, call.sender, call.call_seq)


def test_a_retry_while_the_call_runs_waits_for_the_same_outcome() -> None:
    d, answers = started()
    (out,) = handle(d, 1, ingress(b"slow", "via_self", "t"))
    assert isinstance(out, OutgoingRpc)
    assert keys(d).lookup(b"slow", spec("via_self")) is Running.RUNNING
    assert handle(d, 2, ingress(b"slow", "via_self", "t")) == []  # waits: nothing runs
    (_ret,) = handle(d, 3, self_call(out))
    assert handle(d, 4, reply_to_self(out, 1)) == []
    assert applied(d) == ["t"]
    assert answers == [(b"slow", spec("via_self"), value(100))]  # one answer for both


def test_the_table_is_checkpointed_with_a_waiting_call_and_rebuilt_from_the_tail() -> None:
    d, _answers = started()
    handle(d, 1, ingress(b"done", "apply", "a"))
    d.handle(rec(-1, TakeCheckpoint()))  # the base: nothing in flight
    (out,) = handle(d, 2, ingress(b"slow", "via_self", "t"))
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    snap = decode_snapshot(cp.blob)
    assert snap.ingress is not None and snap.ingress.lookup(b"done", spec("apply")) == value(1)
    assert snap.ingress.running == 0 and len(snap.tail) == 1  # the running call is the tail

    restored = Dispatcher(Ledger, "ledger")
    restored.handle(rec(-2, Checkpoint(cp.blob)))
    assert keys(restored).lookup(b"slow", spec("via_self")) is Running.RUNNING
    assert keys(restored) == keys(d)
    for disp in (d, restored):
        handle(disp, 3, self_call(out))
        handle(disp, 4, reply_to_self(out, 2))
        assert keys(disp).lookup(b"slow", spec("via_self")) == value(200)
    assert keys(restored) == keys(d)


def test_replay_fills_the_table_but_answers_nobody() -> None:
    d, _answers = started()
    handle(d, 1, ingress(b"a", "apply", "x"))
    (cp,) = d.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    recovering = Dispatcher(Ledger, "ledger")
    heard: Answers = []
    recovering.ingress_answer = lambda a: heard.append((a.key, a.method_id, a.answer))
    recovering.handle(rec(-2, Checkpoint(cp.blob)))
    handle(recovering, 2, ingress(b"b", "apply", "y"))  # replayed: recovering, not primary
    assert heard == [] and recovering.take_effects() == []
    assert keys(recovering).lookup(b"b", spec("apply")) == value(2)


def test_a_format_1_checkpoint_loads_with_an_empty_table() -> None:
    # Written by the binding before the key table existed (format 1).
    blob = bytes.fromhex(
        "414d425059434b010004224d186840af00000000000000e5a900000052800595a4000100f23d8c1e616d"
        "62726f7369615f70792e62696e64696e672e636865636b706f696e74948c08536e617073686f74949394"
        "2981947d94288c0a636c6173735f6e616d65948c0f636f756e7465723a43080032948c0d1f00f0087665"
        "7273696f6e944b008c057374617465947d948c05632600f01f944b07738c0863616c6c5f736571944b03"
        "8c08617474616368656494288c01789491948c047461696c942975622e00000000"
    )
    snap = decode_snapshot(blob)
    assert (snap.state, snap.call_seq, snap.attached, snap.ingress) == (
        {"count": 7},
        3,
        frozenset({"x"}),
        None,
    )


# --- retention ----------------------------------------------------------------------------


def test_retention_by_count_drops_the_oldest_finished_calls() -> None:
    d, _answers = started()
    handle(
        d,
        1,
        IncomingRpc(
            INGRESS_METHOD_ID, RpcType.IMPULSE, encode_retention_envelope(RetentionEnvelope(2, 0))
        ),
    )
    assert keys(d).retention == RetentionEnvelope(2, 0)
    for n, key in enumerate((b"a", b"b", b"c"), start=2):
        handle(d, n, ingress(key, "apply", key.decode()))
    assert keys(d).finished == 2 and keys(d).dropped == 1
    handle(d, 5, ingress(b"a", "apply", "a"))  # dropped: it runs again
    assert applied(d) == ["a", "b", "c", "a"]


def test_retention_by_age_reads_only_logged_time() -> None:
    d, _ = started()
    keys(d).configure(RetentionEnvelope(0, 1000))
    handle(d, 1, ingress(b"old", "apply", "1", time_ms=10_000))
    handle(d, 2, ingress(b"new", "apply", "2", time_ms=10_900))
    handle(d, 3, ingress(b"old", "apply", "1", time_ms=11_000))  # 1000 ms: still kept
    assert applied(d) == ["1", "2"]
    handle(d, 4, ingress(b"x", "apply", "3", time_ms=11_001))  # now "old" is 1001 ms old
    assert keys(d).lookup(b"old", spec("apply")) is None
    assert keys(d).lookup(b"new", spec("apply")) == value(2)
    handle(d, 5, ingress(b"y", "apply", "4", time_ms=5))  # a clock going back changes nothing
    assert keys(d).now_ms == 11_001


def test_running_calls_are_never_dropped() -> None:
    table = KeyTable(keep_count=1, keep_ms=10)
    assert table.begin(b"r", 1, 0) is None
    for n in range(5):
        assert table.begin(bytes([n]), 2, 1000 * n) is None
        table.finish(bytes([n]), 2, Outcome(OutcomeKind.NO_VALUE))
    assert table.lookup(b"r", 1) is Running.RUNNING and table.finished == 1


@given(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d", b"e"]), st.integers(0, 100)),
        max_size=60,
    ),
    st.integers(0, 3),
    st.integers(0, 50),
)
@settings(max_examples=200)
def test_the_table_keeps_what_its_retention_says(
    calls: list[tuple[bytes, int]], keep_count: int, keep_ms: int
) -> None:
    table = KeyTable(keep_count, keep_ms)
    finished_at: dict[bytes, int] = {}
    for key, step in calls:
        time_ms = table.now_ms + step // 10
        found = table.begin(key, 1, time_ms)
        if found is None:
            table.finish(key, 1, value(key))
            finished_at[key] = table.now_ms
        else:
            assert found == value(key)
        if keep_count:
            assert table.finished <= keep_count
        for k, at in finished_at.items():
            kept = table.lookup(k, 1) is not None
            if keep_ms and at < table.now_ms - keep_ms:
                assert not kept
        assert table.copy() == table


def test_the_table_pickles_flat_and_refuses_a_layout_it_does_not_know() -> None:
    table = KeyTable(7, 9000)
    table.begin(b"k", 1, 5)
    table.finish(b"k", 1, value(1))
    table.begin(b"r", 2, 6)
    again = pickle.loads(pickle.dumps(table))
    assert again == table and again.lookup(b"k", 1) == value(1)
    assert again.lookup(b"r", 2) is Running.RUNNING
    state = table.__getstate__()
    assert state[0] == 1 and state[5] == [(b"k", 1, 5, 1, pickle.dumps(1, protocol=P))]
    with pytest.raises(ValueError, match="a key table in layout 9; this binding reads layout 1"):
        KeyTable().__setstate__((9, *state[1:]))
