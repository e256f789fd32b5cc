"""The C accelerator for reading records (``ambrosia_py/wire/_crecords.c``) against its
pure-Python reference: the same hashes, records, offsets, tails and errors, on clean and on
damaged streams."""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambrosia_py import accel, wire
from ambrosia_py.coordinator.storage.scan import LogScan
from ambrosia_py.wire import reader as reader_mod
from ambrosia_py.wire.records import frame_record

C = reader_mod._crecords

needs_c = pytest.mark.skipif(
    C is None and os.environ.get(accel.REQUIRE_ENV, "") in ("", "0"),
    reason="ambrosia_py.wire._crecords is not built",
)
pytestmark = needs_c


def test_accelerator_is_used_when_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: the reader reads clean records in C (the reference is never asked)."""
    assert C is not None, "the accelerator is required but not built"
    reader = wire.RecordReader(on_disk=True)
    assert reader.accelerated
    assert not wire.RecordReader(accelerated=False).accelerated

    pure = wire.RecordReader._next_raw_pure

    def refuse(self: Any) -> None:
        # Asked at the end of the bytes (to say "no more"), it must find nothing.
        assert pure(self) is None, "the pure-Python reference read a clean record"

    data = b"".join(wire.encode_disk_record(7, s, b"body %d" % s) for s in range(5))
    reader.feed(data)
    monkeypatch.setattr(wire.RecordReader, "_next_raw_pure", refuse)
    assert [r.seq for r in reader.next_raws(2)] == [0, 1]
    got = reader.next_raw()
    assert got is not None and got.seq == 2
    assert [r.seq for r in reader.next_raws()] == [3, 4]


# --- record streams -----------------------------------------------------------------------

names = st.text(max_size=6)
watermarks = st.lists(
    st.builds(wire.Watermark, names, st.integers(-(2**63), 2**63 - 1), st.integers(0, 9)),
    max_size=2,
)
trims = st.lists(st.builds(wire.TrimWatermark, names, st.integers(-(2**63), 2**63 - 1)), max_size=2)
bodies = st.one_of(
    st.binary(max_size=80),
    st.binary(max_size=80).map(lambda b: b * 40),
    st.sampled_from([b"\x00" * (64 * 1024 - 24), b"\x01" * (64 * 1024 - 30), b"\x02" * 70000]),
)


@st.composite
def streams(draw: st.DrawFn, on_disk: bool) -> tuple[bytes, dict[str, Any]]:
    """Encoded records, then damage: a wrong committer, a sequence gap, a bad length, a
    broken tail, flipped bytes, a cut."""
    committer = draw(st.integers(-(2**31), 2**31 - 1))
    seq = draw(st.integers(0, 2**40))
    parts = []
    for _ in range(draw(st.integers(0, 6))):
        body = draw(bodies)
        who = committer
        s = seq
        kind = draw(st.sampled_from(["ok"] * 8 + ["committer", "gap", "control", "checkpoint"]))
        if kind == "committer":
            who = draw(st.integers(-(2**31), 2**31 - 1))
        elif kind == "gap":
            s = min(seq + draw(st.sampled_from([-1, 2, 2**62])), 2**63 - 1)
        s = min(s, 2**63 - 1)
        if on_disk:
            if kind in ("control", "checkpoint"):
                s = -1 if kind == "control" else -2
            rec = wire.encode_disk_record(who, s, body, draw(watermarks), draw(trims))
        else:
            if kind == "control":
                s = wire.CONTROL_SEQ
            elif kind == "checkpoint":
                s = wire.CHECKPOINT_SEQ
                if draw(st.booleans()):  # checkpoint records carry 0 as check bytes
                    body = b""
            rec = frame_record(who, s, body) + body
        if s >= 0:
            seq = s + 1
        parts.append(bytearray(rec))
    for part in parts:
        damage = draw(st.sampled_from(["none"] * 6 + ["length", "tail", "flip", "huge"]))
        if damage == "length":
            struct.pack_into("<i", part, 4, draw(st.integers(-(2**31), 2**31 - 1)))
        elif damage == "huge":
            stored = len(part) * 2
            struct.pack_into("<i", part, 4, -stored - 1 if on_disk else stored)
        elif damage == "tail" and on_disk:
            length = -struct.unpack_from("<i", part, 4)[0] - 1
            if length < len(part):
                part[length] = draw(st.sampled_from([0x03, 0x80, 0xFF, 0x7F]))
        elif damage == "flip" and part:
            i = draw(st.integers(0, len(part) - 1))
            part[i] ^= 1 << draw(st.integers(0, 7))
    data = b"".join(parts)
    if data and draw(st.booleans()):
        data = data[: draw(st.integers(0, len(data)))]
    options: dict[str, Any] = {}
    if draw(st.booleans()):
        options["committer_id"] = draw(st.sampled_from([committer, committer ^ 1, 2**40]))
    if draw(st.booleans()):
        options["next_seq"] = draw(st.sampled_from([0, 2**40, 2**63, draw(st.integers(0, 9))]))
    if draw(st.booleans()):
        options["max_record_size"] = draw(st.sampled_from([24, 100, 2**70, 1 << 20]))
    if draw(st.booleans()):
        options["verify"] = False
    return data, options


def _outcome(reader: wire.RecordReader, data: bytes, chunks: list[int], batch: int) -> list[Any]:
    """Everything a reader says about ``data`` fed in ``chunks``: records, errors, state."""
    seen: list[Any] = []
    at = 0
    sizes = [*chunks, len(data)]
    for size in sizes:
        piece = data[at : at + size]
        at += len(piece)
        if isinstance(piece, bytes) and size % 3 == 1:
            reader.feed(bytearray(piece))
        else:
            reader.feed(piece)
        while True:
            try:
                if batch:
                    got = reader.next_raws(batch)
                else:
                    one = reader.next_raw()
                    got = [] if one is None else [one]
            except wire.ProtocolError as exc:
                seen.append(("error", type(exc), str(exc), exc.offset, exc.seq, exc.reason))
                return seen
            if not got:
                break
            for r in got:
                seen.append(("record", r.header, r.offset, bytes(r.raw), r.tail, bytes(r.body)))
        seen.append(("state", reader.offset, reader.next_seq, reader.buffered))
        if at >= len(data):
            break
    try:
        reader.close()
        seen.append("closed")
    except wire.ProtocolError as exc:
        seen.append(("close error", type(exc), str(exc)))
    return seen


def _compare(on_disk: bool, stream: tuple[bytes, dict[str, Any]], chunks: list[int]) -> None:
    data, options = stream
    pure = _outcome(
        wire.RecordReader(on_disk=on_disk, accelerated=False, **options), data, chunks, 0
    )
    for batch in (0, 1, 3, 256):
        fast = wire.RecordReader(on_disk=on_disk, **options)
        assert fast.accelerated
        assert _outcome(fast, data, chunks, batch) == pure


chunkings = st.lists(st.integers(1, 5000), max_size=4)


@settings(
    max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(streams(on_disk=True), chunkings)
def test_disk_streams_match_the_reference(
    stream: tuple[bytes, dict[str, Any]], chunks: list[int]
) -> None:
    _compare(True, stream, chunks)


@settings(
    max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(streams(on_disk=False), chunkings)
def test_wire_streams_match_the_reference(
    stream: tuple[bytes, dict[str, Any]], chunks: list[int]
) -> None:
    _compare(False, stream, chunks)


def test_invalid_names_and_long_varints_go_to_the_reference() -> None:
    good = wire.encode_disk_record(1, 0, b"abc", [wire.Watermark("n", 1, 2)])
    bad_utf8 = good.replace(b"\x02n", b"\x02\xff")
    long_count = good[:27] + b"\x80\x80\x80\x80\x10" + good[28:]
    for data in (bad_utf8, long_count, good[:27] + b"\xff" * 12):
        pure = _outcome(wire.RecordReader(on_disk=True, accelerated=False), data, [], 0)
        assert pure[0][0] == "error"
        assert _outcome(wire.RecordReader(on_disk=True), data, [], 0) == pure
        assert _outcome(wire.RecordReader(on_disk=True), data, [], 256) == pure


@given(bodies, watermarks, trims, st.integers(0, 2**62))
def test_disk_to_wire_matches_the_reference(body: bytes, wms: Any, trs: Any, seq: int) -> None:
    assert C is not None
    reader = wire.RecordReader(on_disk=True, accelerated=False)
    reader.feed(wire.encode_disk_record(5, seq, body, wms, trs))
    raw = reader.next_raw()
    assert raw is not None
    assert C.disk_to_wire(raw.raw, raw.header.length) == wire.disk_to_wire(raw.header, raw.body)
    assert C.disk_to_wire(raw.raw, raw.header.length) == frame_record(5, seq, body) + body


def test_disk_to_wire_bounds() -> None:
    assert C is not None
    with pytest.raises(ValueError):
        C.disk_to_wire(b"x" * 30, 31)
    with pytest.raises(ValueError):
        C.disk_to_wire(b"x" * 30, 23)


@pytest.mark.parametrize("cut", [None, -3, -40])
@pytest.mark.parametrize("flip", [None, 200, 5000])
def test_log_scan_matches_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut: int | None, flip: int | None
) -> None:
    data = bytearray()
    for s in range(300):
        data += wire.encode_disk_record(3, s, b"m%d" % s * (s % 7), [wire.Watermark("a", s, 0)])
    if flip is not None:
        data[flip] ^= 0x10
    if cut is not None:
        del data[cut:]
    path = tmp_path / "serverlog1"

    def scan() -> Any:
        path.write_bytes(data)
        scan = LogScan(path, committer_id=3, next_seq=0, last=True, repair=False, chunk_size=999)
        try:
            got = [(r.header, r.offset, bytes(r.raw), r.tail) for r in scan]
        except Exception as exc:  # CorruptLogError
            return (type(exc), str(exc))
        return got, scan.damage, scan.next_seq, scan.end_offset, scan.records

    fast = scan()
    monkeypatch.setattr(reader_mod, "_crecords", None)
    assert scan() == fast


def test_every_cut_and_every_length_byte_in_a_watermark_tail_matches_the_reference() -> None:
    """Random cuts rarely land inside a watermark's two 8-byte numbers, nor set a name's
    length past them: here every cut of a record's tail, and several values of every
    byte of the tail, are read by both and must be read alike."""
    tail_marks = [wire.Watermark("peer", 2**40, 7), wire.Watermark("b", -1, 0)]
    trims = [wire.TrimWatermark("peer", 5)]
    record = wire.encode_disk_record(3, 0, b"\x00\x01body", tail_marks, trims)
    body_end = 24 + len(b"\x00\x01body")
    variants = [record[:cut] for cut in range(body_end, len(record) + 1)]
    for at in range(body_end, len(record)):
        for value in (0x00, 0x01, 0x10, 0x22, 0x7F, 0x80, 0xFF):
            damaged = bytearray(record)
            damaged[at] = value
            variants.append(bytes(damaged))
    for data in variants:
        for tail in (b"", wire.encode_disk_record(3, 1, b"next")):
            _compare(True, (data + tail, {}), [])
