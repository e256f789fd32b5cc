"""The push fast path reads and writes exactly what the generic codec does.

``immortals.ockam.pushes`` skips the schema tables for pushes on a known route; these
tests pin it to the generic codec: the same bytes out, the same values in, and ``None``
(leave it to the generic decoder) for anything the strict decoder would reject or read
as something else. The hub's ``handle_frames`` gives the same replies and state as
``handle`` frame by frame.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from immortals.ockam import bare, codec, pushes
from immortals.ockam.codec import CreateStreamRequest, PullRequest, PushConfirm, PushRequest, Status
from immortals.ockam.hub_core import StreamHub
from immortals.ockam.routing import (
    VERSION,
    Address,
    AddressType,
    TransportMessage,
    encode_message,
    frame,
    hop,
)

from .strategies_ockam import blobs, routes, uints


@given(routes, routes, uints, blobs)
def test_push_frames_match_the_generic_encoding(
    onward: tuple[Address, ...], back: tuple[Address, ...], request_id: int, data: bytes
) -> None:
    generic = encode_message(
        TransportMessage(VERSION, onward, back, codec.encode(PushRequest(request_id, data)))
    )
    head = pushes.header(onward, back)
    assert head + bare.data(pushes.push_payload(request_id, data)) == generic
    assert pushes.read_push_at(generic, len(head)) == (request_id, data)


@given(uints, uints)
def test_confirms_match_the_generic_encoding(request_id: int, index: int) -> None:
    payload = pushes.confirm_payload(request_id, index)
    assert payload == codec.encode(PushConfirm(request_id, Status.OK, index))
    message = b"\x01\x00\x00" + bare.data(payload)
    assert pushes.read_confirm_at(message, 3) == (request_id, Status.OK, index)


@given(st.binary(max_size=40))
def test_anything_else_is_left_to_the_generic_decoder(junk: bytes) -> None:
    """The fast readers accept only bytes the generic decoder reads as the same push."""
    for read, decode in (
        (pushes.read_push_at, codec.decode_request),
        (pushes.read_confirm_at, codec.decode_response),
    ):
        got = read(b"\x05" + junk, 1)
        if got is None:
            continue
        payload = junk[1:] if junk[0] < 0x80 else None  # the data length took one byte
        assert payload is not None
        message = decode(payload)
        assert isinstance(message, PushRequest | PushConfirm)
        assert message.request_id == got[0]


def test_non_minimal_and_truncated_numbers_are_not_taken() -> None:
    good = bare.data(pushes.push_payload(300, b"x"))
    assert pushes.read_push_at(good, 0) == (300, b"x")
    assert pushes.read_push_at(good[:-1], 0) is None  # truncated
    assert pushes.read_push_at(good + b"\x00", 0) is None  # trailing byte
    inner = b"\x80\x00" + b"\x01x"  # request id 0 in two bytes: not minimal
    protocol = bare.string("stream_push")
    assert pushes.read_push_at(bare.data(protocol + bare.data(inner)), 0) is None
    other = bare.data(codec.encode(PullRequest(1, 0, 10)))  # another protocol
    assert pushes.read_push_at(other, 0) is None


def _frames(route: tuple[Address, ...], me: Address, n: int) -> list[bytes]:
    return [
        encode_message(
            TransportMessage(VERSION, route, (me,), codec.encode(PushRequest(k, b"p%d" % k)))
        )
        for k in range(n)
    ]


def test_handle_frames_replies_and_stores_as_handle_does() -> None:
    via = Address(AddressType.TCP, b"127.0.0.1:9")
    create = encode_message(
        TransportMessage(
            VERSION,
            (Address.local("stream_service"),),
            (Address.local("c.0"),),
            codec.encode(CreateStreamRequest("s")),
        )
    )
    fast, slow = StreamHub(), StreamHub()
    route = slow.handle(create, via, 1).replies[0].return_route
    fast.handle_frames([create], via, 1)
    frames = [*_frames(route, Address.local("c.1"), 700), b"\x01junk"]
    frames += _frames(route, Address.local("c.2"), 500)
    expected = []
    for data in frames:
        for reply in slow.handle(data, via, 5).replies:
            expected.append(frame(encode_message(hop(reply, via))))
    got = (
        fast.handle_frames(frames[:150], via, 5).wire
        + fast.handle_frames(frames[150:], via, 5).wire
    )
    assert got == b"".join(expected)
    assert fast.pushes == slow.pushes == 1200
    log_fast, log_slow = fast.streams[("s", 0)], slow.streams[("s", 0)]
    assert log_fast.read(0, 1000) == log_slow.read(0, 1000)
    assert log_fast.segments == log_slow.segments  # the same sealed segment names
