"""The coordinator's storage: log files, checkpoints, the instance lock, tail repair, prune."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.storage.files import (
    CorruptLogError,
    InstanceFiles,
    InstanceLockedError,
    LogScan,
    StorageError,
)

COMMITTER = 7
WATERMARKS = (wire.Watermark("peer", 41, 40), wire.Watermark("other", 3, 3))
TRIMS = (wire.TrimWatermark("peer", 12),)


def body(seq: int, size: int = 8) -> bytes:
    """The framed messages of a record: a fork and an impulse with distinct args."""
    args = bytes((seq + i) % 256 for i in range(size))
    return wire.encode_message(wire.IncomingRpc(3, wire.RpcType.FORK, args)) + wire.encode_message(
        wire.IncomingRpc(-2, wire.RpcType.IMPULSE, b"{}")
    )


def record(seq: int, size: int = 8, committer: int = COMMITTER) -> bytes:
    return wire.encode_disk_record(committer, seq, body(seq, size), WATERMARKS, TRIMS)


def write_log(files: InstanceFiles, n: int, seqs: range, size: int = 8) -> list[int]:
    """Write records ``seqs`` to log ``n``; return each record's start offset."""
    offsets = []
    with files.open_log(n) as log:
        for seq in seqs:
            offsets.append(log.size)
            log.append([record(seq, size)])
    return offsets


@pytest.fixture
def files(tmp_path: Path) -> InstanceFiles:
    f = InstanceFiles(tmp_path / "data", "svc", 0)
    f.create()
    return f


def scan(
    files: InstanceFiles,
    n: int,
    *,
    committer_id: int | None = COMMITTER,
    next_seq: int | None = None,
    last: bool = True,
    repair: bool = False,
) -> tuple[LogScan, list[wire.RawRecord]]:
    result = files.scan_log(
        n, committer_id=committer_id, next_seq=next_seq, last=last, repair=repair
    )
    return result, list(result)


# --- writing and reading back ------------------------------------------------------------


def test_records_round_trip_across_files(files: InstanceFiles) -> None:
    write_log(files, 1, range(0, 3))
    write_log(files, 2, range(3, 5))
    assert files.log_numbers() == [1, 2]
    first, recs1 = scan(files, 1, next_seq=0, last=False)
    second, recs2 = scan(files, 2, next_seq=first.next_seq)
    assert [r.seq for r in recs1 + recs2] == [0, 1, 2, 3, 4]
    for r in recs1 + recs2:
        assert bytes(r.body) == body(r.seq)
        assert r.header.committer_id == COMMITTER
        assert r.tail == wire.DiskRecordTail(WATERMARKS, TRIMS)
    assert first.damage is None and second.damage is None
    assert second.next_seq == 5
    assert second.end_offset == files.log_path(2).stat().st_size
    assert (first.records, second.records) == (3, 2)


def test_scan_streams_in_small_chunks_and_learns_the_committer(files: InstanceFiles) -> None:
    write_log(files, 1, range(10), size=300)
    result = LogScan(
        files.log_path(1), committer_id=None, next_seq=None, last=True, repair=False, chunk_size=7
    )
    assert [r.seq for r in result] == list(range(10))
    assert result.committer_id == COMMITTER and result.next_seq == 10


def test_batches_are_the_records_in_runs_with_the_counts_after_each(
    files: InstanceFiles,
) -> None:
    write_log(files, 1, range(600), size=40)  # more records than one run of the reader
    result = files.scan_log(1, committer_id=None, next_seq=0, last=True, repair=False)
    runs = []
    for run in result.batches():
        runs.append([r.seq for r in run])
        last = run[-1]
        assert result.records == sum(len(r) for r in runs)
        assert result.next_seq == last.seq + 1
        assert result.end_offset == last.offset + len(last.raw)
    assert len(runs) > 1
    assert [s for run in runs for s in run] == list(range(600))
    assert result.end_offset == files.log_path(1).stat().st_size and result.done


def test_append_writes_many_parts_and_large_records(files: InstanceFiles) -> None:
    big = wire.encode_disk_record(COMMITTER, 0, body(0, 3 * 1024 * 1024), WATERMARKS)
    # More buffers than one writev takes, some of them memoryviews and empty.
    parts: list[bytes | memoryview] = [
        memoryview(big)[i : i + 1000] for i in range(0, 1_500_000, 1000)
    ]
    parts.insert(5, b"")
    parts.append(memoryview(big)[1_500_000:])
    with files.open_log(1) as log:
        log.append(parts)
        assert log.size == len(big)
        log.append([record(1)])
    assert files.log_path(1).read_bytes() == big + record(1)
    result, recs = scan(files, 1)
    assert [r.seq for r in recs] == [0, 1] and result.damage is None


def test_open_log_appends_to_an_existing_file(files: InstanceFiles) -> None:
    write_log(files, 1, range(2))
    with files.open_log(1) as log:
        assert log.size == 2 * len(record(0))
        log.append([record(2)])
    assert [r.seq for r in scan(files, 1)[1]] == [0, 1, 2]


def test_closed_writer_refuses(files: InstanceFiles) -> None:
    log = files.open_log(1)
    log.close()
    log.close()
    with pytest.raises(StorageError, match="closed"):
        log.append([record(0)])


def test_scan_of_missing_and_empty_logs(files: InstanceFiles) -> None:
    with pytest.raises(StorageError, match="no log file"):
        scan(files, 1)
    files.log_path(1).touch()
    result, recs = scan(files, 1, next_seq=4)
    assert recs == [] and result.damage is None and result.next_seq == 4
    assert result.end_offset == 0


def test_a_scan_runs_once(files: InstanceFiles) -> None:
    write_log(files, 1, range(1))
    result = files.scan_log(1, committer_id=None, next_seq=None, last=True, repair=False)
    result.drain()
    with pytest.raises(StorageError, match="already"):
        list(result)


# --- checkpoints and names ----------------------------------------------------------------


def test_checkpoint_is_written_atomically_and_exactly(files: InstanceFiles) -> None:
    blob = os.urandom(200_000)
    files.write_checkpoint(1, [b"head", memoryview(blob), b""])
    assert files.read_checkpoint(1) == b"head" + blob
    files.write_checkpoint(1, [b"replaced"])
    assert files.read_checkpoint(1) == b"replaced"
    assert sorted(p.name for p in files.path.iterdir()) == ["serverchkpt1"]
    with pytest.raises(StorageError, match="no checkpoint"):
        files.read_checkpoint(2)


def test_failed_checkpoint_write_leaves_no_temp_file(files: InstanceFiles) -> None:
    class Boom:
        def __len__(self) -> int:
            raise RuntimeError("boom")

    with pytest.raises(Exception, match=r"boom|memoryview"):
        files.write_checkpoint(2, [b"ok", Boom()])  # type: ignore[list-item]
    assert list(files.path.iterdir()) == []


def test_only_well_named_files_are_listed(files: InstanceFiles) -> None:
    for name in (
        "serverlog1",
        "serverlog12",
        "serverlog0",
        "serverlog01",
        "serverlog3.tmp",
        "serverlogx",
        "serverchkpt2",
        ".serverchkpt3.abc.tmp",
        "serverchkpt",
        "serverkillFile",
    ):
        (files.path / name).touch()
    assert files.log_numbers() == [1, 12]
    assert files.checkpoint_numbers() == [2]
    assert files.log_path(3).name == "serverlog3"
    with pytest.raises(StorageError):
        files.log_path(0)


def test_listing_a_missing_directory_is_empty(tmp_path: Path) -> None:
    f = InstanceFiles(tmp_path, "nobody", 3)
    assert f.path == tmp_path / "nobody_3"
    assert f.log_numbers() == [] and f.checkpoint_numbers() == []


# --- the lock -----------------------------------------------------------------------------

HOLDER = """
import sys, pathlib
from ambrosia_py.coordinator.storage.files import InstanceFiles
files = InstanceFiles(pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
files.acquire_lock()
print("locked", flush=True)
sys.stdin.readline()
files.release_lock()
"""


@pytest.fixture
def holder(files: InstanceFiles) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(files.data_dir), files.instance, str(files.version)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_lock_held_by_another_process_names_its_pid(
    files: InstanceFiles, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(InstanceLockedError) as info:
        files.acquire_lock()
    assert info.value.pid == holder.pid
    assert f"pid {holder.pid}" in str(info.value)
    assert "'svc' version 0" in str(info.value)
    assert not files.locked
    # Let the holder release it normally; then it is ours.
    assert holder.stdin is not None
    holder.stdin.write("\n")
    holder.stdin.flush()
    assert holder.wait() == 0
    files.acquire_lock()
    assert files.locked


def test_lock_is_freed_when_the_holder_is_killed(
    files: InstanceFiles, holder: subprocess.Popen[str]
) -> None:
    with pytest.raises(InstanceLockedError):
        files.acquire_lock()
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    files.acquire_lock()
    assert files.lock_path.read_text().strip() == str(os.getpid())
    files.release_lock()


def test_lock_within_one_process(files: InstanceFiles) -> None:
    files.acquire_lock()
    files.acquire_lock()  # idempotent
    other = InstanceFiles(files.data_dir, "svc", 0)
    with pytest.raises(InstanceLockedError, match=f"pid {os.getpid()}"):
        other.acquire_lock()
    InstanceFiles(files.data_dir, "svc", 1).create()
    InstanceFiles(files.data_dir, "svc", 1).acquire_lock()  # another version is separate
    files.release_lock()
    files.release_lock()
    other.acquire_lock()
    other.release_lock()


# --- torn tails and corruption ------------------------------------------------------------

N_RECORDS = 3


def cut(path: Path, length: int) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:length])


def flip(path: Path, pos: int) -> None:
    data = bytearray(path.read_bytes())
    data[pos] ^= 0xFF
    path.write_bytes(bytes(data))


REC_LEN = len(record(0))
BODY_END = wire.HEADER_SIZE + len(body(0))  # header and messages: covered by verification


@pytest.mark.parametrize("keep", range(1, REC_LEN))
def test_truncated_last_record_is_a_torn_tail(files: InstanceFiles, keep: int) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    last = offsets[-1]
    cut(files.log_path(1), last + keep)
    result, recs = scan(files, 1)
    assert [r.seq for r in recs] == [0, 1]
    assert result.damage is not None
    assert result.damage.offset == last == result.end_offset
    assert result.damage.dropped_bytes == keep
    assert "torn tail" in result.damage.reason
    assert files.log_path(1).stat().st_size == last + keep  # only reported
    assert result.damage.kept is None
    cut_bytes = files.log_path(1).read_bytes()[last:]
    repaired, recs = scan(files, 1, repair=True)
    assert repaired.damage is not None and len(recs) == 2
    assert attrs.evolve(repaired.damage, kept=None) == result.damage
    assert files.log_path(1).stat().st_size == last
    # The cut bytes are kept beside the log, exactly, for the owner alone.
    kept = repaired.damage.kept
    assert kept == files.path / f"serverlog1.torn-{last}"
    assert kept.read_bytes() == cut_bytes
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    clean, recs = scan(files, 1)
    assert clean.damage is None and clean.next_seq == 2 and len(recs) == 2


@pytest.mark.parametrize("keep", [1, 23, 24, 30, REC_LEN - 1])
def test_truncation_in_a_file_that_is_not_last_raises(files: InstanceFiles, keep: int) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    cut(files.log_path(1), offsets[-1] + keep)
    with pytest.raises(CorruptLogError) as info:
        scan(files, 1, last=False)
    err = info.value
    assert (err.path, err.offset, err.seq) == (files.log_path(1), offsets[-1], 2)
    assert str(files.log_path(1)) in str(err) and f"offset {offsets[-1]}" in str(err)
    assert files.log_path(1).stat().st_size == offsets[-1] + keep  # never repaired


# A flipped committer or sequence id leaves the check bytes intact: not a torn write.
HEADER_IDS = set(range(0, 4)) | set(range(16, 24))


@pytest.mark.parametrize("flipped", [0xFF, 0x01, 0x80])
@pytest.mark.parametrize("pos", range(BODY_END))
def test_flip_in_the_last_record_stops_and_keeps_the_file(
    files: InstanceFiles, pos: int, flipped: int
) -> None:
    # The last record is complete and was acknowledged: a flipped byte anywhere in its
    # header or messages (the check bytes cover those) is damage, never a torn tail.
    offsets = write_log(files, 1, range(N_RECORDS))
    last = offsets[-1]
    data = bytearray(files.log_path(1).read_bytes())
    data[last + pos] ^= flipped
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError) as info:
        scan(files, 1, repair=True)
    err = info.value
    assert (err.path, err.offset) == (files.log_path(1), last)
    assert str(files.log_path(1)) in str(err) and f"offset {last}" in str(err)
    if pos not in range(16, 24):
        assert err.seq == N_RECORDS - 1 and f"seq {N_RECORDS - 1}" in str(err)
    if pos in HEADER_IDS:
        assert "intact" in err.reason
    assert files.log_path(1).read_bytes() == bytes(data)  # untouched
    assert list(files.path.glob("*.torn-*")) == []


@pytest.mark.parametrize("value", [-(REC_LEN + 1) - 1, -(REC_LEN + 300) - 1, -(10**6) - 1])
def test_a_damaged_length_in_the_last_record_is_not_a_torn_tail(
    files: InstanceFiles, value: int
) -> None:
    # The last record's length now runs past the end of the file, as a cut write's
    # would; but the record verifies with a shorter length whose watermarks end the file.
    offsets = write_log(files, 1, range(N_RECORDS))
    last = offsets[-1]
    data = bytearray(files.log_path(1).read_bytes())
    data[last + 4 : last + 8] = value.to_bytes(4, "little", signed=True)
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="damaged length field") as info:
        scan(files, 1, repair=True)
    assert (info.value.offset, info.value.seq) == (last, N_RECORDS - 1)
    assert files.log_path(1).read_bytes() == bytes(data)


@pytest.mark.parametrize(
    ("pos", "value", "what"),
    [
        (0, (99).to_bytes(4, "little"), "committer id"),
        (4, (REC_LEN + 1).to_bytes(4, "little"), "length field"),  # not in on-disk form
        (4, (-(2**30) - 1).to_bytes(4, "little", signed=True), "length 1073741824"),
        (4, (-1).to_bytes(4, "little", signed=True), "length 0"),
        (16, (7).to_bytes(8, "little"), "sequence id"),
    ],
)
def test_a_cut_record_with_an_implausible_header_is_not_a_torn_tail(
    files: InstanceFiles, pos: int, value: bytes, what: str
) -> None:
    # Cut short, but the header cannot be the one this log expects next.
    offsets = write_log(files, 1, range(N_RECORDS))
    last = offsets[-1]
    cut(files.log_path(1), last + 30)
    data = bytearray(files.log_path(1).read_bytes())
    data[last + pos : last + pos + len(value)] = value
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=f"not a record cut short: the header's {what}"):
        scan(files, 1, repair=True)
    assert files.log_path(1).read_bytes() == bytes(data)


def test_a_cut_header_is_judged_by_the_bytes_present(files: InstanceFiles) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    last = offsets[-1]
    cut(files.log_path(1), last + 2)
    flip(files.log_path(1), last + 1)  # half a committer id, and not ours
    with pytest.raises(CorruptLogError, match="committer id bytes"):
        scan(files, 1, repair=True)


@pytest.mark.parametrize("pos", range(BODY_END))
def test_flip_before_the_tail_raises(files: InstanceFiles, pos: int) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    bad = offsets[1]
    flip(files.log_path(1), bad + pos)
    size = files.log_path(1).stat().st_size
    with pytest.raises(CorruptLogError) as info:
        scan(files, 1, repair=True)
    err = info.value
    assert err.path == files.log_path(1) and err.offset == bad
    if not 16 <= pos < 24:
        assert err.seq == 1
    assert files.log_path(1).stat().st_size == size


@pytest.mark.parametrize("pos", [0, 5, 9, 20, 24, 30, BODY_END - 1])
def test_flip_in_a_file_that_is_not_last_raises(files: InstanceFiles, pos: int) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    flip(files.log_path(1), offsets[-1] + pos)
    with pytest.raises(CorruptLogError) as info:
        scan(files, 1, last=False, repair=True)
    assert info.value.offset == offsets[-1]


def test_corrupt_length_cannot_hide_the_records_behind_it(files: InstanceFiles) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    data = bytearray(files.log_path(1).read_bytes())
    # Record 1 now claims to run far past the end of the file.
    data[offsets[1] + 4 : offsets[1] + 8] = (-(10**6) - 1).to_bytes(4, "little", signed=True)
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=f"valid record follows at offset {offsets[2]}"):
        scan(files, 1, repair=True)


@pytest.mark.parametrize("damaged", [0, 1])
def test_unknown_committer_still_finds_following_records(
    files: InstanceFiles, damaged: int
) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    flip(files.log_path(1), offsets[damaged] + 30)
    with pytest.raises(CorruptLogError, match="valid record follows"):
        scan(files, 1, committer_id=None, repair=True)


def test_zero_filled_tail_is_cut(files: InstanceFiles) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    end = files.log_path(1).stat().st_size
    with files.log_path(1).open("ab") as f:
        f.write(bytes(5000))
    result, recs = scan(files, 1, repair=True)
    assert len(recs) == N_RECORDS
    assert result.damage is not None and result.damage.offset == end
    assert result.damage.dropped_bytes == 5000
    assert result.damage.kept is not None and result.damage.kept.read_bytes() == bytes(5000)
    # Zeros inside a complete last record (a lost page) are damage to a complete record:
    # that record may have been acknowledged, so recovery stops and cuts nothing.
    data = bytearray(files.log_path(1).read_bytes())
    data[offsets[-1] + 24 : offsets[-1] + 30] = bytes(6)
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="check bytes do not match"):
        scan(files, 1, repair=True)
    assert files.log_path(1).read_bytes() == bytes(data)


def test_sequence_gap_across_files_raises(files: InstanceFiles) -> None:
    write_log(files, 1, range(0, 3))
    write_log(files, 2, range(4, 5))  # 3 is missing; a single, intact record
    first = files.scan_log(1, committer_id=COMMITTER, next_seq=0, last=False, repair=False)
    first.drain()
    with pytest.raises(CorruptLogError) as info:
        scan(files, 2, next_seq=first.next_seq, repair=True)
    err = info.value
    assert (err.path, err.offset, err.seq) == (files.log_path(2), 0, 4)
    assert "where 3 was expected" in err.reason
    assert files.log_path(2).stat().st_size == len(record(4))


def test_committer_mismatch_across_files_raises(files: InstanceFiles) -> None:
    with files.open_log(1) as log:
        log.append([record(0), record(1, committer=99)])
    with pytest.raises(CorruptLogError, match="committer id 99, expected 7"):
        scan(files, 1, repair=True)


def test_watermark_count_damage_before_the_tail_raises(files: InstanceFiles) -> None:
    offsets = write_log(files, 1, range(N_RECORDS))
    # The watermark count (zigzag 2 = 0x04) of record 0 becomes 1: the stream desyncs.
    pos = offsets[0] + BODY_END
    data = bytearray(files.log_path(1).read_bytes())
    assert data[pos] == 0x04
    data[pos] = 0x02
    files.log_path(1).write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="valid record follows"):
        scan(files, 1, repair=True)


# --- prune --------------------------------------------------------------------------------


def populate(files: InstanceFiles, n: int) -> None:
    for i in range(1, n + 1):
        files.write_checkpoint(i, [f"state {i}".encode()])
        write_log(files, i, range(10 * i, 10 * i + 2))


def test_prune_keeps_what_recovery_needs(files: InstanceFiles) -> None:
    populate(files, 5)
    removed = files.prune(2)
    assert [p.name for p in removed] == [
        "serverchkpt1",
        "serverlog1",
        "serverchkpt2",
        "serverlog2",
        "serverchkpt3",
        "serverlog3",
    ]
    assert files.checkpoint_numbers() == [4, 5]
    assert files.log_numbers() == [4, 5]
    # Recovery from the oldest kept checkpoint still reads every log from there on.
    assert files.read_checkpoint(4) == b"state 4"
    for n in (4, 5):
        assert scan(files, n, next_seq=10 * n, last=n == 5)[0].records == 2
    assert files.prune(2) == []


def test_prune_keeps_the_committed_checkpoint(files: InstanceFiles) -> None:
    populate(files, 4)
    removed = files.prune(1, committed=2)
    assert sorted(p.name for p in removed) == ["serverchkpt1", "serverlog1"]
    assert files.checkpoint_numbers() == [2, 3, 4]


def test_prune_edge_cases(files: InstanceFiles) -> None:
    assert files.prune(1) == []
    write_log(files, 1, range(2))
    assert files.prune(1) == []  # no checkpoint: nothing is known to be unneeded
    populate(files, 2)
    assert files.prune(5) == []
    with pytest.raises(StorageError, match="at least 1"):
        files.prune(0)
