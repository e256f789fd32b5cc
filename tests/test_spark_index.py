"""The coordinator's sidecar log index (coordinator/storage/index.py): what the writer puts in it,
and that a reader can never be misled by a damaged, stale or foreign one."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.storage import index as logindex
from ambrosia_py.coordinator.storage.files import InstanceFiles, LogWriter
from ambrosia_py.coordinator.storage.index import (
    ENTRY_SIZE,
    INDEX_MAGIC,
    IndexEntry,
    IndexWriter,
    decode_index,
    encode_entry,
    index_path_for,
    read_index,
)


def record(seq: int, size: int = 100) -> bytes:
    body = wire.encode_message(wire.IncomingRpc(3, wire.RpcType.FORK, bytes(size)))
    return wire.encode_disk_record(7, seq, body)


def test_index_path_pairs_with_the_log_number(tmp_path: Path) -> None:
    assert index_path_for(tmp_path / "serverlog12") == tmp_path / "serverindex12"
    assert index_path_for(tmp_path / "serverlog0") is None
    assert index_path_for(tmp_path / "other") is None


def test_writer_indexes_the_first_record_then_every_n_bytes(tmp_path: Path) -> None:
    size = len(record(0))
    with LogWriter(tmp_path / "serverlog1", index_every_bytes=3 * size) as log:
        for seq in range(10):
            log.write([record(seq)])
    entries = read_index(tmp_path / "serverlog1")
    assert [(e.offset, e.seq) for e in entries] == [(i * size, i) for i in (0, 3, 6, 9)]
    times = [e.time_ns for e in entries]
    assert times == sorted(times) and times[0] > 0
    assert (tmp_path / "serverindex1").stat().st_mode & 0o777 == 0o600


def test_writer_indexes_after_the_time_step_however_few_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [0]
    monkeypatch.setattr(logindex.time, "monotonic_ns", lambda: clock[0])
    size = len(record(0))
    with LogWriter(tmp_path / "serverlog1") as log:
        for seq in range(6):
            clock[0] = seq * logindex.EVERY_NS // 2  # an entry every other record
            log.write([record(seq)])
    assert [e.seq for e in read_index(tmp_path / "serverlog1")] == [0, 2, 4]
    assert read_index(tmp_path / "serverlog1")[1].offset == 2 * size


def test_a_new_log_starts_a_new_index_and_an_appended_log_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "serverlog1"
    with LogWriter(path, index_every_bytes=1) as log:
        log.write([record(0)])
    path.unlink()  # an interrupted first start's log, removed; its index stays behind
    with LogWriter(path, index_every_bytes=1) as log:
        log.write([record(5, size=10)])
    assert [(e.offset, e.seq) for e in read_index(path)] == [(0, 5)]
    with LogWriter(path, index_every_bytes=1) as log:  # appending to a log with records
        log.write([record(6, size=10)])
    assert [e.seq for e in read_index(path)] == [5, 6]


def test_writes_that_do_not_begin_with_an_on_disk_header_are_not_indexed(tmp_path: Path) -> None:
    with LogWriter(tmp_path / "serverlog1", index_every_bytes=1) as log:
        log.write([b"17"])  # not a record (the commit pipeline's tests write such bytes)
        log.write([wire.encode_record(7, 1, [])])  # wire form: the length is positive
        log.write([record(2)[:10], record(2)[10:]])  # a header split across parts
    assert [e.seq for e in read_index(tmp_path / "serverlog1")] == [2]


def test_damaged_torn_and_foreign_indexes_yield_only_valid_entries(tmp_path: Path) -> None:
    good = [IndexEntry(0, 0, 10), IndexEntry(500, 4, 20), IndexEntry(900, 8, 30)]
    data = INDEX_MAGIC + b"".join(encode_entry(e) for e in good)
    assert decode_index(data) == good
    assert decode_index(data + encode_entry(IndexEntry(1000, 9, 40))[:20]) == good  # torn
    flipped = bytearray(data)
    flipped[len(INDEX_MAGIC) + ENTRY_SIZE + 3] ^= 0x10
    assert decode_index(bytes(flipped)) == [good[0], good[2]]
    zeros = data[: len(INDEX_MAGIC) + ENTRY_SIZE] + bytes(ENTRY_SIZE)
    assert decode_index(zeros) == good[:1]
    assert decode_index(b"NOTANIDX" + data[8:]) == []
    assert decode_index(b"") == []
    # The last entry for an offset wins, and entries come out by offset.
    again = data + encode_entry(IndexEntry(500, 4, 25)) + encode_entry(IndexEntry(100, 1, 1))
    assert [(e.offset, e.time_ns) for e in decode_index(again)] == [
        (0, 10),
        (100, 1),
        (500, 25),
        (900, 30),
    ]


def test_an_index_that_cannot_be_written_never_fails_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "serverindex1").mkdir()  # cannot be opened as a file
    with LogWriter(tmp_path / "serverlog1", index_every_bytes=1) as log:
        log.append([record(0)])
    assert (tmp_path / "serverlog1").stat().st_size == len(record(0))
    assert "log index" in caplog.text

    writer = IndexWriter(tmp_path / "serverindex2", fresh=True, every_bytes=1)
    os.close(writer._fd)  # type: ignore[arg-type]  # the next write fails with EBADF
    writer.note(0, [record(0)])
    assert writer._fd is None
    writer.close()


def test_prune_takes_the_index_with_its_log(tmp_path: Path) -> None:
    files = InstanceFiles(tmp_path, "svc", 0)
    files.create()
    for n in (1, 2, 3):
        files.write_checkpoint(n, [b"state"])
        with files.open_log(n) as log:
            log.append([record(n)])
    assert [p.name for p in files.prune(1)] == [
        "serverchkpt1",
        "serverlog1",
        "serverchkpt2",
        "serverlog2",
    ]
    assert sorted(p.name for p in files.path.iterdir() if p.name.startswith("serverindex")) == [
        "serverindex3"
    ]
    assert files.owned_paths()[-1].name == "serverindex3"


def test_entry_layout_is_the_documented_one() -> None:
    raw = encode_entry(IndexEntry(1, -1, 3))
    assert len(raw) == ENTRY_SIZE == 32
    assert struct.unpack("<QqqQ", raw)[:3] == (1, -1, 3)
