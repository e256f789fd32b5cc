"""The analytics report's starts: how each log began, and the restarts the logs show.

A coordinator begins a new log (``serverlog<N+1>``, with ``serverchkpt<N+1>``) in two
cases: it rolls its log while running (a checkpoint), or it starts again and recovers
(after a crash or a stop). No record in the log says which, so :func:`classify` reads it
from what the files do say, the strongest evidence first:

1. log 1 of version 0 (or of a directory without a version) is the **first start**, log
   1 of a later version an **upgrade**;
2. ``serverlog<N>.torn-*`` beside log N: recovery cut a torn tail of it, so log N+1
   began at a **restart** (a crash mid-write);
3. a service that logs a new incarnation at every start (a role its report plug-in
   names, :attr:`.report_plugins.ServiceReport.restarts_logged`, known once the report
   decoded its configuration, :mod:`.report_services`): a log holding such a start began
   at a **restart**, one without at a **checkpoint**;
4. this project's coordinators roll a log only once it has passed ``--log-trigger-mb``
   (their bindings never ask for a checkpoint): a log N+1 after a log N smaller than the
   trigger the coordinators ran with began at a **restart**;
5. otherwise it is a **checkpoint or restart**: the files do not say which.

The gap between the last record before a restart and the restart's first record is when
the instance wrote nothing: it was killed or stopped in it (the files do not say which,
nor when within it), then recovered.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

__all__ = ["START_KINDS", "STARTS_COLUMNS", "classify", "version_of"]

# How a log began, as the ``start`` column of the ``logs`` table says it.
START_KINDS = ("first start", "upgrade", "restart", "checkpoint", "checkpoint or restart")

# The ``starts`` table: every log that began other than at a known checkpoint.
STARTS_COLUMNS = (
    "instance",
    "version",
    "log_number",
    "start",
    "time",  # the first commit_time of the log (null without an index)
    "first_seq",
    "quiet_since",  # the last commit_time before it, of the same instance
    "quiet_seconds",  # time - quiet_since: no records in between
    "evidence",
    "log_file",
)


def version_of(value: Any) -> int | None:
    """A version from a table cell: None for no version (None, NaN or NA)."""
    import pandas as pd  # type: ignore[import-untyped]

    return None if pd.isna(value) else int(value)


def _size(trigger_bytes: int) -> str:
    mib = 1024 * 1024
    return f"{trigger_bytes / mib:g} MB" if trigger_bytes >= mib else f"{trigger_bytes:,} bytes"


def _start(
    log: Mapping[str, Any],
    previous: Mapping[str, Any] | None,
    role: str | None,
    start_logs: Collection[str],
    trigger_bytes: int,
) -> tuple[str, str]:
    """(kind, evidence) for one log (see the module docstring)."""
    number = int(log["log_number"])
    if number == 1:
        if (version_of(log["version"]) or 0) > 0:
            return "upgrade", f"log 1 of version {log['version']}"
        return "first start", "log 1 of the instance's first version"
    if previous is None:
        where = f"log {number - 1} is not here"
    else:
        if previous["torn_copies"]:
            return "restart", f"recovery cut a torn tail of log {number - 1} (a crash mid-write)"
        where = f"log {number - 1} ended at {int(previous['file_bytes']):,} bytes"
    if role is not None:
        if log["log_file"] in start_logs:
            return "restart", f"the {role} logged a new incarnation (start) in this log"
        return "checkpoint", f"the {role} logged no new incarnation in this log"
    if previous is not None and int(previous["file_bytes"]) < trigger_bytes:
        return "restart", (
            f"{where}, under the {_size(trigger_bytes)} at which a coordinator rolls its "
            "log (--log-trigger-mb): only a restart begins a log then"
        )
    return "checkpoint or restart", f"{where}: the files do not say which"


def classify(
    logs: Any,
    roles: Mapping[tuple[str | None, int | None], str],
    start_logs: Collection[str],
    trigger_bytes: int,
) -> tuple[Any, Any]:
    """The ``logs`` table (:func:`.report_tables.logs`) with its ``start`` column set and
    an ``evidence`` column beside it, and the ``starts`` table (:data:`STARTS_COLUMNS`).

    ``roles``: the role of each instance version whose service logs a new incarnation at
    every start (:func:`.report_services.starts_logged`); ``start_logs``: the log files
    holding such a start; ``trigger_bytes``: the coordinators' ``--log-trigger-mb``, in
    bytes.
    """
    import pandas as pd

    out = logs.copy()
    kinds, evidence = [], []
    records = out.to_dict("records")
    for r in records:
        r["version"] = version_of(r["version"])
    by_number = {(r["instance"], r["version"], r["log_number"]): r for r in records}
    for r in records:
        previous = by_number.get((r["instance"], r["version"], r["log_number"] - 1))
        role = roles.get((r["instance"], r["version"]))
        kind, why = _start(r, previous, role, start_logs, trigger_bytes)
        kinds.append(kind)
        evidence.append(why)
    out["start"] = kinds
    out.insert(out.columns.get_loc("start") + 1, "evidence", evidence)
    rows = []
    last: dict[str | None, Any] = {}  # instance -> its last commit time in the logs so far
    order = sorted(
        range(len(records)),
        key=lambda k: (
            records[k]["instance"] or "",
            records[k]["version"] or 0,
            records[k]["log_number"],
        ),
    )
    for k in order:
        r, kind, why = records[k], kinds[k], evidence[k]
        # The instance's last record before this log: in its earlier logs, any version.
        quiet_since = last.get(r["instance"], pd.NaT)
        if pd.notna(r["last_time"]):
            last[r["instance"]] = r["last_time"]
        if kind == "checkpoint":
            continue
        time = r["first_time"]
        known = pd.notna(time) and pd.notna(quiet_since)
        gap = (time - quiet_since).total_seconds() if known else None
        rows.append(
            {
                "instance": r["instance"],
                "version": r["version"],
                "log_number": r["log_number"],
                "start": kind,
                "time": time,
                "first_seq": r["first_seq"],
                "quiet_since": quiet_since,
                "quiet_seconds": gap,
                "evidence": why,
                "log_file": r["log_file"],
            }
        )
    starts = pd.DataFrame(rows, columns=list(STARTS_COLUMNS))
    starts["first_seq"] = starts["first_seq"].astype("Int64")
    starts["quiet_seconds"] = starts["quiet_seconds"].astype("float64")
    for name in ("time", "quiet_since"):
        starts[name] = pd.to_datetime(starts[name])
    return out, starts
