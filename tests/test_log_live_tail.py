"""The live tail of a log being written (``wire.logfile``): the writer preallocates, marks
where its records end and truncates on close; the log scan (recovery) and the Spark reader
find the records' end, keep every whole write and cut a write a crash cut short."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.coordinator.storage.files import (
    PREALLOCATE_BYTES,
    CorruptLogError,
    InstanceFiles,
    LogWriter,
    log_data_size,
)
from ambrosia_py.spark.fs import resolve
from ambrosia_py.spark.scan import Span, read_span, whole_end
from ambrosia_py.wire import logfile

COMMITTER = 11
STEP = 4096  # a small preallocation step, so that tests cross it often


def record(seq: int, args: bytes, marks: tuple[wire.Watermark, ...] = ()) -> bytes:
    body = wire.encode_message(wire.IncomingRpc(3, wire.RpcType.FORK, args))
    return wire.encode_disk_record(COMMITTER, seq, body, marks)


def live_file(path: Path, whole: list[bytes], last: bytes, cut: int) -> None:
    """A log as a writer with step :data:`STEP` leaves it when a crash cuts its last write
    (``last`` and its end marker) after ``cut`` bytes: over the end marker of the write
    before, if there was one."""
    data = b"".join(whole)
    write = (last + logfile.END_MARKER)[:cut]
    before = logfile.END_MARKER if whole else b""
    room = -(-(len(data) + len(last) + 2 * 24) // STEP) * STEP
    body = data + write + before[len(write) :]
    path.write_bytes(body + bytes(room - 24 - len(body)) + logfile.TRAILER)


def pread_of(data: bytes):  # type: ignore[no-untyped-def]
    return lambda n, at: data[at : at + n]


# --- where the records end ----------------------------------------------------------------


def test_a_log_at_rest_ends_at_its_size() -> None:
    data = record(0, b"a") + record(1, bytes(40))  # zeros at the end are a record's own
    assert logfile.data_end(pread_of(data), len(data)) == len(data)


def test_a_live_tail_ends_where_the_marker_starts() -> None:
    data = record(0, b"a") + record(1, bytes(40))
    live = data + logfile.END_MARKER + bytes(100) + logfile.TRAILER
    assert logfile.data_end(pread_of(live), len(live)) == len(data)
    empty = bytes(100) + logfile.TRAILER
    assert logfile.data_end(pread_of(empty), len(empty)) == 0


def test_an_old_trailer_left_by_a_crash_while_growing_is_skipped() -> None:
    data = record(0, b"a")
    live = data + logfile.END_MARKER + bytes(50) + logfile.TRAILER + bytes(70) + logfile.TRAILER
    assert logfile.data_end(pread_of(live), len(live)) == len(data)


@pytest.mark.parametrize("k", range(1, 24))
def test_a_write_cut_in_its_marker_keeps_its_record(k: int) -> None:
    data = record(0, b"a") + record(1, b"b")
    live = data + logfile.END_MARKER[:k] + bytes(64) + logfile.TRAILER
    assert logfile.data_end(pread_of(live), len(live)) == len(data)


def test_a_write_cut_in_its_record_ends_inside_it() -> None:
    first, last = record(0, b"a"), record(1, b"b", (wire.Watermark("peer", 5, 5),))
    for cut in range(1, len(last) + 1):
        live = first + last[:cut] + bytes(64) + logfile.TRAILER
        end = logfile.data_end(pread_of(live), len(live))
        assert len(first) < end < len(first) + len(last), cut


# --- recovery and the Spark reader agree on every cut of the last write --------------------

_args = st.one_of(st.binary(max_size=40), st.integers(0, 300).map(bytes))  # zeros too
_marks = st.lists(
    st.builds(
        wire.Watermark,
        st.sampled_from(["p", "peer-2"]),
        st.integers(0, 2**40),
        st.integers(0, 2**40),
    ),
    max_size=2,
).map(tuple)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(_args, _marks), min_size=1, max_size=5),
    st.data(),
)
def test_every_cut_of_the_last_write_keeps_exactly_the_whole_records(
    tmp_path_factory: pytest.TempPathFactory,
    recs: list[tuple[bytes, tuple[wire.Watermark, ...]]],
    data: st.DataObject,
) -> None:
    encoded = [record(seq, args, marks) for seq, (args, marks) in enumerate(recs)]
    *whole, last = encoded
    cut = data.draw(st.integers(0, len(last) + len(logfile.END_MARKER)), label="cut")
    # The record of a write cut before its marker was never synced: it goes. One whose
    # marker was begun was whole: it stays.
    kept = len(encoded) if cut > len(last) else len(whole)
    directory = tmp_path_factory.mktemp("live")
    files = InstanceFiles(directory, "svc", 0)
    files.create()
    path = files.log_path(1)
    live_file(path, whole, last, cut)

    location = resolve(path)
    spark = [r for r in read_span(location, Span(0, location.data_size(), final=True))]
    assert [r.seq for r in spark] == list(range(kept)) and all(r.check_ok for r in spark)

    scan = files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=True, repair=True)
    assert [r.header.seq for r in scan] == list(range(kept))
    # Repaired: the file is the whole records, as at rest.
    assert path.read_bytes() == b"".join(encoded[:kept])
    assert (scan.damage is None) == (cut == 0 or cut > len(last))


def test_a_cut_write_in_a_log_that_is_not_the_last_is_corruption(tmp_path: Path) -> None:
    files = InstanceFiles(tmp_path, "svc", 0)
    files.create()
    last = record(1, b"b")
    live_file(files.log_path(1), [record(0, b"a")], last, len(last) // 2)
    with pytest.raises(CorruptLogError):
        files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=False, repair=False).drain()


# --- the writer ----------------------------------------------------------------------------


def test_the_writer_preallocates_marks_and_truncates_on_close(tmp_path: Path) -> None:
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate here: logs are appended")
    path = tmp_path / "serverlog1"
    written: list[bytes] = []
    with LogWriter(path, index_every_bytes=0, preallocate=STEP) as log:
        for seq in range(60):  # about 3.5 steps of 4 KiB
            rec = record(seq, bytes([seq]) * 200)
            log.append([rec])
            written.append(rec)
            data = path.read_bytes()
            end = sum(map(len, written))
            assert log.size == end
            assert len(data) % STEP == 0 and data.endswith(logfile.TRAILER)
            assert data[:end] == b"".join(written)
            assert data[end : end + 24] == logfile.END_MARKER
            # One trailer, at the end: the old ones were zeroed as the file grew.
            assert data.count(logfile.TRAILER) == 1
            assert logfile.data_end(pread_of(data), len(data)) == end
        # The space ahead is allocated, not a hole.
        assert os.stat(path).st_blocks * 512 >= len(path.read_bytes()) - 4096
    assert path.read_bytes() == b"".join(written)
    assert log_data_size(path) == end


def test_a_writer_reopening_a_live_log_writes_after_its_records(tmp_path: Path) -> None:
    path = tmp_path / "serverlog1"
    with LogWriter(path, index_every_bytes=0, preallocate=STEP) as first:
        first.append([record(0, b"a")])
        crashed = path.read_bytes()  # the file as a crash would leave it
    path.write_bytes(crashed)
    second = LogWriter(path, index_every_bytes=0, preallocate=STEP)
    assert second.size == len(record(0, b"a"))
    second.append([record(1, b"b" * 5000)])  # grows the file past its first step
    second.close()
    assert path.read_bytes() == record(0, b"a") + record(1, b"b" * 5000)


def _reopen_and_die_after_the_trailer(path: Path) -> None:
    """In a child: reopen a log at rest and grow it, SIGKILLing itself right after the
    first trailer reaches the file (before the new record does)."""
    import ambrosia_py.coordinator.storage.files as files_module

    real = os.pwrite

    def pwrite(fd: int, data: bytes, offset: int) -> int:
        n = real(fd, data, offset)
        if data == logfile.TRAILER:
            os.kill(os.getpid(), signal.SIGKILL)
        return n

    files_module.os.pwrite = pwrite  # type: ignore[attr-defined]
    writer = LogWriter(path, index_every_bytes=0, preallocate=STEP)
    writer.append([record(2, b"c")])


def test_a_log_at_rest_reopened_keeps_its_last_record_through_a_crash(tmp_path: Path) -> None:
    """A writer that reopens a log at rest marks where its records end before the file
    first reads as live: killed in between, the scan still finds every record."""
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate here: logs are appended")
    files = InstanceFiles(tmp_path, "x", 0)
    files.create()
    path = files.log_path(1)
    with LogWriter(path, index_every_bytes=0, preallocate=STEP) as first:
        first.append([record(0, b"a"), record(1, b"b")])
    assert log_data_size(path) == len(record(0, b"a") + record(1, b"b"))  # at rest
    child = multiprocessing.get_context("fork").Process(
        target=_reopen_and_die_after_the_trailer, args=(path,)
    )
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert path.read_bytes().endswith(logfile.TRAILER)  # it died with the file live
    scan = files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=True, repair=False)
    scan.drain()
    assert (scan.records, scan.damage) == (2, None)


def test_without_preallocation_the_writer_appends_the_released_form(tmp_path: Path) -> None:
    path = tmp_path / "serverlog1"
    with LogWriter(path, index_every_bytes=0, preallocate=0) as log:
        log.append([record(0, b"a")])
        assert path.read_bytes() == record(0, b"a")


def test_the_default_step_is_what_the_writer_grows_by(tmp_path: Path) -> None:
    if not hasattr(os, "posix_fallocate"):
        pytest.skip("no posix_fallocate here: logs are appended")
    path = tmp_path / "serverlog1"
    with LogWriter(path, index_every_bytes=0) as log:
        log.append([record(0, b"a")])
        assert path.stat().st_size == PREALLOCATE_BYTES


def test_a_clean_live_tail_is_truncated_only_by_a_repairing_scan(tmp_path: Path) -> None:
    files = InstanceFiles(tmp_path, "svc", 0)
    files.create()
    rec = record(0, b"a")
    live_file(files.log_path(1), [], rec, len(rec) + 24)
    looked = files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=True, repair=False)
    assert [r.header.seq for r in looked] == [0] and looked.damage is None
    assert files.log_path(1).stat().st_size == STEP  # only read
    repaired = files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=True, repair=True)
    assert [r.header.seq for r in repaired] == [0] and repaired.damage is None
    assert files.log_path(1).read_bytes() == rec
    location = resolve(files.log_path(1))
    assert whole_end(location, 0, location.data_size()) == len(rec)


# --- a reader beside the writer -------------------------------------------------------------


class Moving:
    """A file that becomes ``after`` once ``reads`` preads of ``before`` were served: a
    writer truncating or growing it between a reader's reads."""

    def __init__(self, before: bytes, after: bytes, reads: int) -> None:
        self.data, self.after, self.left = before, after, reads

    def pread(self, n: int, at: int) -> bytes:
        got = self.data[at : at + n]
        self.left -= 1
        if self.left == 0:
            self.data = self.after
        return got

    def size(self) -> int:
        return len(self.data)


def test_a_log_closed_while_its_end_is_read_keeps_its_last_record() -> None:
    # Records end in zero bytes; the writer's close truncates the live tail away. Read
    # after the truncation, the zeros skipped backwards reach into the last record.
    data = record(0, b"a") + record(1, bytes(40))
    live = data + logfile.END_MARKER + bytes(100) + logfile.TRAILER
    for reads in range(1, 6):
        unsettled = Moving(live, data, reads)
        end = logfile.data_end(unsettled.pread, unsettled.size())
        settled = Moving(live, data, reads)
        end_now, size = logfile.settled_data_end(settled.pread, settled.size)
        assert end_now == len(data) and size in {len(live), len(data)}
        if reads == 1:  # the trailer read, then the truncation: the race itself
            assert end < len(data)


def test_a_log_grown_while_its_end_is_read_ends_at_its_records() -> None:
    first = record(0, b"a")
    data = first + record(1, b"b")
    live = first + logfile.END_MARKER + bytes(40) + logfile.TRAILER
    # Grown: the new trailer written at the new end, the old one zeroed.
    grown = data + logfile.END_MARKER + bytes(len(live) - len(data) - 24 + 64) + logfile.TRAILER
    for reads in range(1, 6):
        moving = Moving(live, grown, reads)
        end, size = logfile.settled_data_end(moving.pread, moving.size)
        assert (end, size) in {(len(first), len(live)), (len(data), len(grown))}
        assert size == len(moving.data)


def test_a_file_that_never_holds_still_is_refused() -> None:
    a = record(0, b"a") + logfile.END_MARKER + bytes(100) + logfile.TRAILER
    sizes = iter(range(len(a), len(a) + 100))
    with pytest.raises(logfile.FileMovedError, match="changed size"):
        logfile.settled_data_end(pread_of(a), lambda: next(sizes))


def test_a_scan_beside_a_writer_that_closes_sees_every_record(tmp_path: Path) -> None:
    """A real writer and a real scan, the writer closing while the scan looks for the end:
    the scan finds every record, never a torn tail. A large preallocation makes the scan
    skip zeros for a while, so that the close falls in the middle of its look."""
    files = InstanceFiles(tmp_path, "x", 0)
    files.create()
    for attempt in range(8):
        path = files.log_path(attempt + 1)
        writer = LogWriter(path, index_every_bytes=0, preallocate=64 * 2**20)
        writer.append([record(0, b"a"), record(1, bytes(40))])
        closer = threading.Thread(target=writer.close)
        closer.start()
        scan = files.scan_log(
            attempt + 1, committer_id=COMMITTER, next_seq=0, last=True, repair=False
        ).drain()
        closer.join()
        assert (scan.records, scan.damage) == (2, None)
