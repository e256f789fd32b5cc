"""Fuzz tests of the wire parsers: random and mutated input fed to every one of them.

Whatever the input, the only exceptions allowed out are :class:`ProtocolError`
subclasses, and a reader that failed once keeps failing. The deterministic tests, one per
documented error, are in ``test_wire_errors.py``.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.wire import (
    HEADER_SIZE,
    Direction,
    Message,
    MessageReader,
    ProtocolError,
    RecordReader,
    TruncatedInputError,
    Watermark,
    decode_disk_tail,
    decode_message,
    decode_messages,
    encode_disk_record,
    encode_message,
    encode_record,
    encode_zigzag_int,
)
from tests import strategies as s

FAST = settings(max_examples=200, deadline=None)


def _drain_records(chunks: list[bytes], *, on_disk: bool = False, verify: bool = True) -> None:
    reader = RecordReader(on_disk=on_disk, verify=verify)
    try:
        for chunk in chunks:
            reader.records(chunk)
    except ProtocolError as exc:
        # Once failed, it stays failed.
        with pytest.raises(type(exc)):
            reader.next_record()
        return
    with contextlib.suppress(TruncatedInputError):
        reader.close()


def _drain_messages(chunks: list[bytes], direction: Direction) -> None:
    reader = MessageReader(direction=direction)
    try:
        for chunk in chunks:
            reader.messages(chunk)
    except ProtocolError as exc:
        with pytest.raises(type(exc)):
            reader.next_message()
        return
    with contextlib.suppress(TruncatedInputError):
        reader.close()


def _decode_all(data: bytes) -> None:
    for direction in Direction:
        with contextlib.suppress(ProtocolError):
            decode_message(data, 0, direction)
        with contextlib.suppress(ProtocolError):
            decode_messages(data, 0, len(data), direction)
    with contextlib.suppress(ProtocolError):
        decode_disk_tail(data)


@FAST
@given(st.binary(max_size=40), st.integers(0, 50), st.integers(0, 50))
def test_fuzz_any_bounds(data: bytes, pos: int, end: int) -> None:
    for direction in Direction:
        with contextlib.suppress(ProtocolError):
            decode_message(data, pos, direction, end=end)
        with contextlib.suppress(ProtocolError):
            decode_messages(data, pos, end, direction)


@FAST
@given(st.binary(max_size=200))
def test_fuzz_random_bytes(data: bytes) -> None:
    _decode_all(data)
    for on_disk in (False, True):
        _drain_records([data], on_disk=on_disk)
        _drain_records([data], on_disk=on_disk, verify=False)
    for direction in Direction:
        _drain_messages([data], direction)


@FAST
@given(st.binary(max_size=120), st.integers(-3, 10), s.committer_ids)
def test_fuzz_random_bodies_behind_valid_headers(body: bytes, seq: int, committer: int) -> None:
    # Valid header and check bytes, so the body reaches the message decoder.
    _drain_records([s.raw_record(seq, body, committer=committer)])
    _drain_records([encode_disk_record(committer, seq, body) + body[:10]], on_disk=True)
    _decode_all(body)


@st.composite
def mutations(draw: st.DrawFn, data: bytes) -> bytes:
    """``data`` with bytes flipped, inserted or removed, or cut short."""
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        pos = draw(st.integers(0, len(out)))
        if op == "flip" and pos < len(out):
            out[pos] ^= draw(st.integers(1, 255))
        elif op == "insert":
            out[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del out[pos : pos + draw(st.integers(1, 4))]
        else:
            del out[pos:]
    return bytes(out)


@FAST
@given(s.record_streams(), st.data())
def test_fuzz_mutated_record_streams(
    stream: tuple[int, list[tuple[int, list[Message]]]], data: st.DataObject
) -> None:
    committer, records = stream
    raw = b"".join(encode_record(committer, seq, msgs) for seq, msgs in records)
    bad = data.draw(mutations(raw))
    cuts = data.draw(s.split_points(len(bad)))
    _drain_records(s.chunks(bad, cuts))
    _drain_records([bad], verify=False)


@FAST
@given(s.logged_bodies(), st.data())
def test_fuzz_mutated_bodies_with_valid_check_bytes(
    msgs: list[Message], data: st.DataObject
) -> None:
    body = encode_record(1, 0, msgs)[HEADER_SIZE:]
    bad = data.draw(mutations(body))
    _drain_records([s.raw_record(0, bad)])
    _decode_all(bad)


@FAST
@given(st.lists(s.logged_bodies(), min_size=1, max_size=3), st.data())
def test_fuzz_mutated_disk_logs(bodies: list[list[Message]], data: st.DataObject) -> None:
    log = b"".join(
        encode_disk_record(1, i, encode_record(1, i, msgs)[HEADER_SIZE:], [Watermark("peer", i, i)])
        for i, msgs in enumerate(bodies)
    )
    bad = data.draw(mutations(log))
    _drain_records([bad], on_disk=True)
    _drain_records([bad[i : i + 1] for i in range(len(bad))], on_disk=True, verify=False)


@FAST
@given(st.lists(s.messages(Direction.TO_COORDINATOR), min_size=1, max_size=5), st.data())
def test_fuzz_mutated_message_streams(msgs: list[Message], data: st.DataObject) -> None:
    raw = b"".join(encode_message(m) for m in msgs)
    bad = data.draw(mutations(raw))
    cuts = data.draw(s.split_points(len(bad)))
    _drain_messages(s.chunks(bad, cuts), Direction.TO_COORDINATOR)
    _drain_messages([bad], Direction.TO_BINDING)
    _decode_all(bad)


@FAST
@given(
    st.lists(st.integers(0, 255), min_size=1, max_size=7),
    st.sampled_from([0, 1, 2, 3]),
    st.binary(max_size=40),
)
def test_fast_path_and_general_decoder_agree_on_any_method_id_bytes(
    method_bytes: list[int], rpc_type: int, args: bytes
) -> None:
    """A call frame whose method id bytes are anything (overlong, over 32 bits, cut short):
    the batch decoder's fast path must accept exactly what the general decoder accepts."""
    data = bytes([0, 0, *method_bytes, rpc_type]) + args
    frame = encode_zigzag_int(len(data)) + data
    try:
        expected: list[Message] | type[ProtocolError] = [decode_message(frame)[0]]
    except ProtocolError as exc:
        expected = type(exc)
    try:
        got: list[Message] | type[ProtocolError] = decode_messages(frame, 0, len(frame))
    except ProtocolError as exc:
        got = type(exc)
    assert got == expected
