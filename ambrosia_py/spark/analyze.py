"""The report ``ambrosia-py analyze`` writes over every recorded log (the command:
``cli/analyze.py``).

One Spark batch (a local session, the ``ambrosia`` data source) scans the logs once, an
ingress call's method read from its envelope on the way (:mod:`.report_ingress`); the
report's tables are queries over that scan (:mod:`.report_tables`), the services'
streams are decoded from their logged calls by their report plug-ins
(:mod:`.report_services`, :mod:`.report_plugins`), starts and restarts are told from the
files (:mod:`.report_starts`), the charts are drawn with matplotlib (:mod:`.report_charts`)
and the page, with the sections that apply (:mod:`.report_sections`), is written with its
tables as Parquet (:mod:`.report_page`). See docs/spark.md, *Analytics report*.

PySpark, PyArrow, pandas and matplotlib are imported only by :func:`build_report`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from .layout import find_logs

__all__ = ["STEPS", "Report", "build_report", "method_names"]

# The steps, in order, for the progress bar.
STEPS = (
    "scanning the logs",
    "totals and instances",
    "calls over time",
    "message sizes",
    "impulses and replayable calls",
    "calls between instances",
    "log files and checkpoints",
    "the services' streams",
    "starts and restarts",
    "charts",
    "page and tables",
)


def method_names(services: Sequence[str]) -> dict[int, str]:
    """Method id -> name, from the @rpc methods of the services given as ``FILE`` or
    ``module[:Class]`` (as ``ambrosia-py run`` takes them). Ids are the same wherever a
    name is (a hash of it) unless fixed with ``@rpc(id=...)``; ids two services give
    different names show both (``a|b``)."""
    from ..binding.loading import load_service

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
    decoded: bool  # whether the services' payloads were decoded (allowed, and some logged)
    sections: tuple[str, ...] = ()  # the titles of the sections on the page


def build_report(
    spark: Any,
    data_dir: Path,
    out: Path,
    *,
    names: dict[int, str] | None = None,
    decode_services: bool | None = None,
    log_trigger_mb: float | None = None,
    step: Callable[[str], None] = lambda _: None,
) -> Report:
    """Analyse every log under ``data_dir`` on ``spark`` and write the report to ``out``.

    ``names``: method names by id (:func:`method_names`); without, ids show as ``#id``.
    ``decode_services``: unpickle the calls the services' report plug-ins read to count
    their streams (:mod:`.report_services`); ``None`` decodes when every log file
    belongs to this user and is writable by no other (this machine's own coordinators'
    logs). ``log_trigger_mb``: the size at which the logs'
    coordinators rolled their logs (:mod:`.report_starts`; ``None``: their default).
    ``step`` is called with each of :data:`STEPS` as it begins.
    """
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from . import report_tables as rt
    from .report_ingress import with_ingress
    from .report_page import write_tables
    from .report_plugins import registered
    from .report_sections import notes, sections, transport_calls
    from .report_services import own_logs, service_counts, service_method_ids, start_method_ids
    from .report_starts import classify

    if log_trigger_mb is None:
        from ..coordinator.core.config import DEFAULT_LOG_TRIGGER_MB

        log_trigger_mb = float(DEFAULT_LOG_TRIGGER_MB)
    names = names or {}
    files = find_logs(data_dir)
    if decode_services is None:
        decode_services = own_logs(f.path for f in files)
        how = "default: every log file is this user's and writable by no other"
    else:
        how = "as asked (--decode-services)" if decode_services else "as asked"
    step(STEPS[0])
    source = with_ingress(spark.read.format("ambrosia").load(str(data_dir)))
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
        roles: dict[tuple[str | None, int | None], str] = {}
        start_logs: set[str] = set()
        # Nothing to decode (no transport impulses): no job, no tables, no sections.
        decode_services = decode_services and transport_calls(tables) > 0
        if decode_services:
            services = service_counts(rows)
            _service_totals(totals, services)
            for plugin in registered():
                mine = services[services["service"] == plugin.name]
                tables[f"{plugin.name}_streams"] = mine.reset_index(drop=True)
            undecoded = services[services["request"] == "undecodable"]
            tables["undecoded"] = undecoded.reset_index(drop=True)
            roles = _roles(services)
            if roles:
                logged = msgs.where(
                    F.col("method_id").isin(start_method_ids()) & (F.col("rpc_type") == "impulse")
                ).select("log_file")
                start_logs = {r["log_file"] for r in logged.distinct().collect()}
        step(STEPS[8])
        trigger = int(log_trigger_mb * 1024 * 1024)  # as the coordinator counts it
        tables["logs"], tables["starts"] = classify(tables["logs"], roles, start_logs, trigger)
        kinds = tables["starts"]["start"]
        totals["restarts"] = int((kinds == "restart").sum())
        if (kinds == "checkpoint or restart").any():
            totals["maybe_restarts"] = int((kinds == "checkpoint or restart").sum())
    finally:
        rows.unpersist()
    import pandas as pd  # type: ignore[import-untyped]

    tables["totals"] = pd.DataFrame({"name": list(totals), "value": list(totals.values())})
    out.mkdir(parents=True, exist_ok=True)
    shown = sections(tables)
    step(STEPS[9])
    _charts(out, tables, {chart for section in shown for chart in section.charts})
    step(STEPS[10])
    write_tables(out, tables)
    lines = notes(tables, decode_services, how, log_trigger_mb)
    from .report_page import write_page

    page = write_page(out, data_dir, totals, shown, tables, lines)
    return Report(page, totals, tables, decode_services, tuple(s.title for s in shown))


def _roles(services: Any) -> dict[tuple[str | None, int | None], str]:
    """The instance versions whose service logs a new incarnation at every start, and
    their role (:func:`.report_services.starts_logged`)."""
    from .report_services import starts_logged
    from .report_starts import version_of

    known = services[services["role"].isin(starts_logged())]
    pairs = zip(known["instance"], known["version"], known["role"], strict=True)
    return {(i, version_of(v)): str(role) for i, v, role in pairs}


def _service_totals(totals: dict[str, int], services: Any) -> None:
    decoded = services[services["request"] != "undecodable"]
    from .report_plugins import registered

    for plugin in registered():
        mine = decoded[decoded["service"] == plugin.name]
        totals[f"{plugin.name}_frames"] = int(mine["frames"].sum())
    undecoded = services[services["request"] == "undecodable"]
    totals["undecoded_frames"] = int(undecoded["frames"].sum())


def _streams_chart(tables: dict[str, Any], plugin: Any, path: Path) -> None:
    """A service's frames of its charted request per stream (its report plug-in's)."""
    from . import report_charts as rc

    table = tables[f"{plugin.name}_streams"]
    rc.streams_chart(table, path, plugin.title, plugin.charted)


def _charts(out: Path, tables: dict[str, Any], shown: set[str]) -> None:
    """Draw the charts the page shows (``shown``: their file names)."""
    from . import report_charts as rc

    draw: dict[str, Callable[[Path], None]] = {
        "calls_over_time.png": lambda p: rc.calls_over_time_chart(
            tables["calls_over_time"], p, tables["starts"]
        ),
        "message_sizes.png": lambda p: rc.message_sizes_chart(tables["message_sizes"], p),
        "call_kinds.png": lambda p: rc.call_kinds_chart(tables["call_kinds"], p),
        "calls_between.png": lambda p: rc.calls_between_chart(tables["calls_between"], p),
        "logs.png": lambda p: rc.logs_chart(tables["logs"], p),
    }
    from .report_plugins import registered

    for plugin in registered():
        draw[f"{plugin.name}_streams.png"] = functools.partial(_streams_chart, tables, plugin)
    for name, chart in draw.items():
        if name in shown:
            chart(out / name)
