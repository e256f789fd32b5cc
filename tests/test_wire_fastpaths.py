"""The wire's fast paths give the bytes and objects of the general ones.

``encode_messages_parts`` frames outgoing calls and replies inline; ``decode_messages``
builds incoming fork and impulse calls by setting their slots directly.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.wire import (
    Direction,
    IncomingRpc,
    OutgoingReturnValue,
    OutgoingRpc,
    ReturnType,
    RpcType,
)
from ambrosia_py.wire.messages import encode_message_parts, new_outgoing_rpc

from .strategies import messages

_calls = st.builds(
    OutgoingRpc,
    st.sampled_from(["", "b", "x" * 70]),
    st.sampled_from([0, 1, 63, 64, 2**31 - 1, -(2**31)]),
    st.sampled_from([RpcType.FORK, RpcType.IMPULSE]),
    st.binary(max_size=100) | st.sampled_from([b"y" * 5000, b"z" * 9000]),
)


_awaited = st.builds(
    OutgoingRpc,
    st.sampled_from(["", "b", "x" * 70]),
    st.sampled_from([0, 64, 2**31 - 1]),
    st.just(RpcType.ASYNC_AWAIT),
    st.binary(max_size=100) | st.just(b"y" * 5000),
    st.sampled_from(["", "a", "s" * 70]),
    st.sampled_from([0, 1, -1, 63, 64, 2**63 - 1, -(2**63)]),
)
_replies = st.builds(
    OutgoingReturnValue,
    st.sampled_from(["", "b", "x" * 70]),
    st.sampled_from([ReturnType.VALUE, ReturnType.NO_VALUE, ReturnType.EXCEPTION]),
    st.sampled_from(["", "a"]),
    st.sampled_from([0, 1, 2**63 - 1]),
    st.binary(max_size=100) | st.just(b"v" * 9000),
).filter(lambda m: m.return_type is not ReturnType.NO_VALUE or not m.value)


@given(st.lists(_calls | _awaited | _replies | messages(Direction.TO_COORDINATOR), max_size=8))
def test_encode_messages_parts_is_encode_message_parts_of_each(msgs: list[wire.Message]) -> None:
    expected = b"".join(bytes(p) for m in msgs for p in encode_message_parts(m))
    assert b"".join(bytes(p) for p in wire.encode_messages_parts(msgs)) == expected


def test_large_arguments_are_left_as_views() -> None:
    args = memoryview(b"a" * 10_000)
    parts = wire.encode_messages_parts([OutgoingRpc("b", 1, RpcType.FORK, args)])
    assert parts[-1] is args


@given(
    st.lists(
        st.builds(
            IncomingRpc,
            st.integers(-(2**31), 2**31 - 1),
            st.sampled_from([RpcType.FORK, RpcType.IMPULSE]),
            st.binary(max_size=300),
        ),
        max_size=8,
    )
)
def test_decoded_fast_path_calls_equal_constructed_ones(calls: list[IncomingRpc]) -> None:
    data = b"".join(wire.encode_message(c) for c in calls)
    decoded = wire.decode_messages(data, 0, len(data))
    assert decoded == calls
    assert [hash(d) for d in decoded] == [hash(c) for c in calls]
    assert [repr(d) for d in decoded] == [repr(c) for c in calls]


def test_small_calls_own_their_arguments_and_large_ones_are_views() -> None:
    """In a message under 8 KiB (``decode_messages``' rule, in C and in Python alike) a
    call's arguments are bytes of their own, so the record they came in is not kept alive
    by them; above, views of it, not copied."""
    small = IncomingRpc(5, RpcType.FORK, b"s" * 100)
    large = IncomingRpc(5, RpcType.IMPULSE, b"L" * 20_000)
    data = bytearray(wire.encode_message(small) + wire.encode_message(large))
    got = wire.decode_messages(data, 0, len(data))
    assert got == [small, large]
    assert type(got[0].args) is bytes  # type: ignore[union-attr]
    big = got[1].args  # type: ignore[union-attr]
    assert isinstance(big, memoryview) and big.obj is data
    data[-1] = 0  # the view sees the buffer; the copy does not
    assert got[0] == small and bytes(big)[-1] == 0


@given(
    st.text(max_size=20),
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from(list(RpcType)),
    st.binary(max_size=50),
    st.text(max_size=20),
    st.integers(0, 2**63 - 1),
)
def test_new_outgoing_rpc_is_the_class_built_as_usual(
    destination: str, method_id: int, rpc_type: RpcType, args: bytes, sender: str, seq: int
) -> None:
    """The binding's calls are built with their slots set directly (``new_outgoing_rpc``):
    the same object as the frozen class's ``__init__`` makes, down to its bytes."""
    fields = (destination, method_id, rpc_type, args, sender, seq)
    fast, usual = new_outgoing_rpc(*fields), OutgoingRpc(*fields)
    assert type(fast) is OutgoingRpc
    assert fast == usual and hash(fast) == hash(usual) and repr(fast) == repr(usual)
    assert _encoded(fast) == _encoded(usual)


def _encoded(msg: wire.Message) -> bytes | str:
    try:
        return wire.encode_message(msg)
    except ValueError as exc:  # a fork with a sender, say: refused alike
        return str(exc)
