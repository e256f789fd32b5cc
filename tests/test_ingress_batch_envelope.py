"""Calls logged together as one BATCH impulse, sans-IO: the envelope byte by byte, and the
key table and the dispatcher taking a batch's calls in order, each key's call once."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.binding.dispatcher import Dispatcher
from ambrosia_py.ingress import (
    INGRESS_METHOD_ID,
    IngressProtocolError,
    KeyTable,
    Refusal,
    RefusalReason,
)
from ambrosia_py.ingress.envelope import (
    BatchEnvelope,
    CallEnvelope,
    decode_envelope,
    decode_impulse,
    encode_batch_envelope,
    encode_call_envelope,
)
from ambrosia_py.wire import IncomingRpc, LogRecord, RpcType

from .test_ingress_keys import Ledger, applied, args, handle, spec, started, value


def batch(*calls: tuple[bytes, str, tuple[object, ...]], time_ms: int = 5000) -> IncomingRpc:
    """An ingress impulse of ``calls`` (key, method name, arguments), logged together."""
    envelope = encode_batch_envelope(
        time_ms, [(key, spec(name), args(*a)) for key, name, a in calls]
    )
    return IncomingRpc(INGRESS_METHOD_ID, RpcType.IMPULSE, envelope)


# --- the envelope -------------------------------------------------------------------------


def test_a_batch_byte_by_byte() -> None:
    data = encode_batch_envelope(0x0102030405, [(b"k1", -7, b"AB"), (b"key2", 9, b"")])
    assert data == (
        b"\x03"
        + struct.pack("<QI", 0x0102030405, 2)
        + b"\x02k1"
        + struct.pack("<iI", -7, 2)
        + b"AB"
        + b"\x04key2"
        + struct.pack("<iI", 9, 0)
    )
    assert decode_impulse(data) == BatchEnvelope(
        (CallEnvelope(0x0102030405, b"k1", -7, b"AB"), CallEnvelope(0x0102030405, b"key2", 9, b""))
    )


def test_a_single_call_reads_as_a_batch_of_one_and_the_old_reader_refuses_a_batch() -> None:
    one = encode_call_envelope(77, b"k", 3, b"xyz")
    assert decode_impulse(one) == BatchEnvelope((CallEnvelope(77, b"k", 3, b"xyz"),))
    with pytest.raises(IngressProtocolError, match="decode_impulse reads it"):
        decode_envelope(encode_batch_envelope(77, [(b"k", 3, b"xyz")]))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"\x03" + bytes(6), "ends inside its head"),
        (b"\x03" + struct.pack("<QI", 1, 1), r"call 0 .* ends early"),
        (b"\x03" + struct.pack("<QI", 1, 1) + b"\x00" + struct.pack("<iI", 1, 0), "key is empty"),
        (
            b"\x03" + struct.pack("<QI", 1, 1) + b"\x01k" + struct.pack("<iI", 1, 5) + b"abc",
            "5 bytes",
        ),
        (
            b"\x03" + struct.pack("<QI", 1, 1) + b"\x01k" + struct.pack("<iI", 1, 0) + b"!",
            "1 bytes after",
        ),
        (b"\x03" + struct.pack("<QI", 1, 2) + b"\x01k" + struct.pack("<iI", 1, 0), "call 1 of"),
    ],
)
def test_a_malformed_batch_names_what_and_where(data: bytes, match: str) -> None:
    with pytest.raises(IngressProtocolError, match=match):
        decode_impulse(data)


@given(
    st.integers(0, 2**64 - 1),
    st.lists(
        st.tuples(
            st.binary(min_size=1, max_size=255), st.integers(-(2**31), 2**31 - 1), st.binary()
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_batches_round_trip(time_ms: int, calls: list[tuple[bytes, int, bytes]]) -> None:
    decoded = decode_impulse(encode_batch_envelope(time_ms, calls))
    assert decoded == BatchEnvelope(tuple(CallEnvelope(time_ms, *call) for call in calls))


def test_a_key_too_long_is_not_encoded() -> None:
    with pytest.raises(ValueError, match="256 bytes"):
        encode_batch_envelope(1, [(bytes(256), 1, b"")])


# --- the table and the dispatcher ---------------------------------------------------------


def test_a_batch_runs_each_new_key_once_in_order_and_answers_every_call() -> None:
    d, answers = started()
    handle(d, 1, batch((b"a", "apply", ("a",)), (b"b", "apply", ("b",)), (b"a", "apply", ("a2",))))
    assert applied(d) == ["a", "b"]  # the repeated key ran once, with its first arguments
    apply = spec("apply")
    assert answers == [(b"a", apply, value(1)), (b"b", apply, value(2))]
    # The same keys in a later batch, with a new one: stored outcomes, one run.
    answers.clear()
    handle(d, 2, batch((b"b", "apply", ("b",)), (b"c", "apply", ("c",)), (b"a", "apply", ("a",))))
    assert applied(d) == ["a", "b", "c"]
    assert answers == [(b"b", apply, value(2)), (b"c", apply, value(3)), (b"a", apply, value(1))]


def test_a_key_reused_for_another_method_within_a_batch_is_refused() -> None:
    d, answers = started()
    handle(d, 1, batch((b"k", "apply", ("x",)), (b"k", "nothing", ())))
    assert applied(d) == ["x"]
    (first, second) = answers
    assert first == (b"k", spec("apply"), value(1))
    assert second[:2] == (b"k", spec("nothing"))
    assert isinstance(second[2], Refusal) and second[2].reason is RefusalReason.KEY_REUSED


def test_a_replayed_batch_rebuilds_the_table_and_answers_nobody() -> None:
    d, _ = started()
    handle(d, 1, batch((b"a", "apply", ("a",)), (b"b", "apply", ("b",))))
    blob = d.checkpoint()
    second = batch((b"c", "apply", ("c",)), (b"a", "apply", ("a",)))
    handle(d, 2, second)
    replayed = Dispatcher(Ledger, "ledger", ingress=KeyTable)
    replayed.restore(blob)
    replayed.handle(LogRecord(1, 2, (second,)))
    assert replayed.take_effects() == []  # replay answers nobody
    assert applied(replayed) == applied(d) == ["a", "b", "c"]
    assert replayed.ingress == d.ingress


def test_a_batch_is_described_by_its_keys() -> None:
    envelope = batch(*((f"k{i}".encode(), "apply", (str(i),)) for i in range(5))).args
    assert KeyTable().describe(envelope) == (
        spec("apply"),
        "ingress batch of 5 calls, keys 'k0', 'k1', 'k2' and 2 more",
    )
