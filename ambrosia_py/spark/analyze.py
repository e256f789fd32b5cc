"""``ambrosia-py analyze DATA_DIR --out DIR``: a report over every recorded log.

One Spark batch (a local session, the ``ambrosia`` data source) scans the logs once; the
report's tables are queries over that scan (:mod:`.report_tables`), the Ockam and
Wallaroo streams are decoded from the logged transport impulses
(:mod:`.report_services`), the charts are drawn with matplotlib (:mod:`.report_charts`)
and the page is written with its tables as Parquet (:mod:`.report_page`). See
docs/spark.md, *Analytics report*.

PySpark, PyArrow, pandas and matplotlib are the ``spark`` extra: the command checks for
them (and for Java) before anything else and says in one line what to install
(:mod:`ambrosia_py.extras`). They are imported only once it runs: ``--help`` needs none.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import click

from ..extras import EXTRAS, require
from .errors import NoLogsError
from .layout import find_logs

__all__ = ["Report", "analyze", "build_report", "method_names"]

# The steps, in order, for the progress bar.
STEPS = (
    "scanning the logs",
    "totals and instances",
    "calls over time",
    "message sizes",
    "impulses and replayable calls",
    "calls between instances",
    "log files and checkpoints",
    "Ockam and Wallaroo streams",
    "charts",
    "page and tables",
)


def method_names(services: Sequence[str]) -> dict[int, str]:
    """Method id -> name, from the @rpc methods of the services given as ``FILE`` or
    ``module[:Class]`` (as ``ambrosia-py run`` takes them). Ids are the same wherever a
    name is (a hash of it) unless fixed with ``@rpc(id=...)``; ids two services give
    different names show both (``a|b``)."""
    from ..binding.run_cli import load_service

    names: dict[int, set[str]] = {}
    for spec in services:
        for method_id, method in load_service(spec).rpc_methods().items():
            names.setdefault(method_id, set()).add(method.name)
    return {i: "|".join(sorted(n)) for i, n in names.items()}


@attrs.frozen
class Report:
    """What :func:`build_report` wrote: the page, the totals shown, every table."""

    page: Path
    totals: dict[str, int]
    tables: dict[str, Any]  # name -> pandas DataFrame, as written to tables/<name>.parquet
    decoded: bool  # whether the services' payloads were decoded


def build_report(
    spark: Any,
    data_dir: Path,
    out: Path,
    *,
    names: dict[int, str] | None = None,
    decode_services: bool | None = None,
    step: Callable[[str], None] = lambda _: None,
) -> Report:
    """Analyse every log under ``data_dir`` on ``spark`` and write the report to ``out``.

    ``names``: method names by id (:func:`method_names`); without, ids show as ``#id``.
    ``decode_services``: unpickle the transport impulses of the Ockam hub and the Wallaroo
    worker to count their streams (:mod:`.report_services`); ``None`` decodes when every
    log file belongs to this user and is writable by no other (this machine's own
    coordinators' logs). ``step`` is called with each of :data:`STEPS` as it begins.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from . import report_tables as rt
    from .report_page import write_tables
    from .report_services import own_logs, service_counts, service_method_ids

    names = names or {}
    files = find_logs(data_dir)
    if decode_services is None:
        decode_services = own_logs(f.path for f in files)
        how = "default: every log file is this user's and writable by no other"
    else:
        how = "as asked (--decode-services)" if decode_services else "as asked"
    step(STEPS[0])
    source = spark.read.format("ambrosia").load(str(data_dir))
    # One scan, kept: payloads only where the services' decoding needs them.
    keep = (
        (F.col("msg_type") == "RPC")
        & (F.col("rpc_type") != "return")
        & F.col("method_id").isin(list(service_method_ids().values()))
    )
    payload = F.when(keep, F.col("payload")) if decode_services else F.lit(None).cast("binary")
    rows = source.withColumn("payload", payload).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        rows.count()
        msgs = rows.drop("payload")
        step(STEPS[1])
        tables: dict[str, Any] = {"instances": rt.instances(msgs)}
        totals = rt.totals(tables["instances"], len(files))
        step(STEPS[2])
        tables["calls_over_time"] = rt.calls_over_time(msgs, names, tables["instances"])
        step(STEPS[3])
        tables["message_sizes"] = rt.message_sizes(msgs)
        tables["message_size_stats"] = rt.size_stats(msgs)
        step(STEPS[4])
        tables["call_kinds"] = rt.call_kinds(tables["calls_over_time"])
        step(STEPS[5])
        tables["calls_between"] = rt.calls_between(msgs)
        step(STEPS[6])
        tables["logs"] = rt.logs(msgs, files)
        tables["control_messages"] = rt.control_messages(msgs)
        step(STEPS[7])
        if decode_services:
            services = service_counts(rows)
            _service_totals(totals, services)
            tables["ockam_streams"] = services[services["service"] == "ockam"]
            tables["wallaroo_streams"] = services[services["service"] == "wallaroo"]
            tables["undecoded"] = services[services["request"] == "undecodable"]
            for name in ("ockam_streams", "wallaroo_streams", "undecoded"):
                tables[name] = tables[name].reset_index(drop=True)
    finally:
        rows.unpersist()
    import pandas as pd  # type: ignore[import-untyped]

    tables["totals"] = pd.DataFrame({"name": list(totals), "value": list(totals.values())})
    out.mkdir(parents=True, exist_ok=True)
    step(STEPS[8])
    _charts(out, tables)
    step(STEPS[9])
    write_tables(out, tables)
    notes = _notes(tables, decode_services, how)
    from .report_page import write_page

    page = write_page(out, data_dir, totals, _sections(tables), tables, notes)
    return Report(page, totals, tables, decode_services)


def _service_totals(totals: dict[str, int], services: Any) -> None:
    decoded = services[services["request"] != "undecodable"]
    for service in ("ockam", "wallaroo"):
        totals[f"{service}_frames"] = int(decoded[decoded["service"] == service]["frames"].sum())
    undecoded = services[services["request"] == "undecodable"]
    totals["undecoded_frames"] = int(undecoded["frames"].sum())


def _charts(out: Path, tables: dict[str, Any]) -> None:
    from . import report_charts as rc

    rc.calls_over_time_chart(tables["calls_over_time"], out / "calls_over_time.png")
    rc.message_sizes_chart(tables["message_sizes"], out / "message_sizes.png")
    rc.call_kinds_chart(tables["call_kinds"], out / "call_kinds.png")
    rc.calls_between_chart(tables["calls_between"], out / "calls_between.png")
    rc.logs_chart(tables["logs"], out / "logs.png")
    if "ockam_streams" in tables:
        rc.streams_chart(tables["ockam_streams"], out / "ockam_streams.png", "Ockam", "PushRequest")
        rc.streams_chart(
            tables["wallaroo_streams"], out / "wallaroo_streams.png", "Wallaroo", "Message"
        )


def _notes(tables: dict[str, Any], decoded: bool, how: str) -> list[str]:
    axes = tables["calls_over_time"].drop_duplicates(["instance", "version"])
    untimed = sorted(str(i) for i in axes[axes["axis"] == "seq"]["instance"])
    notes = [
        "Calls over time are counted by commit_time (from the sidecar index)"
        + (f", except per record seq for {', '.join(untimed)} (no index)." if untimed else ".")
    ]
    if decoded:
        notes.append(
            "Ockam and Wallaroo payloads were decoded by unpickling the logged arguments "
            f"({how}), with an unpickler that builds built-in values and the services' "
            "configuration classes only. Decode only logs you trust."
        )
    else:
        notes.append(
            "Ockam and Wallaroo payloads were not decoded: that unpickles the logged "
            f"arguments ({how}; the default for logs not all this user's own). Run with "
            "--decode-services for logs you trust."
        )
    return notes


def _sections(tables: dict[str, Any]) -> list[Any]:
    from .report_page import Section

    sections = [
        Section(
            "Instances",
            "Per instance version: log files, records, messages, calls by type, returns, "
            "damaged rows, payload bytes and the span of commit times and seqs.",
            (),
            ("instances",),
        ),
        Section(
            "Calls over time",
            "Calls (async, fork and impulse RPCs) per instance and method, per second of "
            "commit_time, in buckets of `width` seconds (or, for logs without a sidecar "
            "index, per `width` record seqs: the axis column says which). Calls without a "
            "commit time in a timed instance have an empty bucket.",
            ("calls_over_time.png",),
            ("calls_over_time",),
        ),
        Section(
            "Message sizes",
            "Payload bytes per message (a call's arguments, a returned value, an "
            "InitialMessage's data, a Checkpoint's blob), in power-of-two bins per kind; "
            "percentiles are approximate (Spark's percentile_approx).",
            ("message_sizes.png",),
            ("message_size_stats", "message_sizes"),
        ),
        Section(
            "Impulses versus replayable calls",
            "Impulses come from outside the system (a client, a transport); replayable "
            "calls (async and fork) are instances calling instances. Per instance and method.",
            ("call_kinds.png",),
            ("call_kinds",),
        ),
        Section(
            "Calls between instances",
            "Calls and returns from sender to destination (the instance whose log holds "
            "them). The wire names the caller of async calls only; fork and impulse calls "
            "show '(not logged)' as their sender. A return's sender ran the call.",
            ("calls_between.png",),
            ("calls_between",),
        ),
        Section(
            "Log files, checkpoints and restarts",
            "One row per log file. A coordinator begins a new log, with a checkpoint for it, "
            "both when it checkpoints while running and when it recovers after a restart; "
            "the files do not tell which, so both count as 'new log'. 'first start' is log 1 "
            "of version 0, 'upgrade' log 1 of a later version. "
            "checkpoint: serverchkpt<N> (the state at the start of log N) is still on disk; "
            "torn_copies: tails a recovery cut after a crash mid-write. Control messages "
            "(not calls: InitialMessage, Checkpoint, TakeCheckpoint, BecomingPrimary, ...) "
            "are counted per log below.",
            ("logs.png",),
            ("logs", "control_messages"),
        ),
    ]
    if "ockam_streams" in tables:
        sections += [
            Section(
                "Ockam streams",
                "Frames the Ockam hub received, decoded from its logged frames impulses: "
                "per stream and partition and request (PushRequest: messages stored; "
                "bytes: their data).",
                ("ockam_streams.png",),
                ("ockam_streams",),
            ),
            Section(
                "Wallaroo streams",
                "Frames the Wallaroo worker received, decoded in the dialect of its logged "
                "start: per stream (named by its NOTIFY) and frame (Message: messages with a "
                "payload; bytes: their payloads).",
                ("wallaroo_streams.png",),
                ("wallaroo_streams",),
            ),
            Section(
                "Not decoded",
                "Transport calls or frames that did not decode, with the first reason and "
                "where (log file, offset, message).",
                (),
                ("undecoded",),
            ),
        ]
    return sections


def _session(cores: int) -> tuple[Any, bool]:
    """A local session, and whether this command owns it (and so stops it)."""
    from . import local_session

    spark = local_session(cores, app_name="ambrosia-py analyze")
    spark.sparkContext.setLogLevel("ERROR")
    return spark, True


@click.command()
@click.argument("data_dir", type=click.Path(exists=True, path_type=Path))
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where the report goes: index.html, its PNGs, tables/*.parquet.",
)
@click.option(
    "--service",
    "services",
    multiple=True,
    metavar="FILE|module[:Class]",
    help="Name method ids after this service's @rpc methods (repeatable); else #id.",
)
@click.option(
    "--decode-services/--no-decode-services",
    default=None,
    help="Unpickle the Ockam hub's and Wallaroo worker's logged frames to count their "
    "streams (for logs you trust). Default: only if every log file is this user's own.",
)
@click.option("--cores", default=2, show_default=True, help="Spark local[N].")
def analyze(
    data_dir: Path, out: Path, services: tuple[str, ...], decode_services: bool | None, cores: int
) -> None:
    """Write a report (HTML, PNG charts, Parquet tables) over the logs in DATA_DIR."""
    require(*EXTRAS["spark"])
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .session import java_problem

    problem = java_problem()
    if problem is not None:
        raise click.ClickException(problem)
    try:
        find_logs(data_dir)
    except NoLogsError as exc:
        raise click.ClickException(str(exc)) from None
    names = method_names(services)
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task("starting Spark", total=len(STEPS) + 1)
        spark, owned = _session(cores)

        def step(name: str) -> None:
            progress.update(task, description=name, advance=1)

        try:
            report = build_report(
                spark, data_dir, out, names=names, decode_services=decode_services, step=step
            )
        finally:
            if owned:
                spark.stop()
        progress.update(task, description="done", advance=1)
    click.echo(f"report: {report.page}")
