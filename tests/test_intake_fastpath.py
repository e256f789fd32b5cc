"""The coordinator's byte-level paths give what decoding gives.

``Intake.receive_data`` takes runs of small RPC frames through
``MessageReader.take_rpc_frames`` and ``Intake._small_rpcs``; the reference is the same
Intake with that fast path switched off: the queued bytes, the outboxes, the counters
and every error (type, message and offset) must be the same, for well-formed and for
mangled input. ``Intake.link_input`` has one path; its reference here reads the frame
message by message with ``MessageReader`` and applies the link's rules (incoming calls
that are no impulse and return values, a reply or an awaited call naming its sender).
"""

from __future__ import annotations

import itertools
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.coordinator.core import routing
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.links.protocol import LinkError
from ambrosia_py.wire import Direction, IncomingReturnValue, IncomingRpc, MessageReader, RpcType

from .strategies import messages, rpc_messages

_SELF = "me"


def _general(intake: Intake) -> Intake:
    """``intake`` with the fast path of ``receive_data`` switched off."""

    def no_fast_path(out: list[bytes]) -> int:
        return intake.offset

    intake._reader.take_rpc_frames = no_fast_path  # type: ignore[method-assign]
    return intake


def _state(intake: Intake) -> tuple[Any, ...]:
    pending = [(b"".join(bytes(p) for p in parts), *rest) for parts, *rest in intake.pending]
    boxes = {dest: (box.next_seq, box.buffered) for dest, box in intake.outboxes.items()}
    return (
        pending,
        boxes,
        intake.new_destinations,
        intake.received_outputs,
        intake.dropped,
        intake.queued_outputs,
        intake.enqueued,
        intake.pending_bytes,
        intake.offset,
        dict(intake.inbox.queued),
    )


def _run(intake: Intake, chunks: list[bytes]) -> tuple[Any, ...]:
    events: list[Any] = []
    try:
        for chunk in chunks:
            intake.receive_data(chunk)
            while (event := intake.next_event()) is not None:
                events.append(event)
    except wire.ProtocolError as exc:
        return ("error", type(exc), str(exc), exc.offset, _state(intake)[:8])
    return ("ok", events, _state(intake))


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


_names = st.sampled_from(["", _SELF, "other", "b", "ünï", "x" * 70])
# Attached before the run (as a checkpoint restores them); calls to the others are
# refused until an AttachTo in the input, if any, names them.
_ATTACHED = frozenset({"other", "b"})


def _fed_intake() -> Intake:
    intake = Intake(_SELF)
    intake.restore_attached(_ATTACHED)
    return intake


_outgoing = st.one_of(
    rpc_messages(Direction.TO_COORDINATOR),
    st.builds(
        wire.OutgoingRpc,
        _names,
        st.sampled_from([0, 1, 63, 64, 2**31 - 1, -1]),
        st.sampled_from(list(RpcType)),
        st.binary(max_size=40) | st.sampled_from([b"y" * 9000]),
    ),
)


@given(
    st.lists(_outgoing | messages(Direction.TO_COORDINATOR, with_checkpoints=False), max_size=12),
    st.lists(st.integers(0, 10_000), max_size=4),
    st.integers(0, 3),
)
def test_feed_fast_path_matches_the_general_path(
    msgs: list[wire.Message], cuts: list[int], skip: int
) -> None:
    data = b"".join(wire.encode_message(m) for m in msgs)
    fast, general = _fed_intake(), _general(_fed_intake())
    fast.skip_below = general.skip_below = skip
    assert _run(fast, _chunks(data, cuts)) == _run(general, _chunks(data, cuts))


@given(
    st.lists(_outgoing, min_size=1, max_size=8),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=3),
)
def test_feed_fast_path_matches_on_mangled_bytes(
    msgs: list[wire.Message], edits: list[tuple[int, int]]
) -> None:
    data = bytearray(b"".join(wire.encode_message(m) for m in msgs))
    for at, value in edits:
        data[at % len(data)] = value
    fast, general = _fed_intake(), _general(_fed_intake())
    assert _run(fast, [bytes(data)]) == _run(general, [bytes(data)])


def _link_reference(sender: str, data: bytes) -> tuple[str, Any]:
    """What a link frame from ``sender`` must queue: ``("ok", frames)`` or ``("refused",
    None)``, read message by message (the incoming form) and checked by the link's rules."""
    reader = MessageReader(direction=Direction.TO_BINDING)
    frames: list[bytes] = []
    try:
        reader.feed(data)
        while (frame := reader.next_frame()) is not None:
            if frame.type != wire.MessageType.RPC:
                return ("refused", None)
            msg = reader.decode(frame)
            if isinstance(msg, IncomingRpc):
                if msg.rpc_type == RpcType.IMPULSE:
                    return ("refused", None)
                if msg.rpc_type == RpcType.ASYNC_AWAIT and msg.sender != sender:
                    return ("refused", None)
            elif not isinstance(msg, IncomingReturnValue) or msg.sender != sender:
                return ("refused", None)
            frames.append(bytes(frame.raw))
        reader.close()
    except wire.ProtocolError:
        return ("refused", None)
    return ("ok", frames)


def _link(intake: Intake, sender: str, data: bytes | memoryview) -> tuple[str, Any]:
    """What ``intake.link_input`` queued, as :func:`_link_reference` says it; a refusal
    must be a LinkError with an offset within the frame, and leave nothing queued."""
    before = _state(intake)
    try:
        n = intake.link_input(sender, data)
    except LinkError as exc:
        assert exc.offset is not None and 0 <= exc.offset <= len(data), exc
        assert _state(intake) == before
        return ("refused", None)
    frames = [b"".join(bytes(p) for p in parts) for parts, *_ in intake.pending]
    assert n == len(frames)
    assert [rest for _, *rest in intake.pending] == [
        [False, sender, seq] for seq in range(1, n + 1)
    ]
    assert intake.pending_bytes == len(data) and intake.inbox.queued.get(sender, 0) == n
    return ("ok", frames)


_forks = st.builds(
    IncomingRpc,
    st.sampled_from([0, 1, 63, 64, 8191, 2**31 - 1, -1, -(2**31)]),
    st.just(RpcType.FORK),
    st.binary(max_size=40),
)


@given(
    st.lists(_forks | rpc_messages(Direction.TO_BINDING), max_size=10),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_link_input_takes_what_decoding_and_the_link_rules_take(
    msgs: list[wire.Message], edits: list[tuple[int, int]]
) -> None:
    data = bytearray(b"".join(wire.encode_message(m) for m in msgs))
    for at, value in edits:
        if data:
            data[at % len(data)] = value
    assert _link(Intake(_SELF), "b", bytes(data)) == _link_reference("b", bytes(data))


_link_senders = st.sampled_from(["b", "c", "", "bb"])
_one_messages = st.one_of(
    st.builds(
        IncomingRpc,
        st.sampled_from([0, 1, 64, 2**31 - 1, -1]),
        st.sampled_from(list(RpcType)),
        st.binary(max_size=40),
        _link_senders,
        st.integers(-(2**63), 2**63 - 1),
    ).map(
        lambda m: m if m.rpc_type is RpcType.ASYNC_AWAIT else attrs.evolve(m, sender="", call_seq=0)
    ),
    st.builds(
        IncomingReturnValue,
        st.sampled_from(
            [wire.ReturnType.VALUE, wire.ReturnType.NO_VALUE, wire.ReturnType.EXCEPTION]
        ),
        _link_senders,
        st.integers(-(2**63), 2**63 - 1),
        st.binary(max_size=40),
    ).filter(lambda m: m.return_type is not wire.ReturnType.NO_VALUE or not m.value),
    rpc_messages(Direction.TO_BINDING),
    messages(Direction.TO_BINDING, with_checkpoints=False),
)


@given(
    _one_messages,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=2),
    st.binary(max_size=3),
)
def test_a_frame_of_one_message_is_taken_as_decoding_and_the_link_rules_take_it(
    msg: wire.Message, edits: list[tuple[int, int]], extra: bytes
) -> None:
    """The latency path's frame (one awaited call, or one reply): what it takes, what it
    queues and what it refuses, for any kind of message, any sender it names, mangled
    bytes and bytes after the message."""
    data = bytearray(wire.encode_message(msg) + extra)
    for at, value in edits:
        data[at % len(data)] = value
    assert _link(Intake(_SELF), "b", bytes(data)) == _link_reference("b", bytes(data))


def test_an_awaited_call_and_a_reply_are_queued_whole_and_a_false_sender_refused() -> None:
    call = wire.encode_message(IncomingRpc(5, RpcType.ASYNC_AWAIT, b"args", "b", 7))
    reply = wire.encode_message(IncomingReturnValue(wire.ReturnType.VALUE, "b", 7, b"value"))
    intake = Intake(_SELF)
    assert intake.link_input("b", call) == 1
    assert intake.link_input("b", memoryview(reply)) == 1
    assert [b"".join(map(bytes, parts)) for parts, *_ in intake.pending] == [call, reply]
    assert intake.inbox.queued == {"b": 2}
    with pytest.raises(LinkError, match="names sender 'b'"):
        Intake(_SELF).link_input("c", reply)


@given(
    st.lists(_forks | rpc_messages(Direction.TO_BINDING), max_size=10),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
)
def test_count_replayable_agrees_with_decoding(
    msgs: list[wire.Message], edits: list[tuple[int, int]]
) -> None:
    data = bytearray(b"".join(wire.encode_message(m) for m in msgs))
    for at, value in edits:
        if data:
            data[at % len(data)] = value
    counted = routing.count_replayable(bytes(data))
    if counted is None:
        return
    decoded = wire.decode_messages(bytes(data), 0, len(data))  # must not raise
    assert counted == sum(
        isinstance(m, IncomingRpc) and m.rpc_type == RpcType.FORK for m in decoded
    )
    assert all(isinstance(m, IncomingRpc) and m.rpc_type != RpcType.ASYNC_AWAIT for m in decoded)


def test_a_large_link_call_is_queued_as_a_view_of_the_frame_not_a_copy() -> None:
    """A call of 8 KiB and more is queued as a view of the frame, not a copy; a smaller
    one as bytes of its own, which do not keep the frame alive."""
    msgs = [IncomingRpc(7, RpcType.FORK, b"a" * 70_000), IncomingRpc(7, RpcType.FORK, b"b")]
    data = b"".join(wire.encode_message(m) for m in msgs)
    intake = Intake(_SELF)
    assert intake.link_input("b", data) == 2
    (big,), (small,) = (parts for parts, *_ in intake.pending)
    assert isinstance(big, memoryview) and big.obj is data
    assert type(small) is bytes
    assert [bytes(big), small] == [wire.encode_message(m) for m in msgs]
    assert _link(Intake(_SELF), "b", data) == _link_reference("b", data)


def test_a_message_alone_in_a_frame_is_queued_as_the_frame_itself() -> None:
    """The latency path's frame (an awaited call or its reply) is not copied again."""
    data = wire.encode_message(IncomingRpc(5, RpcType.ASYNC_AWAIT, b"x" * 20, "b", 7))
    intake = Intake(_SELF)
    assert intake.link_input("b", data) == 1
    ((queued,),) = (parts for parts, *_ in intake.pending)
    assert queued is data


# --- large calls from a link frame's view, decoded in place --------------------------------

_large_forks = st.builds(
    IncomingRpc,
    st.sampled_from([0, 63, 64, 2**31 - 1, -1]),
    st.just(RpcType.FORK),
    st.integers(8 * 1024 - 8, 70_000).map(lambda n: bytes([n % 251]) * n),
)


def _framed_view(data: bytes) -> memoryview:
    """``data`` as the link hands it over: a view of the frame's message, tag cut off."""
    return memoryview(data + b"T" * 16)[: len(data)]


def _enlarged(msg: wire.Message, size: int) -> wire.Message:
    """``msg`` with arguments (or a value) of ``size`` bytes."""
    if isinstance(msg, IncomingRpc):
        return attrs.evolve(msg, args=b"v" * size)
    if isinstance(msg, IncomingReturnValue) and msg.value:
        return attrs.evolve(msg, value=b"v" * size)
    return msg


_any_large = st.builds(
    _enlarged, rpc_messages(Direction.TO_BINDING), st.integers(8 * 1024 - 8, 70_000)
)


@given(
    _large_forks | _any_large,
    st.lists(_large_forks | _any_large | _forks | rpc_messages(Direction.TO_BINDING), max_size=5),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    st.booleans(),
)
def test_a_view_of_a_link_frame_is_taken_as_its_bytes_are(
    first: wire.Message,
    msgs: list[wire.Message],
    edits: list[tuple[int, int]],
    near_the_start: bool,
) -> None:
    data = bytearray(b"".join(wire.encode_message(m) for m in [first, *msgs]))
    for at, value in edits:
        data[at % (8 if near_the_start else len(data)) % len(data)] = value
    expected = _link_reference("b", bytes(data))
    assert _link(Intake(_SELF), "b", bytes(data)) == expected
    assert _link(Intake(_SELF), "b", _framed_view(bytes(data))) == expected


def test_large_calls_of_a_frame_view_are_queued_as_views_of_the_frame() -> None:
    msgs = [
        IncomingRpc(7, RpcType.FORK, b"a" * 70_000),
        IncomingRpc(7, RpcType.FORK, b"b"),
        IncomingRpc(8, RpcType.FORK, b"c" * 9_000),
    ]
    data = b"".join(wire.encode_message(m) for m in msgs)
    view = _framed_view(data)
    intake = Intake(_SELF)
    assert intake.link_input("b", view) == 3
    (big,), (small,), (medium,) = (parts for parts, *_ in intake.pending)
    assert isinstance(big, memoryview) and big.obj is view.obj  # no copy
    assert isinstance(medium, memoryview) and medium.obj is view.obj
    assert type(small) is bytes  # a small call does not hold the frame
    assert [bytes(big), small, bytes(medium)] == [wire.encode_message(m) for m in msgs]
    assert intake.pending_bytes == len(data) and dict(intake.inbox.queued) == {"b": 3}


def test_a_view_of_a_mutable_buffer_is_copied_first() -> None:
    data = wire.encode_message(IncomingRpc(7, RpcType.FORK, b"a" * 70_000))
    buf = bytearray(data)
    intake = Intake(_SELF)
    assert intake.link_input("b", memoryview(buf)) == 1
    buf[:] = bytes(len(buf))  # the caller reuses its buffer: what was queued is unchanged
    ((queued,),) = (parts for parts, *_ in intake.pending)
    assert bytes(queued) == data
