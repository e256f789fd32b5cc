"""Crashes of a replica's log (storage/replica_log.py): a child process killed at every
step of appends, rolls, truncations and installs, and a writer killed from outside;
every time the log reopens as a whole prefix of what was written."""

from __future__ import annotations

import os
import select
import signal
import struct
import time

import pytest

from ambrosia_py.coordinator.core.checkpoint import IcState
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replica_state import (
    ReplicaState,
    load_replica_state,
    save_replica_state,
)
from tests.test_replica_log import (
    COMMITTER,
    checkpoint_bytes,
    everything,
    files,
    record,
    records,
    reopen,
    three_logs,
)
from tests.test_replica_state import crash_at_every_step

__all__ = ["files"]  # a fixture, used through its name


# --- crashes -------------------------------------------------------------------------------


def emptied(files: InstanceFiles) -> None:
    for path in files.path.iterdir():
        path.unlink()


def intact(files: InstanceFiles, first_log: int = 1, base_seq: int = 0) -> int:
    """Open the log as recovery would; every record must be the one written at its seq.
    Returns its end."""
    with reopen(files, first_log, base_seq) as log:
        assert everything(log) == records(range(base_seq, log.end))
        return log.end


def test_a_crash_anywhere_in_appends_and_a_roll_leaves_a_whole_prefix(
    files: InstanceFiles,
) -> None:
    def setup() -> None:
        emptied(files)
        with reopen(files) as log:
            log.append(0, records(range(10)))
            log.sync()

    def work() -> None:
        with reopen(files) as log:
            log.append(10, records(range(10, 15)))
            log.append(15, [record(s, size=3000) for s in range(15, 18)])
            log.roll(2)
            log.append(18, records(range(18, 20)))
            log.sync()

    ends: set[int] = set()

    def check() -> None:
        with reopen(files) as log:
            got = everything(log)
            want = records(range(15)) + [record(s, size=3000) for s in range(15, 18)]
            want += records(range(18, 20))
            assert got == want[: log.end]
            assert log.end >= 10  # what was synced before
            ends.add(log.end)

    steps = crash_at_every_step(setup, work, check)
    assert steps > 8
    assert {10, 18, 20} <= ends and len(ends) >= 4  # before, in, between and after batches


@pytest.mark.parametrize("end", [45, 30, 5], ids=["across-files", "boundary", "first-log"])
def test_a_crash_anywhere_in_a_truncation_leaves_a_whole_prefix(
    files: InstanceFiles, end: int
) -> None:
    def setup() -> None:
        emptied(files)
        with reopen(files) as log:
            three_logs(log)

    def work() -> None:
        with reopen(files) as log:
            log.truncate(end)
            log.append(end, records(range(end, end + 2)))
            log.sync()

    seen: set[int] = set()

    def check() -> None:
        got = intact(files)
        assert got in (90, end, end + 1, end + 2) or (end < got < 90 and got % 30 == 0), got
        seen.add(got)
        with reopen(files) as log:  # the truncation, asked again, completes
            log.truncate(min(end, log.end))
            assert intact(files) == end

    assert crash_at_every_step(setup, work, check) > 5
    assert {90, end, end + 2} <= seen


def test_a_crash_anywhere_in_an_install_recovers_from_the_committed_checkpoint(
    files: InstanceFiles,
) -> None:
    data = checkpoint_bytes(files, 500)

    def setup() -> None:
        emptied(files)
        files.write_checkpoint(1, IcState(COMMITTER, 0, 0, 0, b"first").encode_parts())
        save_replica_state(files, ReplicaState(0, 1, ((1, 0),), 1))
        with reopen(files) as log:
            three_logs(log)

    def work() -> None:
        with reopen(files) as log:
            log.install_checkpoint(
                4, data, 500, lambda: save_replica_state(files, ReplicaState(0, 1, ((1, 0),), 4))
            )
            log.append(500, records(range(500, 502)))
            log.sync()

    committed: list[int] = []

    def check() -> None:
        state = load_replica_state(files)
        assert state is not None and state.checkpoint is not None
        start = IcState.decode(files.read_checkpoint(state.checkpoint), "checkpoint").next_seq
        end = intact(files, state.checkpoint, start)
        if state.checkpoint == 1:
            assert end == 90
        else:
            assert start == 500 and end in (500, 501, 502)
            with reopen(files, 4, 500) as log:
                log.drop_before(4)  # what the adapter does when it starts
            assert files.log_numbers() == [4] and files.checkpoint_numbers() == [4]
        committed.append(state.checkpoint)

    assert crash_at_every_step(setup, work, check) > 5
    assert committed[0] == 1 and committed[-1] == 4


def test_a_writer_killed_from_outside_leaves_a_whole_prefix_of_what_it_synced(
    files: InstanceFiles,
) -> None:
    """A child appends, truncates and rolls without end; it reports each durable end on
    a pipe, and is SIGKILLed from here once it has reported a few."""
    reading, writing = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(reading)
            with reopen(files) as log:
                for turn in range(1_000_000):
                    start = log.end
                    log.append(start, records(range(start, start + 7)))
                    log.truncate(start + 4)
                    log.append(start + 4, [big(s) for s in range(start + 4, start + 6)])
                    if turn % 5 == 4:
                        log.roll(log.log_number + 1)
                    os.write(writing, struct.pack("<q", log.sync()))
        finally:
            os._exit(0)  # the parent tells a death on its own by the reports missing
    os.close(writing)
    reports = bytearray()
    deadline = time.monotonic() + 60
    try:
        while len(reports) < 40 * 8 and time.monotonic() < deadline:
            if select.select([reading], [], [], 1.0)[0]:
                chunk = os.read(reading, 4096)
                if not chunk:
                    break  # it died on its own
                reports += chunk
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    while chunk := os.read(reading, 4096):  # what it reported before it died
        reports += chunk
    os.close(reading)
    assert len(reports) >= 40 * 8, "the child reported too little before the deadline"
    (last,) = struct.unpack_from("<q", reports, len(reports) - 8)
    assert last == len(reports) // 8 * 6  # six records a turn
    with reopen(files) as log:
        assert log.end >= last
        got = everything(log)
    # Everything reported durable is there, as the turns left it.
    assert got[:last] == [big(s) if s % 6 in (4, 5) else record(s) for s in range(last)]
    # After it, what the turn under way had written when the kill came: a prefix of its
    # first append (the truncation not made yet), or of what the truncation kept and
    # the append after it.
    before_cut = [record(s) for s in range(last, last + 7)]
    after_cut = [*before_cut[:4], big(last + 4), big(last + 5)]
    tail = got[last:]
    assert tail in (before_cut[: len(tail)], after_cut[: len(tail)]), len(tail)


def big(seq: int) -> bytes:
    return record(seq, size=5000)
