"""A replica's log over real files: appends, reads by seq, truncation, rolls, checkpoint
installs, refusals, and crashes (a child process SIGKILLed at every file system change
of a step, and one killed from outside while it appends)."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import xxhash

from ambrosia_py import wire
from ambrosia_py.coordinator.core.checkpoint import IcState
from ambrosia_py.coordinator.storage.files import CorruptLogError, InstanceFiles, StorageError
from ambrosia_py.coordinator.storage.index import INDEX_PREFIX
from ambrosia_py.coordinator.storage.replica_log import (
    SPARSE_BYTES,
    RecordRefusedError,
    ReplicaLog,
)
from ambrosia_py.coordinator.storage.replica_state import (
    ReplicaState,
    load_replica_state,
    save_replica_state,
)

COMMITTER = 7


def record(seq: int, size: int | None = None) -> bytes:
    """The on-disk record ``seq`` as the coordinator's intake seals one: the disk header
    from ``record_headers`` over the framed messages, then the watermark tail."""
    n = 8 + seq * 37 % 300 if size is None else size
    args = bytes((seq + i) % 256 for i in range(n))
    body = [
        wire.encode_message(wire.IncomingRpc(3, wire.RpcType.FORK, args)),
        wire.encode_message(wire.IncomingRpc(-2, wire.RpcType.IMPULSE, b"{}")),
    ]
    _, disk_header = wire.record_headers(COMMITTER, seq, body)
    tail = wire.encode_marks_tail({"peer": seq + 1}) if seq % 3 else wire.encode_disk_tail()
    return b"".join([disk_header, *body, tail])


def records(seqs: range) -> list[bytes]:
    return [record(s) for s in seqs]


# The reference's example message (reference ambrosia.md, *RPC layouts*): an incoming
# impulse, method 3, with the raw bytes 01 02 behind a throwaway byte.
REFERENCE_IMPULSE = bytes.fromhex("0e00000602ff0102")


def hand_record(seq: int, committer: int = COMMITTER) -> bytes:
    """An on-disk record built from the reference layout (*Files on disk*), not by our
    encoder: header ``i32 committer | i32 -length-1 | u64 XXH64(messages) | i64 seq``,
    the messages, then one watermark ``("peer", 41, 40)`` and no trim watermarks."""
    body = REFERENCE_IMPULSE
    header = struct.pack(
        "<iiQq", committer, -(24 + len(body)) - 1, xxhash.xxh64_intdigest(body), seq
    )
    watermarks = b"\x02" + b"\x08" + b"peer" + struct.pack("<qq", 41, 40)  # zigzag 1, zigzag 4
    return header + body + watermarks + b"\x00"


@pytest.fixture
def files(tmp_path: Path) -> InstanceFiles:
    f = InstanceFiles(tmp_path / "data", "svc", 0)
    f.create()
    return f


@pytest.fixture
def opened(files: InstanceFiles) -> Iterator[ReplicaLog]:
    log = ReplicaLog.open(files, first_log=1, committer_id=COMMITTER, base_seq=0)
    yield log
    log.close()


def reopen(files: InstanceFiles, first_log: int = 1, base_seq: int = 0) -> ReplicaLog:
    return ReplicaLog.open(files, first_log=first_log, committer_id=COMMITTER, base_seq=base_seq)


def everything(log: ReplicaLog) -> list[bytes]:
    return log.read(log.base, 1 << 40)


def file_bytes(files: InstanceFiles) -> dict[str, bytes]:
    """Every log file's bytes, by name."""
    return {p.name: p.read_bytes() for p in sorted(files.path.glob("serverlog*"))}


# --- the record format -------------------------------------------------------------------


def test_a_hand_built_record_is_the_encoders_and_the_log_keeps_it_verbatim(
    files: InstanceFiles, opened: ReplicaLog
) -> None:
    hand = hand_record(0)
    assert wire.encode_message(wire.IncomingRpc(3, wire.RpcType.IMPULSE, b"\xff\x01\x02")) == (
        REFERENCE_IMPULSE
    )
    marks = [wire.Watermark("peer", 41, 40)]
    assert wire.encode_disk_record(COMMITTER, 0, REFERENCE_IMPULSE, marks) == hand
    opened.append(0, [hand, record(1), hand_record(2)])
    assert opened.sync() == 3
    assert opened.read(0, 1 << 20) == [hand, record(1), hand_record(2)]
    opened.close()
    with reopen(files) as again:
        assert everything(again) == [hand, record(1), hand_record(2)]


# --- appending, syncing, reading -------------------------------------------------------


def test_round_trip_across_logs_and_rolls(files: InstanceFiles, opened: ReplicaLog) -> None:
    assert (opened.base, opened.end, opened.durable_end, opened.log_number) == (0, 0, 0, 1)
    opened.append(0, records(range(0, 40)))
    assert (opened.end, opened.durable_end) == (40, 0)
    assert opened.sync() == 40
    opened.roll(2)
    opened.append(40, [memoryview(r) for r in records(range(40, 45))])
    opened.roll(5)  # numbers may skip; the roll made log 2 durable first
    assert opened.durable_end == 45
    opened.append(45, records(range(45, 90)))
    opened.append(90, records(range(90, 91)))
    assert opened.sync() == 91
    assert files.log_numbers() == [1, 2, 5]
    assert everything(opened) == records(range(91))
    for start in (0, 39, 40, 44, 45, 60, 90):
        assert opened.read(start, 1 << 30) == records(range(start, 91))
    assert opened.read(91, 1 << 20) == []
    opened.close()
    with reopen(files) as again:
        assert (again.base, again.end, again.durable_end, again.log_number) == (0, 91, 91, 5)
        assert everything(again) == records(range(91))
        again.append(91, records(range(91, 95)))
        assert everything(again) == records(range(95))


def test_reads_stop_at_max_bytes_but_give_a_large_record_alone(opened: ReplicaLog) -> None:
    opened.append(0, records(range(0, 10)))
    big = record(10, size=200_000)
    opened.append(10, [big, record(11)])
    three = sum(len(r) for r in records(range(2, 5)))
    assert opened.read(2, three) == records(range(2, 5))
    assert opened.read(2, three - 1) == records(range(2, 4))
    assert opened.read(2, 0) == [record(2)]
    assert opened.read(9, 1000) == [record(9)]
    assert opened.read(10, 1000) == [big]
    assert opened.read(10, len(big) + len(record(11))) == [big, record(11)]


def test_reads_from_every_seq_of_a_log_with_many_index_entries(opened: ReplicaLog) -> None:
    # About 300 KiB in one file: several sparse index entries to start reads from.
    opened.append(0, [record(s, size=1000) for s in range(300)])
    total = sum(len(record(s, size=1000)) for s in range(300))
    assert total > 4 * SPARSE_BYTES
    for seq in range(300):
        got = opened.read(seq, 3 * 1100)
        assert got == [record(s, size=1000) for s in range(seq, min(seq + 3, 300))], seq


def test_reads_below_the_base_are_empty_and_past_the_end_refused(files: InstanceFiles) -> None:
    with reopen(files, first_log=4, base_seq=100) as log:
        assert (log.base, log.end, log.log_number) == (100, 100, 4)
        log.append(100, records(range(100, 103)))
        assert files.log_numbers() == [4]  # the first append created it
        assert log.read(99, 1 << 20) == []
        assert log.read(100, 1 << 20) == records(range(100, 103))
        with pytest.raises(StorageError, match="cannot read from seq 104: the log ends at 103"):
            log.read(104, 1 << 20)


def test_the_sidecar_index_is_only_a_hint(files: InstanceFiles, opened: ReplicaLog) -> None:
    opened.append(0, [record(s, size=2000) for s in range(100)])
    opened.roll(2)
    opened.append(100, [record(s, size=2000) for s in range(100, 200)])
    opened.close()
    (files.path / f"{INDEX_PREFIX}1").write_bytes(b"AMBIDX01" + bytes(range(256)) * 3)
    (files.path / f"{INDEX_PREFIX}2").unlink()
    with reopen(files) as again:
        assert again.read(150, 1 << 30) == [record(s, size=2000) for s in range(150, 200)]
        assert again.read(3, 2000) == [record(3, size=2000)]
        again.append(200, records(range(200, 205)))
        assert everything(again)[-5:] == records(range(200, 205))


def test_reads_verify_what_they_return(files: InstanceFiles, opened: ReplicaLog) -> None:
    opened.append(0, records(range(20)))
    opened.sync()
    path = files.log_path(1)
    data = bytearray(path.read_bytes())
    at = sum(len(r) for r in records(range(12))) + 30  # inside record 12's messages
    data[at] ^= 0xFF
    with path.open("r+b") as f:
        f.write(data)
    assert opened.read(0, len(record(0))) == [record(0)]  # before the damage: still read
    assert opened.read(11, len(record(11))) == [record(11)]
    where = rf"serverlog1 at offset {at - 30}, record seq 12: check bytes"
    with pytest.raises(CorruptLogError, match=where):
        opened.read(5, 1 << 20)


def test_open_cuts_a_torn_tail_of_the_last_log_and_refuses_damage_before(
    files: InstanceFiles, opened: ReplicaLog
) -> None:
    opened.append(0, records(range(10)))
    opened.roll(2)
    opened.append(10, records(range(10, 20)))
    opened.close()
    last = files.log_path(2)
    with last.open("r+b") as f:
        f.truncate(last.stat().st_size - 5)  # record 19 cut short
    with reopen(files) as again:
        assert again.end == 19
        assert everything(again) == records(range(19))
    first = files.log_path(1)
    data = bytearray(first.read_bytes())
    data[len(record(0)) + 40] ^= 0x01
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=r"serverlog1 at offset \d+, record seq 1"):
        reopen(files)


# --- refusals ----------------------------------------------------------------------------


def _wrong_committer(seq: int) -> bytes:
    return hand_record(seq, committer=COMMITTER + 1)


def _bad_check(seq: int) -> bytes:
    r = bytearray(record(seq))
    r[30] ^= 0x40
    return bytes(r)


@pytest.mark.parametrize(
    ("batch", "match"),
    [
        (lambda: records(range(6, 8)), r"refused batch: it starts at seq 6, the log ends at 5$"),
        (
            lambda: [record(5), record(7)],
            r"record 1 of the batch \(seq 6\): sequence id 7 where 6 was expected",
        ),
        (
            lambda: [record(5), _wrong_committer(6)],
            rf"record 1 of the batch \(seq 6\): committer id {COMMITTER + 1}, expected {COMMITTER}",
        ),
        (lambda: [record(5), record(6)[:-3]], r"record 1 of the batch \(seq 6\).*torn"),
        (lambda: [record(5)[:20]], r"record 0 of the batch \(seq 5\): 20 bytes, shorter"),
        (
            lambda: [record(5), record(6) + b"\x00\x00"],
            r"record 1 of the batch \(seq 6\): its length field and watermarks end at byte "
            rf"{len(record(6))}, but {len(record(6)) + 2} bytes were given",
        ),
        (
            lambda: [record(5), record(6) + record(7)],
            r"record 1 of the batch \(seq 6\): its length field",
        ),
        (lambda: [_bad_check(5)], r"record 0 of the batch \(seq 5\): check bytes"),
    ],
    ids=["first-seq", "gap", "committer", "torn", "short", "long", "two-in-one", "check"],
)
def test_refused_batches_write_nothing(
    files: InstanceFiles, opened: ReplicaLog, batch: Callable[[], list[bytes]], match: str
) -> None:
    opened.append(0, records(range(5)))
    opened.sync()
    before = file_bytes(files)
    given = batch()
    first_seq = 6 if match.startswith("refused batch") else 5  # the log's end, 5, but once
    with pytest.raises(RecordRefusedError, match=match.removesuffix("$")) as caught:
        opened.append(first_seq, given)
    assert str(caught.value).endswith("; nothing was written")
    assert opened.end == 5
    assert file_bytes(files) == before
    opened.append(5, records(range(5, 7)))  # the log goes on as if nothing happened
    assert everything(opened) == records(range(7))


# --- another writer's records --------------------------------------------------------------


def test_noted_records_of_another_writer_are_read(files: InstanceFiles) -> None:
    with reopen(files) as log:
        log.append(0, records(range(3)))
        log.roll(2)
        assert log.sync() == 3
        writer = files.open_log(2)  # the primary's commit path, writing on its own
        for seq in range(3, 8):
            offset = writer.size
            writer.append([record(seq)])
            log.note(seq, 2, offset, len(record(seq)))
        assert (log.end, log.durable_end) == (8, 3)
        log.synced(8)
        assert log.durable_end == 8
        writer.close()
        writer = files.open_log(3)  # a roll of the other writer's
        log.note(8, 3, 0, len(record(8)))
        writer.append([record(8)])
        assert everything(log) == records(range(9))
        with pytest.raises(
            StorageError, match=r"serverlog3: at offset 5, where the next record goes at offset \d+"
        ):
            log.note(9, 3, 5, 40)
        with pytest.raises(StorageError, match=r"noted record seq 10 in .*: the log ends at 9"):
            log.note(10, 3, len(record(8)), 40)
        with pytest.raises(StorageError, match="past the log's end 9"):
            log.synced(10)
        writer.close()
        log.roll(4)
        log.append(9, records(range(9, 11)))  # appends of its own again, to a log of its own
        with pytest.raises(StorageError, match="this log appends to that file itself"):
            log.note(11, 4, sum(len(r) for r in records(range(9, 11))), 40)
    with reopen(files) as again:
        assert everything(again) == records(range(11))


# --- truncation --------------------------------------------------------------------------


def three_logs(log: ReplicaLog) -> None:
    """Records 0-29 in log 1, 30-59 in log 2, 60-89 in log 3, all synced."""
    for n, start in ((1, 0), (2, 30), (3, 60)):
        if n > 1:
            log.roll(n)
        log.append(start, records(range(start, start + 30)))
    log.sync()


TRUNCATIONS = {  # where to, and the logs left
    "last-log": (75, [1, 2, 3]),
    "across-files": (45, [1, 2]),
    "boundary-3": (60, [1, 2, 3]),
    "boundary-2": (30, [1, 2]),
    "first-log": (3, [1]),
    "everything": (0, [1]),
    "none": (90, [1, 2, 3]),
}


@pytest.mark.parametrize(("end", "logs"), TRUNCATIONS.values(), ids=TRUNCATIONS.keys())
def test_truncate_keeps_the_records_below_end(
    files: InstanceFiles, opened: ReplicaLog, end: int, logs: list[int]
) -> None:
    three_logs(opened)
    opened.append(90, records(range(90, 95)))  # not yet synced: a truncation keeps them durably
    opened.truncate(end)
    assert (opened.end, opened.durable_end, opened.log_number) == (end, end, logs[-1])
    assert files.log_numbers() == logs
    assert [p.name for p in sorted(files.path.glob(f"{INDEX_PREFIX}*"))] == [
        f"{INDEX_PREFIX}{n}" for n in logs if files.log_path(n).stat().st_size
    ]
    assert everything(opened) == records(range(end))
    opened.append(end, records(range(end, end + 4)))
    opened.sync()
    opened.close()
    with reopen(files) as again:
        assert (again.end, again.log_number) == (end + 4, logs[-1])
        assert everything(again) == records(range(end + 4))


def test_truncate_refuses_outside_the_log(files: InstanceFiles) -> None:
    with reopen(files, first_log=2, base_seq=50) as log:
        log.append(50, records(range(50, 55)))
        with pytest.raises(
            StorageError, match=r"cannot truncate to seq 49: the log holds 50 \.\. 54"
        ):
            log.truncate(49)
        with pytest.raises(StorageError, match="cannot truncate to seq 56"):
            log.truncate(56)
        log.truncate(50)
        assert (log.end, log.durable_end) == (50, 50)
        assert log.read(50, 100) == []


# --- rolls and installs ----------------------------------------------------------------------


def test_roll_refuses_a_lower_number_or_a_log_with_records(
    files: InstanceFiles, opened: ReplicaLog
) -> None:
    opened.append(0, records(range(2)))
    with pytest.raises(StorageError, match="cannot roll to log 1: appends go to log 1"):
        opened.roll(1)
    other = files.open_log(3)
    other.append([record(0)])
    other.close()
    with pytest.raises(StorageError, match="serverlog3: it holds records already"):
        opened.roll(3)


def checkpoint_bytes(files: InstanceFiles, next_seq: int, committer: int = COMMITTER) -> bytes:
    """A real checkpoint file, as the coordinator writes one (here in another replica's
    directory), read back whole."""
    source = InstanceFiles(files.data_dir / "primary", "svc", 0)
    source.create()
    state = IcState(committer, next_seq, 4, 4, b"the service's state", {"peer": 9}, {}, {})
    source.write_checkpoint(9, state.encode_parts())
    return source.read_checkpoint(9)


def test_install_checkpoint_starts_over_and_drops_the_old_files(files: InstanceFiles) -> None:
    files.write_checkpoint(1, IcState(COMMITTER, 0, 0, 0, b"first").encode_parts())
    save_replica_state(files, ReplicaState(0, 1, ((1, 0),), 1))
    data = checkpoint_bytes(files, 500)
    with reopen(files) as log:
        three_logs(log)
        log.append(90, records(range(90, 92)))

        def commit() -> None:
            assert files.log_numbers() == [1, 2, 3, 4] and files.checkpoint_numbers() == [1, 4]
            assert (log.base, log.end, log.durable_end, log.log_number) == (500, 500, 500, 4)
            save_replica_state(files, ReplicaState(0, 1, ((1, 0),), 4))

        state = log.install_checkpoint(4, data, 500, commit)
        assert (state.next_seq, bytes(state.blob)) == (500, b"the service's state")
        assert files.log_numbers() == [4] and files.checkpoint_numbers() == [4]
        assert files.read_checkpoint(4) == data
        assert log.read(10, 1 << 20) == []
        log.append(500, records(range(500, 503)))
        log.sync()
    saved = load_replica_state(files)
    assert saved is not None and saved.checkpoint == 4
    start = IcState.decode(files.read_checkpoint(4), "checkpoint 4").next_seq
    with reopen(files, first_log=4, base_seq=start) as again:
        assert (again.base, again.end) == (500, 503)
        assert everything(again) == records(range(500, 503))


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda d: d[:-1], "present"),
        (lambda d: b"XMBRIC" + d[6:], "not a coordinator checkpoint"),
        (lambda d: d[:20], "shorter than its header"),
        (lambda d: d[:6] + b"\x09\x00" + d[8:], "unknown checkpoint format version 9"),
    ],
    ids=["cut", "magic", "header", "version"],
)
def test_install_refuses_damaged_checkpoints_and_changes_nothing(
    files: InstanceFiles, opened: ReplicaLog, damage: Callable[[bytes], bytes], match: str
) -> None:
    opened.append(0, records(range(5)))
    opened.sync()
    before = file_bytes(files)
    data = damage(checkpoint_bytes(files, 500))
    with pytest.raises(StorageError, match=f"refused checkpoint 2 to install: .*({match})"):
        opened.write_checkpoint_for_install(2, data, 500)
    assert files.checkpoint_numbers() == [] and file_bytes(files) == before
    assert (opened.base, opened.end) == (0, 5)


def test_install_refuses_the_wrong_seq_committer_or_number(
    files: InstanceFiles, opened: ReplicaLog
) -> None:
    opened.append(0, records(range(5)))
    with pytest.raises(StorageError, match="stands before record 500, not 501"):
        opened.write_checkpoint_for_install(2, checkpoint_bytes(files, 500), 501)
    with pytest.raises(StorageError, match=f"committer id 3, this log's is {COMMITTER}"):
        opened.write_checkpoint_for_install(2, checkpoint_bytes(files, 500, committer=3), 500)
    with pytest.raises(StorageError, match="its log must come after log 1"):
        opened.write_checkpoint_for_install(1, checkpoint_bytes(files, 500), 500)
    with pytest.raises(StorageError, match="no checkpoint 1 to start from"):
        opened.drop_before(1)
    assert files.checkpoint_numbers() == [] and opened.end == 5
