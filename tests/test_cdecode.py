"""The C accelerator ``ambrosia_py.wire._cdecode`` gives the results of its pure-Python
references, the general paths.

``decode_messages`` (its runs of incoming calls and replies in C, everything else in
Python) against ``_decode_messages_py`` (message by message), and
``routing.count_replayable`` against ``_count_replayable_py`` (decoding, then counting):
on bodies of encoded messages of every kind, hand-made edge cases of the C loops'
conditions, and garbage, truncations and flipped bytes, they return equal results or
raise the same error (type, message, offset).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py import accel, wire
from ambrosia_py.coordinator.core import routing
from ambrosia_py.wire import (
    Direction,
    IncomingReturnValue,
    IncomingRpc,
    ReturnType,
    RpcType,
    decoding,
)

from .accel_state import PURE, built, skip_unless_built
from .strategies import messages

_NAME = "ambrosia_py.wire._cdecode"


def test_the_accelerator_is_used_when_built() -> None:
    """Without this, the comparisons below could compare the pure code with itself."""
    if PURE:
        assert accel.load(_NAME) is None
        assert decoding._decode_calls is None
        assert routing._c_count_replayable is None
        return
    skip_unless_built(_NAME)
    module = accel.load(_NAME)
    assert module is not None
    assert decoding._decode_calls is module.decode_calls
    assert routing._c_count_replayable is module.count_replayable
    # ... and it does decode the calls of its loop itself.
    body = wire.encode_message(IncomingRpc(7, RpcType.FORK, b"abc")) * 2
    out: list[wire.Message] = []
    assert module.decode_calls(memoryview(body), 0, len(body), out) == len(body)
    assert out == [IncomingRpc(7, RpcType.FORK, b"abc")] * 2
    assert module.count_replayable(body) == 2
    # ... and an awaited call, its sender and sequence number with it.
    awaited = IncomingRpc(-3, RpcType.ASYNC_AWAIT, b"xyz", "caller-1", -(2**62))
    body = wire.encode_message(awaited)
    out = []
    assert module.decode_calls(memoryview(body), 0, len(body), out) == len(body)
    assert out == [awaited] and type(out[0].args) is bytes
    # ... and a reply.
    reply = IncomingReturnValue(ReturnType.VALUE, "callee", 2**40, b"result")
    body = wire.encode_message(reply)
    out = []
    assert module.decode_calls(memoryview(body), 0, len(body), out) == len(body)
    assert out == [reply] and type(out[0].value) is bytes


_needs_c = pytest.mark.skipif(
    PURE or not built(_NAME), reason="the C accelerator is not built or turned off"
)


# --- building bodies ----------------------------------------------------------------------

# Method ids at the edges of each varint width (zig-zag: 1 to 5 bytes) and of 32 bits.
_EDGE_IDS = [0, -1, 1, 63, -64, 64, -65, 8191, -8192, 8192, 2**20 - 1, 2**20, 2**27, -(2**27)]
_EDGE_IDS += [2**27 - 1, 606343346, 2**31 - 1, -(2**31), -(2**31) + 1]
_method_ids = st.sampled_from(_EDGE_IDS) | st.integers(-(2**31), 2**31 - 1)
# Arguments up to 300 bytes (sizes of one and two varint bytes), and some about and over
# 8 KiB (three size bytes from 8,192 on: the general path).
_args = st.binary(max_size=300) | st.sampled_from([b"", b"q" * 8185, b"r" * 8200, b"s" * 17000])


@st.composite
def _incoming_rpcs(draw: st.DrawFn) -> IncomingRpc:
    rpc_type = draw(st.sampled_from(RpcType))
    sender, seq = "", 0
    if rpc_type is RpcType.ASYNC_AWAIT:
        sender = draw(st.text(max_size=12))
        seq = draw(st.integers(-(2**63), 2**63 - 1))
    return IncomingRpc(draw(_method_ids), rpc_type, draw(_args), sender, seq)


@st.composite
def _return_values(draw: st.DrawFn) -> IncomingReturnValue:
    return_type = draw(st.sampled_from([r for r in ReturnType if r is not ReturnType.CALL]))
    value = b"" if return_type is ReturnType.NO_VALUE else draw(st.binary(max_size=300))
    sender = draw(st.text(max_size=12))
    return IncomingReturnValue(return_type, sender, draw(st.integers(-(2**63), 2**63 - 1)), value)


def _framed(body: bytes) -> bytes:
    return wire.encode_zigzag_int(len(body)) + body


# Hand-made messages on the edges of the C loops' conditions: non-canonical varints,
# method ids of five and six bytes and beyond 32 bits, odd and small sizes, every RPC type
# byte, an RPC that is a return value.
_EDGE_MESSAGES = [
    b"\x88\x00" + b"\x00\x00\x02\x01",  # size 4 in two bytes (non-canonical)
    _framed(b"\x00\x00\x80\x00\x02"),  # method id 0 in two bytes (non-canonical)
    _framed(b"\x00\x00\xff\xff\xff\xff\x0f\x01"),  # id 0xffffffff: five bytes, the most
    _framed(b"\x00\x00\xff\xff\xff\xff\x1f\x01"),  # 33 bits: the general path raises
    _framed(b"\x00\x00\xff\xff\xff\xff\x10\x02"),  # 33 bits, the low 32 zero... almost
    _framed(b"\x00\x00\x80\x80\x80\x80\x80\x00\x01"),  # six bytes, value 0
    _framed(b"\x00\x00\x80\x80\x80\x80\x00\x01"),  # five bytes, value 0
    _framed(b"\x00\x00\xff\xff\xff\xff\x0f"),  # no RPC type byte
    _framed(b"\x00\x00\xff\xff"),  # the method id runs to the message end
    _framed(b"\x00\x00\x02"),  # size 3: too short for the C loop
    _framed(b"\x00\x00"),  # size 2
    b"\x07" + b"\x00\x00\x02\x01",  # odd size (negative)
    b"\x09" + b"\x00\x00\x02\x01",  # odd size, as if 4
    b"\x8b\x00" + b"\x00\x00\x02\x01\x00",  # odd size in two bytes
    b"\x90\x81\x00" + b"\x00\x02\x01" + b"w" * 8300,  # three size bytes, the last 0
    _framed(b"\x00\x00\x02\x00"),  # async/await without a sender
    _framed(b"\x00\x00\x02\x00\x02ab\x04"),  # async/await with one
    _framed(b"\x00\x00\x02\x03"),  # RPC type 3
    _framed(b"\x00\x00\x02\xff"),  # RPC type 255
    _framed(b"\x00\x01\x00\x00"),  # a return value, truncated
    _framed(b"\x00\x01\x02ab\x04\x02zz"),  # a return value
    _framed(b"\x01\x00\x02\x01"),  # not an RPC
    b"\x80\x80\x01" + b"\x00\x00\x02\x01" + b"z" * 8188,  # three size bytes
    b"\xfe\x7f" + b"\x00\x00\x02\x01" + b"y" * 8187,  # the largest two-byte size
    b"\x08" + b"\x00\x00\x02",  # runs past the end
    b"\x80",  # a size cut short
    b"\x00",  # size 0
]
assert len(_EDGE_MESSAGES[2]) == 9 and _EDGE_MESSAGES[2][0] == 16


def _awaited(name: bytes, seq: bytes, args: bytes = b"a") -> bytes:
    """An incoming async/await call, method 1, from the raw bytes of its sender's name
    and sequence number (the name's length as its varint)."""
    return _framed(b"\x00\x00\x02\x00" + wire.encode_zigzag_int(len(name)) + name + seq + args)


# The async/await call's own edges: the C loop takes a name of at most 63 ASCII bytes
# (one length byte) and a sequence number of at most nine bytes.
_SEQ9 = b"\xff" * 8 + b"\x7f"  # the largest nine-byte varint: 2**63 - 1, zig-zag
_EDGE_MESSAGES += [
    _awaited(b"", b"\x00"),  # no name, sequence 0
    _awaited(b"n" * 63, b"\x02"),  # the longest name of one length byte
    _awaited(b"n" * 64, b"\x02"),  # two length bytes: the general path
    _awaited("é".encode(), b"\x02"),  # not ASCII, valid UTF-8: the general path
    _awaited(b"\xff\xfe", b"\x02"),  # not UTF-8: the general path raises
    _awaited(b"ab", _SEQ9),  # the longest sequence number the C loop takes
    _awaited(b"ab", b"\x80" * 9 + b"\x01"),  # ten bytes: the general path
    _awaited(b"ab", b"\xff" * 10 + b"\x01"),  # eleven: the general path raises
    _awaited(b"ab", b"\x80\x80", b""),  # the sequence number runs to the end
    _awaited(b"ab", b"", b""),  # no sequence number
    _framed(b"\x00\x00\x02\x00\x03ab\x02"),  # an odd name length (negative)
    _framed(b"\x00\x00\x02\x00\x0cab\x02"),  # a name that runs past the end
    _framed(b"\x00\x00\x02\x00"),  # the name's length missing
    _framed(b"\x00\x00\x02\x00\x80\x01" + b"n" * 64 + b"\x02"),  # 64 as two bytes
]


def _reply(kind: int, name: bytes, seq: bytes, rest: bytes) -> bytes:
    """A return value of ``kind`` from the raw bytes of its sender's name, sequence number
    and what follows (a value's length and bytes)."""
    return _framed(b"\x00" + bytes([kind]) + wire.encode_zigzag_int(len(name)) + name + seq + rest)


# Return values: the C loop takes the caller as for a call, then a value's length in one
# or two varint bytes and exactly that many bytes.
_EDGE_MESSAGES += [
    _reply(1, b"ab", b"\x02", b"\x06xyz"),  # a value
    _reply(3, b"ab", b"\x02", b"\x06xyz"),  # an exception
    _reply(2, b"ab", b"\x02", b""),  # no value
    _reply(2, b"ab", b"\x02", b"\x00"),  # no value, a byte after: the general path raises
    _reply(1, b"ab", b"\x02", b"\x00"),  # an empty value
    _reply(1, b"ab", b"\x02", b"\x80\x00"),  # an empty value, its length in two bytes
    _reply(1, b"ab", b"\x02", b"\xc8\x01" + b"v" * 100),  # a length of two bytes
    _reply(1, b"ab", b"\x02", b"\x80\x80\x00"),  # a length of three bytes: general
    _reply(1, b"ab", b"\x02", b"\x06xy"),  # the value runs past the end
    _reply(1, b"ab", b"\x02", b"\x06xyzw"),  # a byte after the value
    _reply(1, b"ab", b"\x02", b"\x07xyz"),  # an odd length (negative)
    _reply(1, b"ab", b"\x02", b""),  # the length missing
    _reply(1, "é".encode(), b"\x02", b"\x02q"),  # not ASCII: the general path
    _reply(1, b"n" * 63, _SEQ9, b"\x02q"),  # the longest name and sequence number taken
    _reply(1, b"ab", b"\x80" * 9 + b"\x01", b"\x02q"),  # ten bytes: general
    _reply(4, b"ab", b"\x02", b"\x02q"),  # kind 4: the general path raises
]
_edge_messages = st.sampled_from(_EDGE_MESSAGES)
_messages = st.one_of(
    _incoming_rpcs().map(wire.encode_message),
    _return_values().map(wire.encode_message),
    messages(Direction.TO_BINDING).map(wire.encode_message),
    _edge_messages,
    st.binary(min_size=1, max_size=12),  # garbage
)


@st.composite
def _damage(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` as it is, cut short, with bytes flipped, or with bytes inserted."""
    how = draw(st.sampled_from(["none", "none", "truncate", "flip", "insert"]))
    if not body or how == "none":
        return body
    at = draw(st.integers(0, len(body) - 1))
    if how == "truncate":
        return body[:at]
    if how == "flip":
        data = bytearray(body)
        for _ in range(draw(st.integers(1, 3))):
            i = draw(st.integers(0, len(data) - 1))
            data[i] = draw(st.integers(0, 255))
        return bytes(data)
    return body[:at] + draw(st.binary(min_size=1, max_size=4)) + body[at:]


@st.composite
def _bodies(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(_messages, max_size=10))
    return bytes(draw(_damage(b"".join(parts))))


@st.composite
def _buffers(draw: st.DrawFn, body: bytes) -> wire.Payload:
    """The body as bytes, a bytearray, a memoryview, or a view into a larger buffer."""
    kind = draw(st.sampled_from(["bytes", "bytearray", "memoryview", "inner"]))
    if kind == "bytearray":
        return bytearray(body)
    if kind == "memoryview":
        return memoryview(body)
    if kind == "inner":
        head = draw(st.binary(max_size=5))
        return memoryview(head + body + draw(st.binary(max_size=5)))[len(head) :][: len(body)]
    return body


# --- comparing ----------------------------------------------------------------------------


def _outcome(f: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", f(*args)
    except Exception as exc:
        return "error", (type(exc), str(exc), getattr(exc, "offset", None))


def _same_messages(got: list[wire.Message], want: list[wire.Message]) -> None:
    assert got == want
    assert [type(m) for m in got] == [type(m) for m in want]
    assert [repr(m) for m in got] == [repr(m) for m in want]
    for g, w in zip(got, want, strict=True):
        if isinstance(w, IncomingRpc):
            assert isinstance(g, IncomingRpc)
            # Small calls' arguments are copies, larger ones views of the caller's buffer,
            # as the reference makes them.
            assert type(g.args) is type(w.args)
            if isinstance(w.args, memoryview):
                assert isinstance(g.args, memoryview) and g.args.obj is w.args.obj
            else:
                assert type(w.args) is bytes
            assert type(g.method_id) is int and type(g.call_seq) is int
            assert type(g.sender) is str
            assert g.rpc_type is w.rpc_type
        if isinstance(w, IncomingReturnValue):
            assert isinstance(g, IncomingReturnValue)
            assert type(g.value) is type(w.value) and type(g.call_seq) is int
            assert type(g.sender) is str and g.return_type is w.return_type


def _check_decode(buf: Any, pos: int, end: int, direction: Direction) -> None:
    got = _outcome(wire.decode_messages, buf, pos, end, direction)
    want = _outcome(decoding._decode_messages_py, buf, pos, end, direction)
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        _same_messages(got[1], want[1])
    else:
        assert got[1] == want[1]


def _check_count(body: Any, start: int = 0) -> None:
    got = _outcome(routing.count_replayable, body, start)
    assert got == _outcome(routing._count_replayable_py, body, start)


@given(_bodies(), st.data())
def test_decode_messages_matches_its_reference(body: bytes, data: Any) -> None:
    buf = data.draw(_buffers(body))
    _check_decode(buf, 0, len(body), Direction.TO_BINDING)
    # A window of the body, an end past the buffer, the other direction.
    pos = data.draw(st.integers(0, len(body)))
    end = data.draw(st.integers(pos, len(body) + 2))
    _check_decode(buf, pos, end, Direction.TO_BINDING)
    _check_decode(buf, pos, end, data.draw(st.sampled_from(Direction)))


def _general_only(buf: Any, pos: int, end: int) -> list[wire.Message]:
    """The body decoded message by message by ``decode_message``: no C at all."""
    mv = memoryview(buf)
    if end > len(mv):
        raise wire.TruncatedInputError(
            f"messages end at {end}, past the {len(mv)}-byte buffer", offset=pos
        )
    out = []
    while pos < end:
        msg, pos = decoding.decode_message(mv, pos, Direction.TO_BINDING, end=end)
        out.append(msg)
    return out


@given(st.one_of(_bodies(), st.lists(_edge_messages, max_size=6).map(b"".join)))
def test_the_reference_decodes_as_decode_message(body: bytes) -> None:
    """The reference is ``decode_message`` run over the body: the same messages (payloads
    equal, copies where ``decode_message`` gives views) and the same errors."""
    got = _outcome(decoding._decode_messages_py, body, 0, len(body), Direction.TO_BINDING)
    assert got == _outcome(_general_only, body, 0, len(body))


@given(st.lists(_incoming_rpcs() | _return_values(), max_size=10))
def test_valid_bodies_decode_to_their_messages(msgs: list[wire.Message]) -> None:
    body = b"".join(wire.encode_message(m) for m in msgs)
    assert wire.decode_messages(body, 0, len(body)) == msgs
    _check_decode(body, 0, len(body), Direction.TO_BINDING)


@given(st.lists(_edge_messages, max_size=6))
def test_fast_path_edges_match(parts: list[bytes]) -> None:
    body = b"".join(parts)
    _check_decode(body, 0, len(body), Direction.TO_BINDING)
    _check_count(body)


@given(_bodies(), st.data())
def test_count_replayable_matches_its_reference(body: bytes, data: Any) -> None:
    _check_count(body)
    _check_count(data.draw(_buffers(body)))
    # From a start inside a longer buffer: what a record's header is followed by.
    head = data.draw(st.binary(max_size=30))
    _check_count(head + body, len(head))
    assert routing.count_replayable(head + body, len(head)) == routing._count_replayable_py(body)


@given(st.lists(_incoming_rpcs(), max_size=10))
def test_count_replayable_counts_forks(calls: list[IncomingRpc]) -> None:
    body = b"".join(wire.encode_message(c) for c in calls)
    _check_count(body)


@pytest.mark.parametrize("fmt", ["b", "c", "@B", "H"])
def test_views_of_other_formats_take_the_reference(fmt: str) -> None:
    body = b"".join(wire.encode_message(IncomingRpc(i, RpcType.FORK, b"ab")) for i in range(5))
    body += b"\x00" * (-len(body) % 2)  # whole items for "H"
    buf = memoryview(body).cast(fmt)
    _check_decode(buf, 0, len(buf), Direction.TO_BINDING)
    _check_count(buf)


def test_released_views_and_odd_positions_raise_as_before() -> None:
    body = wire.encode_message(IncomingRpc(3, RpcType.IMPULSE, b"xyz")) * 3
    released = memoryview(body)
    released.release()
    _check_decode(released, 0, len(body), Direction.TO_BINDING)
    _check_count(released)
    for pos, end in [(-3, len(body)), (-100, 5), (2**70, 2**70 + 1), (0, -(2**70)), (5, 2)]:
        _check_decode(body, pos, end, Direction.TO_BINDING)


@_needs_c
def test_c_refuses_buffers_it_is_not_written_for() -> None:
    from ambrosia_py.wire import _cdecode

    body = wire.encode_message(IncomingRpc(3, RpcType.FORK, b"xy"))
    out: list[wire.Message] = []
    assert _cdecode.decode_calls(memoryview(body).cast("b"), 0, len(body), out) == -1
    assert _cdecode.decode_calls(memoryview(body), -1, len(body), out) == -1
    assert _cdecode.decode_calls(memoryview(body), 0, len(body) + 1, out) == -1
    assert out == []
    assert _cdecode.count_replayable(memoryview(body).cast("c")) == -2
    assert _cdecode.count_replayable(b"\x08\x00\x01") == -1
    for start in (-1, len(body) + 1, 2**70):
        assert _cdecode.count_replayable(body, start) == -2  # type: ignore[arg-type]
    assert _cdecode.count_replayable(body, len(body)) == 0
    with pytest.raises(TypeError):
        _cdecode.count_replayable(body, 0, 0)  # type: ignore[call-arg]


@_needs_c
def test_init_checks_what_it_is_given() -> None:
    from ambrosia_py.wire import _cdecode

    descriptors = decoding._INCOMING_RPC_DESCRIPTORS
    types = decoding._RPC_TYPES
    with pytest.raises(TypeError):
        _cdecode.init(IncomingRpc, descriptors[:4], types)
    with pytest.raises(TypeError):
        _cdecode.init(IncomingRpc, (descriptors[0],) * 5, types)
    with pytest.raises(TypeError):
        _cdecode.init(IncomingReturnValue, descriptors, types)  # not its slots
    with pytest.raises(TypeError):
        _cdecode.init(IncomingRpc, descriptors, types[:2])
    _cdecode.init(IncomingRpc, descriptors, types)  # as at import: still works
    returns, return_types = decoding._RETURN_DESCRIPTORS, decoding._RETURN_TYPES
    with pytest.raises(TypeError):
        _cdecode.init_returns(IncomingReturnValue, returns[:3], return_types)
    with pytest.raises(TypeError):
        _cdecode.init_returns(IncomingRpc, returns, return_types)  # not its slots
    with pytest.raises(TypeError):
        _cdecode.init_returns(IncomingReturnValue, returns, return_types[:2])
    _cdecode.init_returns(IncomingReturnValue, returns, return_types)
    reply = IncomingReturnValue(ReturnType.NO_VALUE, "x", -1, b"")
    body = wire.encode_message(reply)
    assert wire.decode_messages(body, 0, len(body)) == [reply]
    body = wire.encode_message(IncomingRpc(-5, RpcType.IMPULSE, b""))
    assert wire.decode_messages(body, 0, len(body)) == [IncomingRpc(-5, RpcType.IMPULSE, b"")]


# --- the C loops against their references, on seeded random bodies -------------------------


def _shaped_messages(rng: random.Random) -> bytes:
    """A message of a shape the C loops read themselves: a fork or an impulse, an awaited
    call from a short ASCII name, a reply with a small value."""
    method = rng.choice(_EDGE_IDS)
    args = rng.randbytes(rng.choice([0, 3, 60, 300, 8000]))
    seq = rng.randrange(-(2**62), 2**62)
    name = "".join(rng.choice("abcxyz-_0") for _ in range(rng.randrange(64)))
    kind = rng.randrange(4)
    if kind == 0:
        return wire.encode_message(IncomingRpc(method, RpcType.FORK, args))
    if kind == 1:
        return wire.encode_message(IncomingRpc(method, RpcType.IMPULSE, args))
    if kind == 2:
        return wire.encode_message(IncomingRpc(method, RpcType.ASYNC_AWAIT, args, name, seq))
    return_type = rng.choice([ReturnType.VALUE, ReturnType.NO_VALUE, ReturnType.EXCEPTION])
    value = b"" if return_type is ReturnType.NO_VALUE else args
    return wire.encode_message(IncomingReturnValue(return_type, name, seq, value))


def _any_message(rng: random.Random) -> bytes:
    pick = rng.random()
    if pick < 0.5:
        return _shaped_messages(rng)
    if pick < 0.8:
        return rng.choice(_EDGE_MESSAGES)
    if pick < 0.9:  # large: three size bytes
        return wire.encode_message(IncomingRpc(1, RpcType.FORK, rng.randbytes(9000)))
    return rng.randbytes(rng.randrange(1, 12))


def _damaged(rng: random.Random, body: bytes) -> bytes:
    how = rng.choice(["none", "none", "truncate", "flip", "insert"])
    if not body or how == "none":
        return body
    at = rng.randrange(len(body))
    if how == "truncate":
        return body[:at]
    if how == "flip":
        data = bytearray(body)
        for _ in range(rng.randrange(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        return bytes(data)
    return body[:at] + rng.randbytes(rng.randrange(1, 5)) + body[at:]


@_needs_c
def test_the_c_loops_give_their_references_results_on_seeded_random_bodies() -> None:
    """``decode_calls`` appends exactly the reference's messages up to where it stops;
    ``count_replayable`` answers as the reference does, or leaves it (-2)."""
    from ambrosia_py.wire import _cdecode

    rng = random.Random(7_2024)
    for _ in range(3000):
        parts = [_any_message(rng) for _ in range(rng.randrange(0, 8))]
        body = _damaged(rng, b"".join(parts))
        out: list[wire.Message] = []
        stop = _cdecode.decode_calls(memoryview(body), 0, len(body), out)
        assert 0 <= stop <= len(body)
        _same_messages(out, decoding._decode_messages_py(body, 0, stop))
        n = _cdecode.count_replayable(body)
        want = routing._count_replayable_py(body)
        if n != -2:
            assert (None if n == -1 else n) == want, body


@_needs_c
def test_the_c_loops_read_their_shapes_to_the_end() -> None:
    """Bodies of the common shapes are read by C alone: nothing left to the reference."""
    from ambrosia_py.wire import _cdecode

    rng = random.Random(11)
    for _ in range(500):
        body = b"".join(_shaped_messages(rng) for _ in range(rng.randrange(1, 8)))
        out: list[wire.Message] = []
        assert _cdecode.decode_calls(memoryview(body), 0, len(body), out) == len(body)
        _same_messages(out, decoding._decode_messages_py(body, 0, len(body)))
        if all(type(m) is IncomingRpc and m.rpc_type is not RpcType.ASYNC_AWAIT for m in out):
            assert _cdecode.count_replayable(body) == sum(
                m.rpc_type is RpcType.FORK for m in out if isinstance(m, IncomingRpc)
            )
        else:
            assert _cdecode.count_replayable(body) == -1


# --- which payloads are copies ---------------------------------------------------------------


def test_small_incoming_payloads_are_bytes_of_their_own_and_large_ones_views() -> None:
    """The rule :func:`wire.decode_messages` documents, whichever path reads a message:
    in the incoming form, an argument or a value in a message under 8 KiB is ``bytes``; in
    a larger one, and from ``decode_message`` or in the outgoing form, a view."""
    small = [
        IncomingRpc(1, RpcType.FORK, b"a" * 8187),  # a message of 8,191 bytes
        IncomingRpc(1, RpcType.ASYNC_AWAIT, b"abc", "caller-é", 5),  # not ASCII: Python
        IncomingReturnValue(ReturnType.VALUE, "n" * 64, 9, b"value"),  # a long name: Python
    ]
    large = [
        IncomingRpc(1, RpcType.FORK, b"b" * 8188),  # 8,192 bytes
        IncomingReturnValue(ReturnType.EXCEPTION, "callee", 9, b"c" * 9000),
    ]
    body = b"".join(wire.encode_message(m) for m in small + large)
    # type, call, method id, RPC type, arguments; after a size of two and of three bytes
    assert len(wire.encode_message(small[0])) == 2 + 8191
    assert len(wire.encode_message(large[0])) == 3 + 8192
    got = wire.decode_messages(body, 0, len(body))
    assert got == small + large
    for msg, want in zip(got, [bytes] * 3 + [memoryview] * 2, strict=True):
        payload = msg.args if isinstance(msg, IncomingRpc) else msg.value  # type: ignore[union-attr]
        assert type(payload) is want
        if isinstance(payload, memoryview):
            assert payload.obj is body
    one, _ = wire.decode_message(wire.encode_message(small[0]))
    assert isinstance(one, IncomingRpc) and type(one.args) is memoryview
    out = wire.OutgoingRpc("d", 1, RpcType.FORK, b"xyz")
    frame = wire.encode_message(out)
    (sent,) = wire.decode_messages(frame, 0, len(frame), Direction.TO_COORDINATOR)
    assert sent == out and isinstance(sent, wire.OutgoingRpc) and type(sent.args) is memoryview
