"""Recovery and the Spark reader hold the same records of every log, damaged or not.

Both ask the one log scanner (``ambrosia_py.wire.scanner``) what bytes that do not read as
a record are: recovery strictly (``coordinator/storage/scan.py``: it stops, or cuts a torn
tail), Spark leniently (``spark/scan.py``: damage is a row, and it reads on) or strictly
(``on_damage="fail"``). The same hand-laid damaged logs (torn tails, flipped bytes, bad
lengths, zeros after a power cut, a live tail) go to both, and they must agree:

* the records recovery holds are Spark's good rows before any damage;
* a torn tail (recovery cuts it) ends Spark's rows, with no damaged row and no error;
* damage (recovery raises :class:`CorruptLogError` at offset X) is Spark's first damaged
  row, at X, and the offset its strict mode raises at; where recovery names the valid
  record that follows, Spark's good rows go on there.

The sans-IO scanner is also driven directly, over bytes in memory.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import attrs
import pytest

from ambrosia_py import wire
from ambrosia_py.coordinator.storage.files import CorruptLogError, LogWriter
from ambrosia_py.coordinator.storage.scan import LogScan
from ambrosia_py.spark import LogDamageError, read_rows
from ambrosia_py.wire import logfile, scanner

COMMITTER = 5
MARKS = (wire.Watermark("peer", 41, 40),)
TRIMS = (wire.TrimWatermark("peer", 12),)


def record(seq: int, committer: int = COMMITTER) -> bytes:
    args = bytes((seq * 13 + i) % 256 for i in range(8 + seq * 5))
    body = wire.encode_message(wire.IncomingRpc(3, wire.RpcType.FORK, args))
    return wire.encode_disk_record(committer, seq, body, MARKS, TRIMS)


RECORDS = [record(seq) for seq in range(6)]
OFFSETS = list(itertools.accumulate(map(len, RECORDS), initial=0))  # and the end
WHOLE = b"".join(RECORDS)
LAST = OFFSETS[-2]  # where the last record starts


@attrs.frozen
class Held:
    """What recovery's scan makes of a log."""

    records: list[int]  # the offsets of the records it holds
    torn: int | None = None  # where it would cut a torn tail
    damage: int | None = None  # where it stops on damage
    follower: int | None = None  # the valid record it says follows the damage


def recovery(path: Path, *, last: bool = True) -> Held:
    scan = LogScan(path, committer_id=COMMITTER, next_seq=0, last=last, repair=False)
    held: list[int] = []
    try:
        held.extend(raw.offset for raw in scan)
    except CorruptLogError as err:
        follows = re.search(r"a valid record follows at offset (\d+)", err.reason)
        return Held(held, damage=err.offset, follower=follows and int(follows.group(1)))
    return Held(held, torn=None if scan.damage is None else scan.damage.offset)


def spark(path: Path, split: int) -> list[tuple[int, bool]]:
    """``(offset, check_ok)`` of the rows Spark's reader gives (reporting damage)."""
    rows = read_rows(path, level="record", split_bytes=split)
    return [(r["offset"], r["check_ok"]) for r in rows]


def spark_fails_at(path: Path, split: int) -> int | None:
    try:
        list(read_rows(path, level="record", on_damage="fail", split_bytes=split))
    except LogDamageError as err:
        return err.offset
    return None


WHOLE_FILE = 1 << 20  # split_bytes: the log is one piece
SPLIT = 1  # split at every indexed record that verifies


def agree(path: Path, *, last: bool = True, splits: tuple[int, ...] = (WHOLE_FILE, SPLIT)) -> Held:
    """Check that recovery and Spark agree on the log at ``path`` (read as one piece, and
    split at index entries); return what recovery made of it."""
    held = recovery(path, last=last)
    for split in splits:
        rows = spark(path, split)
        good = [at for at, ok in rows if ok]
        bad = [at for at, ok in rows if not ok]
        where = (held, split, rows)
        if held.damage is None:
            assert rows == [(at, True) for at in held.records], where
            assert spark_fails_at(path, split) is None, where
            continue
        assert [at for at in good if at < held.damage] == held.records, where
        assert bad and min(bad) == held.damage, where
        assert spark_fails_at(path, split) == held.damage, where
        if held.follower is not None:  # the damage ends there: a row starts there
            assert held.follower in {at for at, _ in rows}, where
    return held


def lay(tmp_path: Path, data: bytes, n: int = 1) -> Path:
    """``data`` as log ``n`` of an instance, with the index the coordinator wrote for the
    undamaged records (an entry at each record: Spark splits there where it verifies)."""
    path = tmp_path / "svc_0" / f"serverlog{n}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with LogWriter(path, index_every_bytes=1, preallocate=0) as writer:
        for rec in RECORDS:
            writer.write([rec])
    path.write_bytes(data)
    return path


def changed(at: int, new: bytes, data: bytes = WHOLE) -> bytes:
    return data[:at] + new + data[at + len(new) :]


def flipped(at: int, mask: int = 0xFF, data: bytes = WHOLE) -> bytes:
    return changed(at, bytes([data[at] ^ mask]), data)


def length_field(length: int) -> bytes:
    return (-length - 1).to_bytes(4, "little", signed=True)


# --- hand-laid damage ---------------------------------------------------------------------


@pytest.mark.parametrize("keep", [1, 7, 8, 23, 24, 30, len(RECORDS[-1]) - 1])
def test_a_torn_tail_is_cut_by_recovery_and_ends_spark_s_rows(tmp_path: Path, keep: int) -> None:
    held = agree(lay(tmp_path, WHOLE[: LAST + keep]))
    assert held == Held(OFFSETS[:-2], torn=LAST)


SECTIONS = len(wire.encode_disk_tail(MARKS, TRIMS))  # the watermark sections end a record


@pytest.mark.parametrize(
    ("what", "at", "mask", "torn_if_last"),
    [
        ("committer id", 0, 0x01, False),
        ("sequence id", 17, 0xFF, False),
        ("check bytes", 9, 0x10, False),
        ("messages", 30, 0x40, False),
        # The watermarks are not covered by the check bytes. A count that grows runs the
        # sections past the end of the file in the last record: a write cut in them.
        ("watermark count", -SECTIONS, 0x04, True),  # from 1 to 3 watermarks
        ("watermark name", -SECTIONS + 2, 0x80, False),  # no longer UTF-8
        ("trim watermark count", -14, 0x40, True),  # from 1 to 33
    ],
)
@pytest.mark.parametrize("k", [0, 2, 5])  # the first, a middle and the last record
def test_a_flipped_byte_is_damage_to_both(
    tmp_path: Path, k: int, what: str, at: int, mask: int, torn_if_last: bool
) -> None:
    pos = OFFSETS[k] + at if at >= 0 else OFFSETS[k + 1] + at
    held = agree(lay(tmp_path, flipped(pos, mask)))
    if k == 5 and torn_if_last:
        assert held == Held(OFFSETS[:-2], torn=LAST), what
    else:
        assert held.damage is not None and held.damage >= OFFSETS[k], what
        assert held.records == OFFSETS[: len(held.records)], what


@pytest.mark.parametrize(
    ("k", "field", "follower"),
    [
        (2, length_field(10**6), OFFSETS[3]),  # past the end: cannot hide what follows
        (2, length_field(30), OFFSETS[3]),  # too short
        (2, length_field(len(RECORDS[2]) + 5), OFFSETS[3]),  # into the next record
        (2, (100).to_bytes(4, "little"), OFFSETS[3]),  # not in on-disk form
        (5, length_field(len(RECORDS[5]) + 300), None),  # verifies shorter: damaged, not torn
        (5, length_field(30), None),
        (5, (-1).to_bytes(4, "little", signed=True), None),  # length 0
    ],
)
def test_a_bad_length_is_damage_to_both(
    tmp_path: Path, k: int, field: bytes, follower: int | None
) -> None:
    held = agree(lay(tmp_path, changed(OFFSETS[k] + 4, field)))
    assert (held.damage, held.records) == (OFFSETS[k], OFFSETS[:k])
    assert held.follower == follower
    # Spark reads on from the record that follows: nothing else was damaged.
    rows = spark(lay(tmp_path, changed(OFFSETS[k] + 4, field)), WHOLE_FILE)
    assert [at for at, ok in rows if ok] == OFFSETS[:k] + OFFSETS[k + 1 : -1]


def test_zeros_after_a_power_cut(tmp_path: Path) -> None:
    # The file system extended the file and lost the data: zeros after the records, or in
    # place of the whole last record, are a torn tail.
    assert agree(lay(tmp_path, WHOLE + bytes(4096))) == Held(OFFSETS[:-1], torn=len(WHOLE))
    zeroed = WHOLE[:LAST] + bytes(len(RECORDS[-1]))
    assert agree(lay(tmp_path, zeroed)) == Held(OFFSETS[:-2], torn=LAST)
    # A lost page inside a complete record, the last or one before it, is damage.
    page = bytes(40)
    held = agree(lay(tmp_path, changed(LAST + 24, page)))
    assert (held.damage, held.follower) == (LAST, None)
    held = agree(lay(tmp_path, changed(OFFSETS[2] + 24, page)))
    assert (held.damage, held.follower) == (OFFSETS[2], OFFSETS[3])
    # Zeros over a header and into the next one: the records after still count.
    held = agree(lay(tmp_path, changed(OFFSETS[2], bytes(len(RECORDS[2]) + 10))))
    assert (held.damage, held.follower) == (OFFSETS[2], OFFSETS[4])
    # Zeros from the middle of a record to the end of a file that was never extended:
    # the record's stated length fits, so it is a complete record that fails.
    held = agree(lay(tmp_path, WHOLE[: OFFSETS[4] + 30] + bytes(len(WHOLE) - OFFSETS[4] - 30)))
    assert held.damage == OFFSETS[4]


def test_a_cut_end_of_a_log_that_is_not_the_last_is_damage_to_both(tmp_path: Path) -> None:
    lay(tmp_path, WHOLE, n=2)  # a newer log beside it
    held = agree(lay(tmp_path, WHOLE[: LAST + 30]), last=False)
    assert (held.damage, held.records) == (LAST, OFFSETS[:-2])


@pytest.mark.parametrize("cut", [0, 1, 7, 8, 23, len(RECORDS[-1]), len(RECORDS[-1]) + 5])
def test_a_live_tail_cut_anywhere_in_its_last_write(tmp_path: Path, cut: int) -> None:
    # Preallocated: each write is its records and the end marker, written over the marker
    # of the write before; zeros to the trailer (wire.logfile).
    write = (RECORDS[-1] + logfile.END_MARKER)[:cut]
    body = WHOLE[:LAST] + write + logfile.END_MARKER[len(write) :]
    data = body + bytes(4096 - len(body) - 24) + logfile.TRAILER
    held = agree(lay(tmp_path, data))
    kept = len(RECORDS) if cut > len(RECORDS[-1]) else len(RECORDS) - 1
    assert held.records == OFFSETS[:kept] and held.damage is None


# --- every cut and every flip --------------------------------------------------------------


def test_every_cut_of_the_last_two_records(tmp_path: Path) -> None:
    for cut in range(OFFSETS[-3], len(WHOLE)):
        held = agree(lay(tmp_path, WHOLE[:cut]))
        assert held.damage is None, cut


@pytest.mark.parametrize("k", [0, 3, 5])
def test_every_flipped_byte_of_a_record(tmp_path: Path, k: int) -> None:
    for at in range(OFFSETS[k], OFFSETS[k + 1]):
        agree(lay(tmp_path, flipped(at)))
        # Flips of one bit, to a lower count or length, to invalid UTF-8, one piece.
        for mask in (0x01, 0x40, 0x80):
            agree(lay(tmp_path, flipped(at, mask)), splits=(WHOLE_FILE,))


# --- the scanner alone, over bytes in memory -------------------------------------------------


def log_bytes(data: bytes) -> scanner.LogBytes:
    return scanner.LogBytes(lambda n, at: data[at : at + n], len(data))


def test_record_at_takes_only_valid_records() -> None:
    log = log_bytes(WHOLE)
    assert [scanner.record_at(log, at) is not None for at in OFFSETS[:-1]] == [True] * 6
    assert scanner.record_at(log, OFFSETS[1], frozenset({COMMITTER + 1})) is None
    assert scanner.record_at(log, OFFSETS[1] + 1) is None
    assert scanner.record_at(log_bytes(WHOLE[:-1]), LAST) is None  # its watermarks cut
    assert scanner.record_at(log_bytes(flipped(LAST + 30)), LAST) is None


def test_the_search_finds_records_across_its_chunks() -> None:
    # A record that starts right where one chunk of the search ends and the next begins.
    gap = scanner.CHUNK - 3
    data = bytes(gap) + RECORDS[1]
    log = log_bytes(data)
    assert scanner.find_record(log, 1, frozenset({COMMITTER})) == gap
    assert scanner.find_record(log, 1, None) == gap  # any committer
    assert scanner.find_record(log, 1, frozenset({COMMITTER + 1})) is None
    assert scanner.find_record(log, 1, frozenset({COMMITTER}), stop=gap) is None


def test_the_verdicts_in_order() -> None:
    def judge(
        data: bytes,
        start: int,
        *,
        last: bool = True,
        committer: int = COMMITTER,
        seq: int = 5,
        wrong_ids: bool = False,
    ) -> scanner.Damage:
        log = log_bytes(data)
        return scanner.judge(
            log, start, "what failed", last=last, committer=committer, seq=seq, wrong_ids=wrong_ids
        )

    wrong_seq = changed(LAST + 16, (9).to_bytes(8, "little"))
    assert judge(wrong_seq, LAST, wrong_ids=True).verdict is scanner.Verdict.INTACT
    damaged = flipped(OFFSETS[4] + 30)
    found = judge(damaged, OFFSETS[4], seq=4)
    assert (found.verdict, found.follower) == (scanner.Verdict.FOLLOWED, LAST)
    assert found.reason == f"what failed; a valid record follows at offset {LAST}"
    cut = WHOLE[: LAST + 30]
    assert judge(cut, LAST, last=False).verdict is scanner.Verdict.NOT_LAST
    assert judge(cut, LAST).torn
    not_ours = judge(cut, LAST, committer=COMMITTER + 1)
    assert not_ours.verdict is scanner.Verdict.NOT_TORN
    assert not_ours.problem is not None and "committer id bytes" in not_ours.problem
    assert judge(cut, LAST, seq=6).verdict is scanner.Verdict.NOT_TORN
    assert judge(WHOLE + bytes(100), len(WHOLE)).torn
