"""The streaming reader follows a live data dir: records appended while the query runs are
read once each, a record still being written waits for the next trigger, and new logs
and new instances are picked up."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ambrosia_py.coordinator.storage.files import LogWriter
from tests.test_spark_rows import disk_record, reference_rows, write_log
from tests.test_spark_source import collect


def _append(log: Path, seqs: range) -> None:
    with LogWriter(log, index_every_bytes=200) as writer:
        for seq in seqs:
            writer.write([disk_record(seq)])


def _append_raw(log: Path, data: bytes) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def test_a_streaming_query_reads_appended_records_exactly_once(spark: Any, tmp_path: Path) -> None:
    root = tmp_path / "data"
    log = root / "live_0" / "serverlog1"
    write_log(log, range(0, 10), index_every=200)
    query = (
        spark.readStream.format("ambrosia")
        .load(str(root))
        .writeStream.format("memory")
        .queryName("ambrosia_live")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start()
    )

    def seen() -> list[dict[str, Any]]:
        query.processAllAvailable()
        return collect(spark.sql("SELECT * FROM ambrosia_live"))

    try:
        assert seen() == reference_rows(root)
        # More records, and the first bytes of one a coordinator is writing right now.
        _append(log, range(10, 20))
        _append_raw(log, disk_record(20)[:30])
        rows = seen()
        assert rows == reference_rows(root)
        assert {r["seq"] for r in rows} == set(range(20))
        # The write completes; the log rolls; another instance starts.
        _append_raw(log, disk_record(20)[30:])
        write_log(root / "live_0" / "serverlog2", range(21, 30), index_every=200)
        write_log(root / "other_1" / "serverlog1", range(0, 5))
        rows = seen()
        assert rows == reference_rows(root)  # each record once: nothing twice, nothing lost
        assert {(r["instance"], r["seq"]) for r in rows} == {
            *(("live", s) for s in range(30)),
            *(("other", s) for s in range(5)),
        }
        assert all(r["commit_time"] is not None for r in rows if r["instance"] == "live")
        progress = query.recentProgress
        assert sum(p["numInputRows"] for p in progress) == len(rows)
    finally:
        query.stop()
