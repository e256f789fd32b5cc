"""The scan's fast path (frames.py's walk, calls.py's numpy reading of calls and return
values) against the test oracle (tests/log_oracle.py, written from reference/ambrosia.md
with nothing from ``ambrosia_py``): same frames, same values, on random messages with
payloads of 0, 1, 12, 13, 100 and 64 KiB bytes, alone, mixed with every other RPC form,
and in uniform records (the stride check) with one message changed."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.spark import calls, read_rows
from ambrosia_py.spark.calls import call_rows
from ambrosia_py.spark.frames import frame_ends
from ambrosia_py.wire.messages import frame_parts
from tests import log_oracle as oracle
from tests import strategies
from tests.test_spark_rows import _log_of, normal, reference_rows

SIZES = st.sampled_from([0, 1, 12, 13, 100, 64 * 1024]) | st.integers(0, 300)
forks = st.builds(
    wire.IncomingRpc,
    st.integers(-(2**31), 2**31 - 1) | st.integers(-64, 63),
    st.sampled_from([wire.RpcType.FORK, wire.RpcType.IMPULSE]),
    SIZES.flatmap(lambda n: st.binary(min_size=n, max_size=n)),
)
others = strategies.rpc_messages(wire.Direction.TO_BINDING)


def framed(messages: Sequence[wire.Message]) -> list[bytes]:
    return [b"".join(bytes(p) for p in frame_parts(m)) for m in messages]


def decoded_rows(body: bytes) -> dict[str, list[object]]:
    """What the test oracle reads in each call or return value, as columns."""
    out: dict[str, list[object]] = {
        k: [] for k in ("method_id", "rpc_type", "sender", "call_seq", "payload", "return_type")
    }
    for m in oracle.messages(body):
        assert m.name == "RPC", m
        f = m.fields
        out["sender"].append(f["sender"])
        out["call_seq"].append(f["call_seq"])
        if f["call"]:
            out["method_id"].append(f["method_id"])
            out["rpc_type"].append(f["rpc_type"])
            out["payload"].append(f["args"])
            out["return_type"].append(None)
        else:
            out["method_id"].append(None)
            out["rpc_type"].append("return")
            out["payload"].append(f["value"])
            out["return_type"].append(f["return_type"])
    return out


def _columns(raw: bytes, lo: int, hi: int) -> object:
    ends = frame_ends(raw, lo, hi)
    assert ends is not None
    ends = np.asarray(ends, np.int64)
    starts = np.concatenate([[lo], ends[:-1]]).astype(np.int64)
    return call_rows(raw, lo, hi, starts, ends)


@settings(max_examples=150, deadline=None)
@given(st.lists(forks | others, min_size=1, max_size=12), st.binary(max_size=20))
def test_frame_ends_are_the_wire_decoder_s_frames(messages: list[wire.Message], pad: bytes) -> None:
    frames = framed(messages)
    raw = pad + b"".join(frames) + pad
    ends = frame_ends(raw, len(pad), len(raw) - len(pad))
    assert ends is not None
    assert list(ends) == [len(pad) + sum(map(len, frames[: i + 1])) for i in range(len(frames))]
    # Not a call or return value: not walked (the wire decoder decodes the record).
    tail = framed([wire.AttachTo("x")])[0]
    assert (
        frame_ends(raw[: -len(pad) or None] + tail, len(pad), len(raw) - len(pad) + len(tail))
        is None
    )
    # Cut anywhere inside the last message: not framed.
    assert frame_ends(raw, len(pad), len(raw) - len(pad) - 1) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(forks | others, min_size=1, max_size=12), st.binary(max_size=20))
def test_call_rows_equal_the_oracle_s(messages: list[wire.Message], pad: bytes) -> None:
    body = b"".join(framed(messages))
    rows = _columns(pad + body + pad, len(pad), len(pad) + len(body))
    # Call seqs of ten varint bytes are left to the general path (and only they).
    long_seq = [
        getattr(m, "sender", None) is not None
        and not (isinstance(m, wire.IncomingRpc) and m.rpc_type != wire.RpcType.ASYNC_AWAIT)
        and not -(2**62) <= getattr(m, "call_seq", 0) < 2**62
        for m in messages
    ]
    if any(long_seq):
        assert not isinstance(rows, dict)
        assert rows.tolist() == long_seq
        return
    assert isinstance(rows, dict)
    expected = decoded_rows(body)
    assert {name: rows[name].to_pylist() for name in expected} == expected
    assert rows["payload_size"].to_pylist() == [len(p) for p in expected["payload"]]  # type: ignore[arg-type]
    assert rows["msg_type"].to_pylist() == ["RPC"] * len(messages)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(forks | others, min_size=1, max_size=8),
    st.sampled_from([b"\xff", b"\xed\xa0\x80", b"\xc0\x80"]),
    st.data(),
)
def test_a_sender_that_is_not_utf8_is_flagged(
    messages: list[wire.Message], name: bytes, data: st.DataObject
) -> None:
    """Bytes Python's UTF-8 decoder refuses (a stray byte, a surrogate, an overlong form):
    the record goes to the wire decoder, which names the error."""
    call = wire.IncomingRpc(1, wire.RpcType.ASYNC_AWAIT, b"x", "@" * len(name), 5)
    at = data.draw(st.integers(0, len(messages)))
    frames = framed(messages)
    frames.insert(at, framed([call])[0].replace(b"@" * len(name), name))
    body = b"".join(frames)
    rows = _columns(body, 0, len(body))
    assert not isinstance(rows, dict)
    assert rows.tolist()[at]


@settings(max_examples=40, deadline=None)
@given(forks, st.integers(8, 40), st.data())
def test_uniform_records_take_the_stride_check_and_a_changed_one_is_walked(
    call: wire.IncomingRpc, count: int, data: st.DataObject
) -> None:
    one = framed([call])[0]
    ends = frame_ends(one * count, 0, len(one) * count)
    assert isinstance(ends, np.ndarray)
    assert ends.tolist() == [len(one) * (i + 1) for i in range(count)]
    # One message in the middle changed (another size or type): the walk's frames.
    other = data.draw(forks | others)
    at = data.draw(st.integers(0, count - 1))
    messages: list[wire.Message] = [call] * count
    messages[at] = other
    frames = framed(messages)
    body = b"".join(frames)
    walked = frame_ends(body, 0, len(body))
    assert walked is not None
    assert list(walked) == [sum(map(len, frames[: i + 1])) for i in range(count)]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.lists(forks, min_size=1, max_size=10),
            forks.flatmap(lambda c: st.integers(8, 30).map(lambda k: [c] * k)),
            st.lists(forks | others, min_size=1, max_size=6),
            strategies.logged_bodies(with_checkpoints=True),
        ),
        min_size=1,
        max_size=8,
    )
)
def test_records_of_calls_give_the_reference_rows(bodies: list[list[wire.Message]]) -> None:
    """Whole logs: records read with numpy, as lists and as objects, in any order."""
    with tempfile.TemporaryDirectory() as d:
        _log_of(bodies, Path(d))
        assert normal(read_rows(d)) == reference_rows(Path(d))


@settings(max_examples=60, deadline=None)
@given(
    st.binary(min_size=1, max_size=2000),
    st.lists(st.tuples(st.integers(0, 2000), SIZES), max_size=20),
)
def test_payload_views_and_the_copying_fallback_agree(
    data: bytes, ranges: list[tuple[int, int]]
) -> None:
    """The binary_view path and the copy for PyArrows without view casts: the same
    values as slicing the bytes."""
    padded = np.frombuffer(data + bytes(16), np.uint8)
    cut = [(min(b, len(data)), min(k, len(data) - min(b, len(data)))) for b, k in ranges]
    begin = np.array([b for b, _ in cut], np.int64)
    lengths = np.array([k for _, k in cut], np.int64)
    expected = [data[b : b + k] for b, k in cut]
    assert calls.payloads(padded, begin, lengths).to_pylist() == expected
    assert calls._copied(padded, begin, lengths).to_pylist() == expected
