"""The two-stage group commit: a record is forwarded only after a sync that began after it
was written, in order, and a failed sync stops everything after it. ``append`` is the
one way in, for a record alone (the latency path) and for a busy round."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from ambrosia_py.coordinator.core.commit import INLINE_MAX_BYTES, CommitPipeline
from ambrosia_py.coordinator.storage.files import LogWriter, StorageError


class _RecordingWriter(LogWriter):
    """A real log file that notes when each write ended and each sync began and ended."""

    def __init__(
        self,
        path: Path,
        events: list[tuple[str, int]],
        fail_sync: int = -1,
        hold_first_sync: int = 0,
    ) -> None:
        super().__init__(path)
        self.events = events
        self.fail_sync = fail_sync
        # Records to be written while the first sync on a worker thread runs (an inline
        # sync, the latency path, runs on the event loop: holding it would block writes).
        self.hold_first_sync = hold_first_sync
        self._syncs = 0
        self._records = 0
        self._mutex = threading.Condition()

    def write(self, parts: object) -> None:  # type: ignore[override]
        super().write(parts)  # type: ignore[arg-type]
        with self._mutex:
            self.events.append(("written", self._records))
            self._records += 1
            self._mutex.notify_all()

    def sync(self) -> None:
        with self._mutex:
            n = self._syncs
            self._syncs += 1
            # Everything written so far is covered by this sync.
            started_at = self._records
            self.events.append(("sync-start", started_at))
            if self.hold_first_sync and threading.current_thread() is not threading.main_thread():
                # A slow disk, made so: this sync lasts until more records were written
                # behind it (or a deadline passes, and the test's check fails).
                self.hold_first_sync, hold = 0, self.hold_first_sync
                self.events.append(("held", n))
                self._mutex.wait_for(lambda: self._records >= started_at + hold, timeout=30)
        if n == self.fail_sync:
            raise StorageError("injected sync failure")
        super().sync()
        with self._mutex:
            self.events.append(("sync-end", n))


async def _append(
    pipeline: CommitPipeline[list[bytes]],
    writer: LogWriter,
    parts: list[bytes],
    record: list[bytes],
    *,
    alone: bool = False,
) -> None:
    """As the commit loop appends: once the pipeline is ready."""
    await pipeline.wait_ready()
    pipeline.append(writer, parts, record, alone=alone)


async def _run(
    tmp_path: Path,
    count: int,
    fail_sync: int = -1,
    alone: Callable[[int], bool] = lambda i: False,
    hold_first_sync: int = 0,
    events: list[tuple[str, int]] | None = None,
    forwarded: list[int] | None = None,
) -> tuple[list, list[int]]:
    events = [] if events is None else events
    forwarded = [] if forwarded is None else forwarded
    writer = _RecordingWriter(tmp_path / "serverlog1", events, fail_sync, hold_first_sync)

    def forward(record: list) -> None:
        forwarded.append(int(bytes(record[0])))
        events.append(("forwarded", forwarded[-1]))

    pipeline = CommitPipeline(forward, max_unsynced=64)
    try:
        for i in range(count):
            await _append(pipeline, writer, [b"x" * 10], [str(i).encode()], alone=alone(i))
        await pipeline.flush()
    finally:
        await pipeline.close()
        writer.close()
    return events, forwarded


@pytest.mark.parametrize(
    "alone",
    [lambda i: False, lambda i: i % 3 == 0],
    ids=["always-more-input", "sometimes-alone"],
)
def test_every_record_is_forwarded_in_order_after_a_sync_that_covers_it(
    tmp_path: Path, alone: Callable[[int], bool]
) -> None:
    events, forwarded = asyncio.run(_run(tmp_path, 200, alone=alone, hold_first_sync=3))
    assert forwarded == list(range(200))
    assert (tmp_path / "serverlog1").stat().st_size == 200 * 10
    covered = 0  # records covered by a sync that has ended
    pending_cover = {}  # sync number -> records written when it started
    syncs_started = 0
    held: int | None = None  # the sync made slow, while it runs
    written_during_held_sync = []
    for kind, n in events:
        if kind == "sync-start":
            pending_cover[syncs_started] = n
            syncs_started += 1
        elif kind == "held":
            held = n
        elif kind == "sync-end":
            covered = max(covered, pending_cover[n])
            if n == held:
                held = -1
        elif kind == "forwarded":
            assert n < covered, f"record {n} forwarded before a sync covering it ended"
        elif kind == "written" and held is not None and held >= 0:
            written_during_held_sync.append(n)
    # The stages overlapped: while a sync ran, later records were written (and the check
    # above saw none of them forwarded before a sync that began after them had ended).
    assert len(written_during_held_sync) >= 3, events[:30]


def test_a_failed_sync_stops_forwarding_and_is_raised(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    forwarded: list[int] = []
    with pytest.raises(StorageError, match="injected sync failure"):
        asyncio.run(_run(tmp_path, 50, fail_sync=2, events=events, forwarded=forwarded))
    # Forwarded: exactly the records the two good syncs covered, in order; nothing the
    # failed sync covered, and nothing written after it.
    starts = [n for kind, n in events if kind == "sync-start"]
    assert len(starts) == 3  # the third failed; no sync after it
    # A prefix (a record written just before a sync is taken by the next one), at least
    # the first, none beyond what the good syncs covered.
    assert 1 <= len(forwarded) <= starts[1] and forwarded == list(range(len(forwarded)))


def test_a_failed_sync_forwards_nothing_it_covered(tmp_path: Path) -> None:
    events: list[tuple[str, int]] = []
    forwarded: list[int] = []

    async def main() -> None:
        writer = _RecordingWriter(tmp_path / "serverlog1", events, fail_sync=0)

        def forward(record: list) -> None:
            forwarded.append(int(bytes(record[0])))

        pipeline = CommitPipeline(forward, max_unsynced=1 << 20)
        try:
            await _append(pipeline, writer, [b"abc"], [b"0"])
            with pytest.raises(StorageError):
                await pipeline.flush()
            with pytest.raises(StorageError):
                await _append(pipeline, writer, [b"abc"], [b"1"])
            with pytest.raises(StorageError):
                pipeline.append(writer, [b"abc"], [b"1"])
        finally:
            await pipeline.close()
            writer.close()

    asyncio.run(main())
    assert forwarded == []


def test_a_record_alone_is_written_and_synced_in_one_go(tmp_path: Path) -> None:
    events, forwarded = asyncio.run(_run(tmp_path, 5, alone=lambda i: True))
    assert forwarded == [0, 1, 2, 3, 4]
    # Nothing was in flight each time: write, sync, forward, one record after the other.
    kinds = [kind for kind, _ in events]
    assert kinds == ["written", "sync-start", "sync-end", "forwarded"] * 5


def test_a_large_record_alone_still_goes_through_the_worker_threads(tmp_path: Path) -> None:
    """Only a small record takes the latency path: one larger than INLINE_MAX_BYTES is
    written by a worker thread, so the event loop goes on reading while it is."""
    events: list[tuple[str, int]] = []
    forwarded: list[int] = []
    on_loop: list[bool] = []  # per write: was it on the event loop's thread

    class _ThreadNotingWriter(_RecordingWriter):
        def write(self, parts: object) -> None:  # type: ignore[override]
            on_loop.append(threading.current_thread() is threading.main_thread())
            super().write(parts)

    async def main() -> None:
        writer = _ThreadNotingWriter(tmp_path / "serverlog1", events)

        def forward(record: list) -> None:
            forwarded.append(int(bytes(record[0])))

        pipeline = CommitPipeline(forward, max_unsynced=4 * INLINE_MAX_BYTES)
        try:
            sizes = [INLINE_MAX_BYTES, INLINE_MAX_BYTES + 1, 10]
            for i, size in enumerate(sizes):
                await _append(pipeline, writer, [b"x" * size], [str(i).encode()], alone=True)
                await pipeline.flush()
        finally:
            await pipeline.close()
            writer.close()

    asyncio.run(main())
    assert forwarded == [0, 1, 2]
    assert on_loop == [True, False, True]
    assert (tmp_path / "serverlog1").stat().st_size == 2 * INLINE_MAX_BYTES + 1 + 10


def test_a_record_alone_is_done_on_return_and_a_failure_stays_with_the_pipeline(
    tmp_path: Path,
) -> None:
    """The latency path called from a read (no await): when ``append`` of a record alone
    returns, the record is written, synced, its on_durable run and it is forwarded, in
    that order. A failed sync forwards nothing, and every later call says what failed."""
    events: list[tuple[str, int]] = []
    forwarded: list[int] = []

    async def main() -> None:
        writer = _RecordingWriter(tmp_path / "serverlog1", events, fail_sync=1)

        def forward(record: list) -> None:
            forwarded.append(int(bytes(record[0])))
            events.append(("forwarded", forwarded[-1]))

        pipeline = CommitPipeline(forward, max_unsynced=1 << 20)
        try:
            assert pipeline.idle and pipeline.ready
            pipeline.append(
                writer, [b"abc"], [b"0"], lambda: events.append(("durable", 0)), alone=True
            )
            assert events == [
                ("written", 0),
                ("sync-start", 1),
                ("sync-end", 0),
                ("durable", 0),
                ("forwarded", 0),
            ]
            assert pipeline.idle
            with pytest.raises(StorageError, match="injected"):
                pipeline.append(writer, [b"def"], [b"1"], alone=True)
            assert not pipeline.idle
            with pytest.raises(StorageError, match="injected"):
                pipeline.check()
            with pytest.raises(StorageError, match="injected"):
                await _append(pipeline, writer, [b"ghi"], [b"2"], alone=True)
        finally:
            await pipeline.close()
            writer.close()

    asyncio.run(main())
    assert forwarded == [0]
    assert (tmp_path / "serverlog1").read_bytes() == b"abcdef"


def test_a_record_is_appended_only_when_the_pipeline_is_ready(tmp_path: Path) -> None:
    """While a worker thread writes a record, the pipeline is not ready: a second record
    is refused, not written beside it (the file must see records in order); once the
    write ended it is taken."""
    events: list[tuple[str, int]] = []
    forwarded: list[int] = []

    async def main() -> None:
        writer = _RecordingWriter(tmp_path / "serverlog1", events)

        def forward(record: list) -> None:
            forwarded.append(int(bytes(record[0])))

        pipeline = CommitPipeline(forward, max_unsynced=1 << 20)
        try:
            pipeline.append(writer, [b"abc"], [b"0"])  # not alone: a worker thread writes it
            assert not pipeline.ready and not pipeline.idle
            with pytest.raises(RuntimeError, match="not ready"):
                pipeline.append(writer, [b"def"], [b"1"], alone=True)
            await _append(pipeline, writer, [b"def"], [b"1"])
            await pipeline.flush()
            assert pipeline.idle
        finally:
            await pipeline.close()
            writer.close()

    asyncio.run(main())
    assert forwarded == [0, 1]
    assert (tmp_path / "serverlog1").read_bytes() == b"abcdef"
