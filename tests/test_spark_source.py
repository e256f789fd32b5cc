"""The ``ambrosia`` data source under Spark (one shared local session): the same rows as the
independent reference of test_spark_rows.py, on generated logs and on logs a real
coordinator wrote; damage reported or raised; the released on-disk form."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.spark import MESSAGE_COLUMNS, RECORD_COLUMNS, read_rows
from ambrosia_py.testing import ImmortalRunner
from tests.fake_binding import (
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    self_fork,
    self_impulse,
    zz,
)
from tests.test_spark_rows import (
    make_data_dir,
    normal,
    reference_rows,
    released_log,
    write_log,
)

ORDER = ("log_file", "offset", "msg_index")


def collect(df: Any) -> list[dict[str, Any]]:
    """The rows of ``df`` as dicts: ``commit_time`` in µs, binaries as ``bytes``, in log order."""
    from pyspark.sql import functions as F

    rows = []
    for row in df.withColumn("commit_time", F.unix_micros("commit_time")).collect():
        d = row.asDict()
        for name in ("payload", "body"):
            if d.get(name) is not None:
                d[name] = bytes(d[name])
        rows.append(d)
    return sorted(rows, key=lambda r: tuple(-1 if r.get(k) is None else r[k] for k in ORDER))


def load(spark: Any, path: Path, **options: str) -> Any:
    return spark.read.format("ambrosia").options(**options).load(str(path))


def test_spark_gives_the_reference_rows_split_across_partitions(spark: Any, tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    df = load(spark, root, split_bytes="600")
    assert df.columns == [name for name, _, _ in MESSAGE_COLUMNS]
    assert df.rdd.getNumPartitions() > 4  # the indexed logs were split
    assert collect(df) == reference_rows(root)
    records = load(spark, root / "alpha_0", level="record", split_bytes="1000")
    assert records.columns == [name for name, _, _ in RECORD_COLUMNS]
    expected = [r for r in reference_rows(root, "record") if r["instance"] == "alpha"]
    assert collect(records) == expected
    # A query in SQL terms: async calls by sender, and what the checkpoints carried.
    by_sender = load(spark, root).where("rpc_type = 'async'").groupBy("sender").count()
    assert {r["sender"]: r["count"] for r in by_sender.collect()} == {
        "caller": sum(1 for r in reference_rows(root) if r["rpc_type"] == "async")
    }


def test_damage_is_reported_as_rows_or_raised_naming_file_and_offset(
    spark: Any, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    offsets = write_log(root / "torn_0" / "serverlog1", range(0, 12), index_every=300)
    torn = root / "torn_0" / "serverlog1"
    torn.write_bytes(torn.read_bytes()[: offsets[-1] + 30])  # the last write cut short
    offsets = write_log(root / "flip_0" / "serverlog1", range(0, 12), index_every=300)
    flip = root / "flip_0" / "serverlog1"
    data = bytearray(flip.read_bytes())
    data[offsets[5] + 30] ^= 1  # inside record 5's messages
    flip.write_bytes(bytes(data))
    rows = collect(load(spark, root, split_bytes="300"))
    assert rows == normal(read_rows(root))
    bad = [r for r in rows if not r["check_ok"]]
    assert [(r["log_file"], r["offset"], r["seq"]) for r in bad] == [(str(flip), offsets[5], 5)]
    assert {r["seq"] for r in rows if r["log_file"] == str(torn)} == set(range(11))
    with pytest.raises(Exception, match=f"{flip}, offset {offsets[5]}, seq 5: check bytes"):
        load(spark, root, on_damage="fail").collect()
    with pytest.raises(Exception, match="option on_damage must be report or fail"):
        load(spark, root, on_damage="ignore").collect()


def test_a_log_in_the_released_on_disk_form_reads_under_spark(spark: Any, tmp_path: Path) -> None:
    data, rows = released_log()
    log = tmp_path / "server_3" / "serverlog1"
    log.parent.mkdir()
    log.write_bytes(data)
    assert collect(load(spark, log)) == [r | {"log_file": str(log)} for r in rows]


def _first_start(binding: FakeBinding) -> None:
    assert binding.record().seq == -1  # TakeBecomingPrimaryCheckpoint
    binding.send(frame(9, b"hello") + checkpoint(b"state-0"))
    assert binding.record().seq == 0


def _read_until(binding: FakeBinding, messages: int) -> None:
    got = 0
    while got < messages:
        record = binding.record()
        if record.seq >= 0:
            got += len(record.messages)


def _self_async(method: int, call_seq: int, args: bytes) -> bytes:
    return frame(0, zz(0) + b"\x00" + zz(method) + b"\x00" + zz(3) + b"svc" + zz(call_seq) + args)


def test_logs_a_real_coordinator_wrote_across_a_roll_and_a_crash(
    spark: Any, tmp_path: Path
) -> None:
    started = time.time()
    with coordinator(tmp_path, "svc") as (ic, binding):
        _first_start(binding)
        binding.send(b"".join(self_fork(2, bytes([i]) * 40) for i in range(30)))
        binding.send(b"".join(self_impulse(5, bytes([i])) for i in range(20)))
        binding.send(b"".join(_self_async(7, i, b"{}") for i in range(10)))
        _read_until(binding, 60)
        binding.send(frame(2))  # TakeCheckpoint: the coordinator rolls to log 2
        while binding.record().seq != -1:
            pass
        binding.send(checkpoint(b"state-1") + b"".join(self_fork(3, b"x") for _ in range(15)))
        _read_until(binding, 15)
        ic.kill()  # then recovery moves to log 3
    with coordinator(tmp_path, "svc") as (ic, binding):
        record = binding.record()
        while record.seq != -1:  # the checkpoint, then the replayed records
            record = binding.record()
        binding.send(b"".join(self_fork(3, b"x") for _ in range(15)))  # regenerated, dropped
        binding.send(checkpoint(b"state-2") + self_impulse(5, b"after"))
        _read_until(binding, 1)
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    finished = time.time()
    logs = sorted(p.name for p in (tmp_path / "svc_0").glob("serverlog*"))
    assert logs == ["serverlog1", "serverlog2", "serverlog3"]
    rows = collect(load(spark, tmp_path, split_bytes="1024"))
    assert rows == reference_rows(tmp_path)
    assert len(rows) == 1 + 30 + 20 + 10 + 15 + 1
    assert all(r["check_ok"] and r["instance"] == "svc" for r in rows)
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    kinds = {(r["msg_type"], r["rpc_type"], r["method_id"]) for r in rows}
    assert kinds == {
        ("InitialMessage", None, None),
        ("RPC", "fork", 2),
        ("RPC", "impulse", 5),
        ("RPC", "async", 7),
        ("RPC", "fork", 3),
    }
    times = [r["commit_time"] for r in rows]
    assert all(t is not None and started * 1e6 <= t <= finished * 1e6 for t in times)
    assert times == sorted(times)


class Ledger(Immortal):
    def __init__(self) -> None:
        self.entries: list[int] = []
        self.positions: list[int] = []

    @rpc
    def add(self, n: int) -> int:
        self.entries.append(n)
        return len(self.entries)

    @rpc
    async def add_via_self(self, n: int) -> None:
        self.positions.append(await self.me.add(n))


def test_an_immortal_s_history_as_calls_and_returns(spark: Any, tmp_path: Path) -> None:
    runner = ImmortalRunner(tmp_path / "data")
    try:
        svc = runner.start(Ledger, "ledger")
        for i in range(8):
            svc.impulse.add(i)
        for i in range(5):
            svc.impulse.add_via_self(100 + i)
        svc.wait_until(lambda s: len(s["positions"]) == 5)
        svc.stop()
    finally:
        runner.close()
    root = tmp_path / "data"
    rows = collect(load(spark, root))
    assert rows == reference_rows(root)
    names = {i: spec.name for i, spec in Ledger.rpc_methods().items()}
    calls = [(names.get(r["method_id"]), r["rpc_type"]) for r in rows if r["msg_type"] == "RPC"]
    assert calls.count(("add", "impulse")) == 8
    assert calls.count(("add_via_self", "impulse")) == 5
    assert calls.count(("add", "async")) == 5  # the awaited self-calls
    returns = [r for r in rows if r["rpc_type"] == "return"]
    asyncs = [r for r in rows if r["rpc_type"] == "async"]
    assert sorted(r["call_seq"] for r in returns) == sorted(r["call_seq"] for r in asyncs)
    assert all(r["sender"] == "ledger" and r["destination"] == "ledger" for r in returns)
