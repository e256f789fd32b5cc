"""``RecordReader.take_calls`` (runs of records made only of incoming calls and replies) and
``Dispatcher.handle_run``, which the binding reads and handles those runs with.

Reading a stream by ``take_calls`` where it can and ``next_record`` where it stops must
give exactly what ``next_record`` alone gives (records, messages, errors), in C and in
the pure-Python reference, however the stream is cut; handling runs must leave the immortal
and its outputs as handling the records one by one does.
"""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambrosia_py import accel, wire
from ambrosia_py.binding.dispatcher import Dispatcher
from ambrosia_py.binding.immortal import Immortal, rpc
from ambrosia_py.wire import (
    IncomingReturnValue,
    IncomingRpc,
    LogRecord,
    Message,
    ReturnType,
    RpcType,
)
from ambrosia_py.wire import reader as reader_mod
from ambrosia_py.wire.records import frame_record

from . import strategies as s

C_BUILT = reader_mod._crecords is not None and reader_mod._calls_decoder is not None
needs_c = pytest.mark.skipif(
    not C_BUILT and os.environ.get(accel.REQUIRE_ENV, "") in ("", "0"),
    reason="the C record and call readers are not built",
)

# Calls as decoding's C loop takes them (small) and as it leaves them to Python (a size
# of three varint bytes); a record of only calls, and records mixing in anything else.
_call_args = st.one_of(st.binary(max_size=40), st.just(b"\x07" * 20000))
calls = st.builds(
    IncomingRpc,
    st.integers(-(2**31), 2**31 - 1),
    st.sampled_from([RpcType.FORK, RpcType.IMPULSE]),
    _call_args,
)
call_bodies = st.lists(calls, min_size=1, max_size=4)


@st.composite
def mixed_streams(draw: st.DrawFn) -> tuple[int, list[tuple[int, list[Message]]]]:
    """A coordinator's stream: mostly runs of call-only records, with control records,
    recovery checkpoints (their blobs follow them), and logged records of other kinds."""
    committer = draw(s.committer_ids)
    seq = draw(st.integers(0, 2**40))
    records: list[tuple[int, list[Message]]] = []
    for kind in draw(
        st.lists(st.sampled_from(["calls"] * 6 + ["other", "control", "checkpoint"]), max_size=12)
    ):
        if kind == "control":
            records.append((-1, [draw(s.control_messages)]))
        elif kind == "checkpoint":
            records.append((-2, [draw(s.checkpoints)]))
        else:
            body: list[Message] = []
            body.extend(draw(call_bodies) if kind == "calls" else draw(s.logged_bodies()))
            records.append((seq, body))
            seq += 1
    return committer, records


def _read(reader: wire.RecordReader, chunks: list[bytes], take: list[int]) -> list[Any]:
    """Every (seq, messages) and error from ``chunks``: by take_calls with the limits in
    ``take`` (cycled) and next_record where it stops; or by next_record alone if empty."""
    seen: list[Any] = []
    turn = 0
    try:
        for chunk in chunks:
            reader.feed(chunk)
            while True:
                if take:
                    run = reader.take_calls(take[turn % len(take)])
                    turn += 1
                    assert len(run) <= take[(turn - 1) % len(take)]
                    if run:
                        seen.extend((seq, list(msgs)) for seq, msgs in run)
                        continue
                record = reader.next_record()
                if record is None:
                    break
                seen.append((record.seq, list(record.messages)))
        reader.close()
        seen.append("closed")
    except wire.ProtocolError as exc:
        seen.append(("error", type(exc), str(exc), exc.offset, exc.seq))
    return seen


def _damaged(data: bytes, flip: int | None) -> bytes:
    if flip is None or not data:
        return data
    out = bytearray(data)
    out[flip % len(out)] ^= 0x10
    return bytes(out)


@needs_c
@settings(
    max_examples=200, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(
    mixed_streams(),
    st.data(),
    st.lists(st.integers(1, 5), min_size=1, max_size=3),
    st.one_of(st.none(), st.integers(0, 2**20)),
)
def test_take_calls_reads_what_next_record_reads(
    stream: tuple[int, list[tuple[int, list[Message]]]],
    data: st.DataObject,
    take: list[int],
    flip: int | None,
) -> None:
    committer, records = stream
    raw = _damaged(b"".join(wire.encode_record(committer, q, m) for q, m in records), flip)
    pieces = s.chunks(raw, data.draw(s.split_points(len(raw))))
    reference = _read(wire.RecordReader(accelerated=False), pieces, [])
    if flip is None:
        assert reference == [*((q, list(m)) for q, m in records), "closed"]
    for accelerated in (True, False):
        assert _read(wire.RecordReader(accelerated=accelerated), pieces, take) == reference


@needs_c
def test_the_c_reader_takes_the_calls_and_stops_before_anything_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not vacuous: in C, without the reference, and the record it stops at stays unread."""
    args = pickle.dumps(((b"x",), {}))
    records: list[tuple[int, list[Message]]] = [
        (5, [IncomingRpc(1, RpcType.FORK, args)]),
        (6, [IncomingRpc(2, RpcType.IMPULSE, args), IncomingRpc(3, RpcType.FORK, b"")]),
        (-1, [wire.TakeCheckpoint()]),
        (7, [IncomingRpc(1, RpcType.FORK, args)]),
        (8, [IncomingRpc(1, RpcType.ASYNC_AWAIT, args, "caller", 3)]),
        (9, [IncomingReturnValue(ReturnType.VALUE, "callee", 4, args)]),
        (10, [IncomingRpc(1, RpcType.FORK, b"z" * 9000)]),  # 8 KiB or more: not C's
    ]
    reader = wire.RecordReader()
    reader.feed(b"".join(wire.encode_record(9, q, m) for q, m in records))

    def refuse(self: Any, limit: int) -> None:
        raise AssertionError("the pure-Python reference was asked")

    monkeypatch.setattr(wire.RecordReader, "_take_calls_pure", refuse)
    first = reader.take_calls()
    assert [(q, list(m)) for q, m in first] == [(q, m) for q, m in records[:2]]
    assert reader.take_calls() == []  # the control record is next_record's
    control = reader.next_record()
    assert control == LogRecord(9, -1, (wire.TakeCheckpoint(),))
    assert [(q, list(m)) for q, m in reader.take_calls(5)] == records[3:6]
    assert reader.take_calls() == []  # a call of 8 KiB or more is next_record's
    last = reader.next_record()
    assert last is not None and last.seq == 10 and list(last.messages) == records[6][1]
    assert reader.buffered == 0


@needs_c
def test_a_damaged_record_is_left_to_next_record_which_raises() -> None:
    args = pickle.dumps(((b"x",), {}))
    good = wire.encode_record(1, 0, [IncomingRpc(1, RpcType.FORK, args)])
    bad = bytearray(wire.encode_record(1, 1, [IncomingRpc(1, RpcType.FORK, args)]))
    bad[-1] ^= 1
    reader = wire.RecordReader()
    reader.feed(good + bytes(bad))
    assert [q for q, _ in reader.take_calls()] == [0]
    assert reader.take_calls() == []
    with pytest.raises(wire.CheckBytesError):
        reader.next_record()
    assert reader.take_calls() == []  # a failed reader takes nothing more


@pytest.mark.parametrize("accelerated", [True, False])
def test_records_taken_before_a_malformed_one_are_returned_and_then_it_raises(
    accelerated: bool,
) -> None:
    """Check bytes right, messages wrong (a call whose size runs past the record): the
    calls before it come out, and the next read raises, as next_record does."""
    args = pickle.dumps(((b"x",), {}))
    good = wire.encode_record(1, 0, [IncomingRpc(1, RpcType.FORK, args)])
    bad = frame_record(1, 1, b"\x7f\x00") + b"\x7f\x00"
    reader = wire.RecordReader(accelerated=accelerated)
    reader.feed(good + bad)
    assert [q for q, _ in reader.take_calls()] == [0]
    with pytest.raises(wire.ProtocolError):
        reader.take_calls() or reader.next_record()
    reference = wire.RecordReader(accelerated=False)
    reference.feed(good + bad)
    assert reference.next_record() is not None
    with pytest.raises(wire.ProtocolError):
        reference.next_record()


def test_the_c_reader_refuses_wrong_arguments() -> None:
    c = reader_mod._crecords
    if c is None:
        pytest.skip("_crecords is not built")
    with pytest.raises(TypeError):
        c.take_calls(b"", 0, 0, False, True, None, None, 1 << 20, 1, None, [])
    with pytest.raises(TypeError):
        c.take_calls(b"", 0, 0, False, True, None, None, 1 << 20, 1, len)
    # A decoder that fails: the error comes out, and nothing is taken.
    record = wire.encode_record(1, 0, [IncomingRpc(1, RpcType.FORK, b"a")])

    def broken(*_: Any) -> int:
        raise ValueError("decoder failed")

    out: list[Any] = []
    with pytest.raises(ValueError, match="decoder failed"):
        c.take_calls(record, 0, 0, False, True, None, None, 1 << 20, 4, broken, out)
    assert out == []
    # On-disk records are never taken (the wire form only).
    disk = wire.encode_disk_record(1, 0, b"")
    assert c.take_calls(disk, 0, 0, True, True, None, None, 1 << 20, 4, broken, out) == (
        0,
        None,
        None,
    )


# --- Dispatcher.handle_run --------------------------------------------------------------


class Tally(Immortal):
    def __init__(self) -> None:
        self.seen: list[Any] = []

    @rpc
    def add(self, x: Any) -> None:
        if x == "fail":
            raise ValueError("the handler failed")
        self.seen.append(x)
        if x == "echo":
            self.me.add.fork("echoed")

    @rpc
    async def later(self, x: Any) -> None:
        self.seen.append(("later", x))


def _call(name: str, x: Any) -> IncomingRpc:
    spec = Tally.rpc_methods_by_name()[name]
    return IncomingRpc(spec.id, RpcType.FORK, pickle.dumps(((x,), {})))


@given(
    st.lists(
        st.lists(
            st.one_of(
                st.integers(0, 9).map(lambda x: _call("add", x)),
                st.sampled_from(["echo", "fail"]).map(lambda x: _call("add", x)),
                st.integers(0, 9).map(lambda x: _call("later", x)),
                st.just(IncomingRpc(12345, RpcType.FORK, b"")),  # no such method
                st.just(IncomingRpc(Tally.rpc_methods_by_name()["add"].id, RpcType.FORK, b"?")),
            ),
            min_size=1,
            max_size=4,
        ),
        max_size=8,
    ),
    st.integers(1, 4),
)
def test_handle_run_does_what_handle_does_record_by_record(
    bodies: list[list[Message]], size: int
) -> None:
    records = [(seq, body) for seq, body in enumerate(bodies)]
    one = Dispatcher(Tally, "t")
    by_record = [m for seq, body in records for m in one.handle(LogRecord(1, seq, tuple(body)))]
    runs = Dispatcher(Tally, "t")
    by_run: list[Message] = []
    for i in range(0, len(records), size):
        by_run.extend(runs.handle_run(records[i : i + size]))
        assert runs.record_seq == records[min(i + size, len(records)) - 1][0]
    assert by_run == by_record
    assert runs.immortal.seen == one.immortal.seen  # type: ignore[attr-defined]
    assert runs.checkpoint() == one.checkpoint()


def test_record_seq_names_the_record_a_failure_came_from() -> None:
    class Broken(Tally):
        @rpc
        def add(self, x: Any) -> None:
            raise SystemExit("not an Exception: the binding cannot go on")

    d = Dispatcher(Broken, "b")
    spec = Broken.rpc_methods_by_name()["add"]
    call = IncomingRpc(spec.id, RpcType.FORK, pickle.dumps(((1,), {})))
    with pytest.raises(SystemExit):
        d.handle_run([(3, [_call("later", 1)]), (4, [call])])
    assert d.record_seq == 4
