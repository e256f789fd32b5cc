"""The analytics report's words: which sections a report has, what each counts, and the
notes under its totals.

A section is on the page only where it applies: calls between instances where some
instance called another, a service's streams where its report plug-in
(:mod:`.report_plugins`) decoded frames, "Not decoded" where something was not. Its
chart is drawn only then (:mod:`.analyze`).
"""

from __future__ import annotations

from typing import Any

from .report_page import Section

__all__ = ["notes", "sections", "transport_calls"]

_MARKS_LISTED = 8  # starts named under the calls-over-time chart; the rest: see the table


def transport_calls(tables: dict[str, Any]) -> int:
    """Calls the report plug-ins read (:func:`.report_services.service_method_ids`):
    what decoding the services would read."""
    from .report_services import service_method_ids

    kinds = tables["call_kinds"]
    ids = set(service_method_ids().values())
    mine = kinds[kinds["method_id"].isin(ids) & kinds["ingress"].isna()]
    return int(mine["calls"].sum())


def notes(tables: dict[str, Any], decoded: bool, how: str, trigger_mb: float) -> list[str]:
    """The lines under the totals: how time was counted, how restarts were told, and
    whether the services' payloads were decoded (only where there are any)."""
    axes = tables["calls_over_time"].drop_duplicates(["instance", "version"])
    untimed = sorted(str(i) for i in axes[axes["axis"] == "seq"]["instance"])
    out = [
        "Calls over time are counted by commit_time (from the sidecar index)"
        + (f", except per record seq for {', '.join(untimed)} (no index)." if untimed else ".")
    ]
    if (tables["logs"]["log_number"] > 1).any():
        out.append(
            "New logs are told apart as restarts or checkpoints from what the files say "
            "(section Starts and restarts), taking the coordinators' --log-trigger-mb as "
            f"{trigger_mb:g} (analyze --log-trigger-mb, if they ran with another)."
        )
    if not transport_calls(tables):
        return out
    services = _titles()
    if decoded:
        out.append(
            f"The services' payloads ({services}) were decoded by unpickling the logged "
            f"arguments ({how}), with an unpickler that builds built-in values and the "
            "services' configuration classes only. Decode only logs you trust."
        )
    else:
        out.append(
            f"The services' payloads ({services}) were not decoded: that unpickles the "
            f"logged arguments ({how}; the default for logs not all this user's own). Run "
            "with --decode-services for logs you trust."
        )
    return out


def _titles() -> str:
    """The report plug-ins' titles, for the notes."""
    from .report_plugins import registered

    return ", ".join(p.title for p in registered())


def _utc(t: Any) -> str:
    return str(t.strftime("%H:%M:%S.%f"))[:-3] + " UTC"


def _marked(starts: Any) -> str:
    """The starts the calls-over-time chart marks, named."""
    import pandas as pd  # type: ignore[import-untyped]

    shown = starts[starts["start"].isin(["restart", "upgrade"]) & starts["time"].notna()]
    if shown.empty:
        said = "No restart or upgrade is marked: the logs show none."
    else:
        named = [
            f"{r['instance']} {r['start']} at {_utc(r['time'])}"
            + (
                f" (no records for {r['quiet_seconds']:.2f} s before)"
                if pd.notna(r["quiet_seconds"])
                else ""
            )
            for r in shown.head(_MARKS_LISTED).to_dict("records")
        ]
        more = len(shown) - _MARKS_LISTED
        said = "Marked: " + "; ".join(named) + (f"; and {more} more." if more > 0 else ".")
    unsure = int((starts["start"] == "checkpoint or restart").sum())
    if unsure:
        said += f" {unsure} new logs that may be restarts are dotted lines."
    return said


def sections(tables: dict[str, Any]) -> list[Section]:
    """The page's sections, those that apply (see the module docstring)."""
    out = [
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
            "commit time in a timed instance have an empty bucket. A client's call through "
            "the ingress counts under the method it called (`ingress`: call), each call of "
            "a batch the ingress logged together as one. Black lines "
            "mark restarts, the shaded span before each the time the instance wrote "
            "nothing (it was killed or stopped in it, then recovered); black dashes "
            "upgrades; grey dots new logs that were a checkpoint or a restart. "
            + _marked(tables["starts"]),
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
    ]
    between = tables["calls_between"]
    if between["rpc_type"].isin(["async", "fork", "return"]).any():
        out.append(
            Section(
                "Calls between instances",
                "Calls and returns from sender to destination (the instance whose log "
                "holds them). The wire names the caller of async calls only; fork and "
                "impulse calls show '(not logged)' as their sender. A return's sender "
                "ran the call.",
                ("calls_between.png",),
                ("calls_between",),
            )
        )
    out += [
        Section(
            "Log files and checkpoints",
            "One row per log file. A coordinator begins a new log, with a checkpoint for "
            "it, both when it checkpoints while running and when it recovers after a "
            "restart; `start` says which the files show, and `evidence` why (see Starts "
            "and restarts). checkpoint: serverchkpt<N> (the state at the start of log N) "
            "is still on disk; torn_copies: tails a recovery cut after a crash mid-write. "
            "Control messages (not calls: InitialMessage, Checkpoint, TakeCheckpoint, "
            "BecomingPrimary, ...) are counted per log below.",
            ("logs.png",),
            ("logs", "control_messages"),
        ),
        Section(
            "Starts and restarts",
            "Every log that began other than at a known checkpoint: the first start, "
            "upgrades, restarts (recoveries) and new logs the files cannot tell from a "
            "checkpoint, each with its evidence: a torn tail recovery cut; a new "
            "incarnation logged by a service that logs one at every start; a log before "
            "it smaller than the size at which coordinators roll a log. quiet_seconds: "
            "the time from the instance's last record before to the first of this log, "
            "in which it was killed or stopped.",
            (),
            ("starts",),
        ),
    ]
    return out + _service_sections(tables)


def _service_sections(tables: dict[str, Any]) -> list[Section]:
    """A section per service plug-in whose frames were decoded (``<name>_streams``),
    then what was not decoded."""
    from .report_plugins import registered

    out: list[Section] = []
    for plugin in registered():
        table = f"{plugin.name}_streams"
        if len(tables.get(table, ())):
            out.append(
                Section(f"{plugin.title} streams", plugin.about, (f"{table}.png",), (table,))
            )
    if len(tables.get("undecoded", ())):
        out.append(
            Section(
                "Not decoded",
                "Transport calls or frames that did not decode, with the first reason and "
                "where (log file, offset, message).",
                (),
                ("undecoded",),
            )
        )
    return out
