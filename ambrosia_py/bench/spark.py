"""``ambrosia-py bench spark``: scan throughput of the ``ambrosia`` data source.

Generates logs of fork calls (``--payload``-byte arguments, a few hundred to a record,
as group commit writes them, with the coordinator's sidecar index) in a temporary data
dir, then, on one local session, times in turn: a baseline reading the same bytes with
``spark.read.format("binaryFile")`` (summing the content lengths, so every byte is
read); the data source at message level (summing ``payload_size``, so every row is
made); Spark's ceiling, a data source with the same schema and rows whose reader does no
work (``spark_ceiling.py``: what Spark's Python data source path costs by itself); and
the same reader in this process on one core (what one worker does). Each figure is the
best of ``--rounds`` runs after one warm-up.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ..coordinator.storage.files import LogWriter
from ..extras import require
from ..wire import IncomingRpc, RpcType, encode_disk_record, encode_message

__all__ = ["generate_logs", "spark_bench"]

_RECORD_BYTES = 64 * 1024  # about what one group-committed record holds under load
_LOG_BYTES = 64 * 1024 * 1024  # then the next log file, as a size trigger would


def _args(size: int) -> bytes:
    return bytes(range(256)) * (size // 256) + bytes(size % 256)


def generate_logs(root: Path, megabytes: int, payload: int, vary: bool = False) -> tuple[int, int]:
    """Logs of fork calls under ``root`` (instance ``bench``); returns (bytes, messages).

    With ``vary`` the arguments are ``payload`` bytes give or take a quarter, so a
    record's messages are not all alike (the reader then walks them one by one)."""
    if vary:
        spread = payload // 2
        sizes = [payload - payload // 4 + (i * 37) % (spread + 1) for i in range(64)]
        messages_ = [encode_message(IncomingRpc(3, RpcType.FORK, _args(k))) for k in sizes]
        unit, count = b"".join(messages_), len(messages_)
    else:
        unit, count = encode_message(IncomingRpc(3, RpcType.FORK, _args(payload))), 1
    repeats = max(1, _RECORD_BYTES // len(unit))
    per_record = repeats * count
    body = unit * repeats
    total = messages = seq = 0
    log_number = 0
    writer: LogWriter | None = None
    directory = root / "bench_0"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        while total < megabytes * 1_000_000:
            if writer is None or writer.size >= _LOG_BYTES:
                if writer is not None:
                    writer.close()
                log_number += 1
                writer = LogWriter(directory / f"serverlog{log_number}")
            record = encode_disk_record(1, seq, body)
            writer.write([record])
            total += len(record)
            messages += per_record
            seq += 1
    finally:
        if writer is not None:
            writer.close()
    return total, messages


def _scan(root: Path) -> int:
    """What one Spark worker does with every partition, here in one process: rows made
    into Arrow batches. Returns the rows."""
    from ..spark.arrow import to_batch
    from ..spark.layout import find_logs
    from ..spark.plan import plan
    from ..spark.rows import columns_of

    rows = 0
    for piece in plan(find_logs(root)):
        for columns in columns_of(
            piece, "message", fail_on_damage=False, max_rows=1 << 16, max_bytes=32 << 20
        ):
            rows += to_batch(columns).num_rows
    return rows


_CEILING = "ceiling: reads nothing"


def _best(fn: Callable[[], Any], rounds: int) -> float:
    fn()  # warm up: the first job starts the Python workers
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@click.command("spark")
@click.option("--mb", default=200, show_default=True, help="Megabytes of logs to scan.")
@click.option("--payload", default=100, show_default=True, help="Argument bytes per call.")
@click.option("--cores", default=2, show_default=True, help="Spark local[N].")
@click.option("--rounds", default=3, show_default=True, help="Timed runs per figure.")
@click.option("--vary", is_flag=True, help="Arguments of --payload bytes give or take a quarter.")
def spark_bench(mb: int, payload: int, cores: int, rounds: int, vary: bool) -> None:
    """Scan throughput of the ambrosia data source against a binaryFile baseline."""
    require("pyspark", "pyarrow", "numpy")  # Spark, and the reader's Arrow batches
    from pyspark.sql import functions as F

    from ..spark import java_problem, local_session

    problem = java_problem()
    if problem is not None:
        raise click.ClickException(problem)
    console = Console()
    ours = f"ambrosia local[{cores}]"
    with tempfile.TemporaryDirectory(prefix="ambrosia-bench-spark-") as tmp:
        root = Path(tmp)
        with console.status(f"writing {mb} MB of logs"):
            size, messages = generate_logs(root, mb, payload, vary)
        with console.status(f"starting Spark local[{cores}]"):
            spark = local_session(cores)
        try:
            # Splits so every core has work (the sidecar index allows them).
            split = max(1 << 20, size // (2 * cores))
            source = spark.read.format("ambrosia").option("split_bytes", str(split)).load(tmp)
            figures = []
            with console.status("binaryFile baseline"):
                baseline = (
                    spark.read.format("binaryFile")
                    .option("pathGlobFilter", "serverlog*")
                    .load(str(root / "bench_0"))
                )
                total = F.sum(F.length("content"))
                figures.append(("binaryFile", _best(lambda: baseline.agg(total).collect(), rounds)))
            summed = F.sum("payload_size")
            with console.status("ambrosia data source"):
                figures.append((ours, _best(lambda: source.agg(summed).collect(), rounds)))
            partitions = source.rdd.getNumPartitions()
            with console.status("Spark's ceiling: a data source that reads nothing"):
                from .spark_ceiling import CeilingSource

                spark.dataSource.register(CeilingSource)
                ceiling = (
                    spark.read.format(CeilingSource.name())
                    .option("path", tmp)
                    .option("partitions", str(partitions))
                    .option("rows", str(messages))
                    .load()
                )
                figures.append((_CEILING, _best(lambda: ceiling.agg(summed).collect(), rounds)))
        finally:
            spark.stop()
        with console.status("the reader in this process, one core"):
            figures.append(("in-process, 1 core", _best(lambda: _scan(root), 1)))
    spread = " ± 25%" if vary else ""
    table = Table(title=f"spark: {size / 1e6:.0f} MB of logs, {messages:,} fork calls of "
                        f"{payload} B{spread}, {partitions} partitions")  # fmt: skip
    for column in ("reader", "seconds", "MB/s", "rows/s"):
        table.add_column(column, justify="right")
    for name, seconds in figures:
        rows = "" if name == "binaryFile" else f"{messages / seconds:,.0f}"
        table.add_row(name, f"{seconds:.2f}", f"{size / seconds / 1e6:.1f}", rows)
    console.print(table)
    took = dict(figures)
    share = took[_CEILING] / took[ours]
    console.print(
        "The ceiling makes the same rows and reads nothing (its MB/s: of the logs it stands "
        f"for): the ambrosia reader runs at {share:.0%} of what Spark's Python data source "
        "path allows on this machine in this run."
    )
