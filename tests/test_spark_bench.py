"""`ambrosia-py bench spark` keeps working: its generated logs read back whole, indexed and
split, through the reader it times (figures are reported, never asserted)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ambrosia_py.bench.spark import _scan, generate_logs
from ambrosia_py.spark import find_logs
from ambrosia_py.spark.plan import plan


def test_generated_logs_read_back_whole_and_split(tmp_path: Path) -> None:
    size, messages = generate_logs(tmp_path, 3, 100)
    assert size >= 3_000_000
    assert _scan(tmp_path) == messages
    assert len(plan(find_logs(tmp_path), 1 << 20)) >= 3  # the sidecar index allows splits
    assert (tmp_path / "bench_0" / "serverindex1").exists()


def test_the_ceiling_source_makes_the_rows_asked_for_with_the_ambrosia_schema(
    spark: Any, tmp_path: Path
) -> None:
    """``bench spark``'s ceiling stands for the same rows as the logs: the ambrosia
    schema, real rows from them, as many as asked, spread over the partitions asked."""
    from pyspark.sql import functions as F

    from ambrosia_py.bench.spark_ceiling import CeilingSource

    generate_logs(tmp_path, 1, 100)
    spark.dataSource.register(CeilingSource)
    rows = 100_003  # not a multiple of a batch nor of the partitions
    ceiling = (
        spark.read.format(CeilingSource.name())
        .option("path", str(tmp_path))
        .option("partitions", "3")
        .option("rows", str(rows))
        .load()
    )
    source = spark.read.format("ambrosia").load(str(tmp_path))
    assert ceiling.schema == source.schema
    assert ceiling.rdd.getNumPartitions() == 3
    got = ceiling.agg(F.count("*"), F.sum("payload_size"), F.countDistinct("rpc_type")).first()
    assert tuple(got) == (rows, rows * 100, 1)
