"""The analytics report's charts: matplotlib (Agg, no display), one PNG per section.

Each function takes a table of :mod:`.report_tables` (or :mod:`.report_services`) and a
path, draws, writes the PNG and closes the figure. An empty table still gives a PNG that
says there was nothing to draw, so the page never points at a missing file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = [
    "call_kinds_chart",
    "calls_between_chart",
    "calls_over_time_chart",
    "logs_chart",
    "message_sizes_chart",
    "streams_chart",
]

_TOP = 8  # lines (methods) per instance, bars per chart: the rest summed as "other"
_MAX_PANELS = 8  # instances drawn in the calls-over-time chart


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=96)
    _plt().close(fig)


def _empty(path: Path, title: str, why: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 1.6))
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.4, why, ha="center", va="center")
    _save(fig, path)


def calls_over_time_chart(table: Any, path: Path, starts: Any = None) -> None:
    """One panel per instance (the busiest first), a line per method: calls per second
    (axis ``commit_time``, seconds from the panel's first call) or per seq bucket; the
    instance's restarts, upgrades and unclear new logs from ``starts`` (the table of
    :mod:`.report_starts`) marked across it (:func:`_mark_starts`)."""
    title = "Calls over time"
    timed = table[table["bucket"].notna()]
    if timed.empty:
        _empty(path, title, "no calls in these logs")
        return
    plt = _plt()
    busiest = timed.groupby("instance")["calls"].sum().sort_values(ascending=False)
    panels = list(busiest.index[:_MAX_PANELS])
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 2.6 * len(panels)), squeeze=False)
    # One origin for every timed panel, so they line up; each seq panel from its own.
    on_time = timed[timed["axis"] == "commit_time"]
    first = float(on_time["bucket"].min()) if not on_time.empty else 0.0
    for ax, instance in zip(axes[:, 0], panels, strict=True):
        rows = timed[timed["instance"] == instance]
        axis = rows["axis"].iloc[0]
        width = float(rows["width"].iloc[0])
        origin = first if axis == "commit_time" else float(rows["bucket"].min())
        by_method = rows.groupby("method")["calls"].sum().sort_values(ascending=False)
        shown = list(by_method.index[:_TOP])
        labels = rows["method"].where(rows["method"].isin(shown), "other")
        series = rows.assign(series=labels).groupby(["series", "bucket"])["calls"].sum()
        # Buckets without calls are not in the table: put them back as zeros, so a line
        # does not join two bursts across a quiet spell (at most ~300 buckets a panel).
        low, high = float(rows["bucket"].min()), float(rows["bucket"].max())
        grid = [round(low + k * width, 3) for k in range(round((high - low) / width) + 1)]
        for name in [*shown, "other"]:
            if name not in series.index.get_level_values(0):
                continue
            points = series[name].reindex(grid, fill_value=0)
            x = (points.index.to_numpy() - origin) if axis == "commit_time" else points.index
            y = points.to_numpy() / width if axis == "commit_time" else points.to_numpy()
            marker = "." if len(grid) <= 40 else None  # dots only where they are few
            ax.plot(x, y, marker=marker, drawstyle="steps-post", label=name)
        if axis == "commit_time":
            start = _utc(origin)
            ax.set_xlabel(f"seconds from {start} (commit_time)")
            ax.set_ylabel(f"calls / s (per {width:g} s)")
        else:
            ax.set_xlabel("record seq (no sidecar index: no commit_time)")
            ax.set_ylabel(f"calls / {width:g} seqs")
        if starts is not None:
            mine = starts[starts["instance"] == instance]
            _mark_starts(ax, mine, axis, origin)
        ax.set_title(str(instance))
        ax.legend(fontsize="small", loc="upper right")
    _save(fig, path)


# How each kind of start is drawn: (colour, line style, label).
# Black and grey: the methods' lines take the colour cycle.
_START_LINES = {
    "restart": ("black", "-", "restart (recovery)"),
    "upgrade": ("black", "--", "upgrade"),
    "checkpoint or restart": ("grey", ":", "new log: checkpoint or restart"),
}


def _mark_starts(ax: Any, starts: Any, axis: str, origin: float) -> None:
    """A vertical line at each start of ``starts`` (one instance's), and before each
    restart the span in which the instance wrote nothing (killed or stopped in it)."""
    import pandas as pd  # type: ignore[import-untyped]

    epoch = pd.Timestamp("1970-01-01")
    xs = []
    labelled: set[str] = set()
    for r in starts.to_dict("records"):
        style = _START_LINES.get(r["start"])
        if style is None:
            continue
        color, line, label = style
        if axis == "commit_time":
            if pd.isna(r["time"]):
                continue
            x = (r["time"] - epoch).total_seconds() - origin
        elif pd.notna(r["first_seq"]):
            x = float(r["first_seq"])
        else:
            continue
        ax.axvline(x, color=color, linestyle=line, linewidth=1.2,
                   label=None if label in labelled else label)  # fmt: skip
        labelled.add(label)
        xs.append(x)
        if r["start"] == "restart" and axis == "commit_time" and pd.notna(r["quiet_since"]):
            since = (r["quiet_since"] - epoch).total_seconds() - origin
            quiet = "no records: killed or stopped, then recovered"
            ax.axvspan(since, x, color="black", alpha=0.1,
                       label=None if quiet in labelled else quiet)  # fmt: skip
            labelled.add(quiet)
            xs.append(since)
    if xs:  # a start after the last call, or before the first, stays in view
        low, high = ax.get_xlim()
        ax.set_xlim(min(low, min(xs)), max(high, max(xs)))


def _utc(seconds: float) -> str:
    import datetime

    t = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return t.strftime("%Y-%m-%d %H:%M:%S UTC")


def message_sizes_chart(table: Any, path: Path) -> None:
    """Messages per power-of-two size bin, one bar group per kind (log scale)."""
    title = "Message payload sizes"
    if table.empty:
        _empty(path, title, "no messages with a payload")
        return
    plt = _plt()
    kinds = list(table.groupby("kind")["messages"].sum().sort_values(ascending=False).index)
    bins = sorted(set(zip(table["low"], table["high"], strict=True)))
    fig, ax = plt.subplots(figsize=(9, 3.6))
    step = 0.8 / len(kinds)
    for k, kind in enumerate(kinds):
        rows = table[table["kind"] == kind]
        counts = dict(
            zip(zip(rows["low"], rows["high"], strict=True), rows["messages"], strict=True)
        )
        xs = [i + k * step for i in range(len(bins))]
        ax.bar(xs, [counts.get(b, 0) for b in bins], width=step, label=kind)
    ax.set_xticks([i + 0.4 - step / 2 for i in range(len(bins))])
    ax.set_xticklabels([_size_label(lo, hi) for lo, hi in bins], rotation=45, ha="right")
    ax.set_yscale("log")
    ax.set_xlabel("payload bytes")
    ax.set_ylabel("messages")
    ax.set_title(title)
    ax.legend(fontsize="small")
    _save(fig, path)


def _size_label(low: int, high: int) -> str:
    def short(n: int) -> str:
        for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
            if n >= size:
                return f"{n / size:g}{unit}"
        return str(n)

    return short(low) if low == high else f"{short(low)}-{short(high)}"


def call_kinds_chart(table: Any, path: Path) -> None:
    """Per instance, stacked bars: impulses against replayable calls (async, fork)."""
    title = "Impulses versus replayable calls"
    if table.empty:
        _empty(path, title, "no calls in these logs")
        return
    plt = _plt()
    pivot = table.pivot_table(
        index="instance", columns="rpc_type", values="calls", aggfunc="sum", fill_value=0
    )
    fig, ax = plt.subplots(figsize=(9, 0.6 * len(pivot) + 1.6))
    left = [0] * len(pivot)
    for kind in ("impulse", "fork", "async"):
        if kind not in pivot.columns:
            continue
        values = list(pivot[kind])
        ax.barh([str(i) for i in pivot.index], values, left=left, label=kind)
        left = [a + b for a, b in zip(left, values, strict=True)]
    ax.set_xlabel("calls")
    ax.set_title(title)
    ax.legend(fontsize="small")
    _save(fig, path)


def calls_between_chart(table: Any, path: Path) -> None:
    """A sender x destination matrix of calls (all call types), counts written in."""
    title = "Calls between instances (sender -> destination)"
    calls = table[table["rpc_type"] != "return"]
    if calls.empty:
        _empty(path, title, "no calls in these logs")
        return
    plt = _plt()
    matrix = calls.pivot_table(
        index="sender", columns="destination", values="messages", aggfunc="sum", fill_value=0
    )
    fig, ax = plt.subplots(figsize=(1.2 * len(matrix.columns) + 3, 0.6 * len(matrix) + 2))
    ax.imshow(matrix.to_numpy(), cmap="Blues", aspect="auto")
    ax.set_xticks(range(len(matrix.columns)))
    ax.set_xticklabels([str(c) for c in matrix.columns], rotation=45, ha="right")
    ax.set_yticks(range(len(matrix.index)))
    ax.set_yticklabels([str(i) for i in matrix.index])
    ax.set_xlabel("destination")
    ax.set_ylabel("sender")
    top = matrix.to_numpy().max()
    for (r, c), value in _cells(matrix):
        color = "white" if value > top / 2 else "black"
        ax.text(c, r, str(value), ha="center", va="center", color=color, fontsize="small")
    ax.set_title(title)
    _save(fig, path)


def _cells(matrix: Any) -> list[tuple[tuple[int, int], int]]:
    values = matrix.to_numpy()
    return [
        ((r, c), int(values[r, c]))
        for r in range(values.shape[0])
        for c in range(values.shape[1])
        if values[r, c]
    ]


def logs_chart(table: Any, path: Path) -> None:
    """Log files over time, one row per instance version: where each log begins (its
    first commit time, else its first seq), marked by how it began (the ``start`` column
    of :mod:`.report_starts`), and whether its checkpoint file is still on disk."""
    title = "Log files, checkpoints and (re)starts"
    rows = table[table["records"] > 0]
    if rows.empty:
        _empty(path, title, "no records in these logs")
        return
    plt = _plt()
    timed = rows["first_time"].notna().all()
    x = rows["first_time"] if timed else rows["first_seq"].astype(float)
    labels = [
        f"{i} v{'' if v is None else v}"
        for i, v in zip(rows["instance"], rows["version"], strict=True)
    ]
    lanes = sorted(set(labels))
    y = [lanes.index(label) for label in labels]
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(lanes) + 2))
    styles = {
        "first start": ("*", 160, "tab:blue"),
        "upgrade": ("D", 70, "tab:purple"),
        "restart": ("X", 130, "tab:red"),
        "checkpoint": ("o", 50, "tab:green"),
        "checkpoint or restart": ("o", 60, "grey"),
    }
    for start, (marker, size, color) in styles.items():
        pick = (rows["start"] == start).to_numpy()
        if pick.any():
            ax.scatter(
                x[pick], [v for v, p in zip(y, pick, strict=True) if p], marker=marker, s=size,
                color=color, label=f"log begins: {start}",
            )  # fmt: skip
    kept = rows["checkpoint"].to_numpy()
    if kept.any():
        ax.scatter(
            x[kept], [v for v, p in zip(y, kept, strict=True) if p], marker="|", s=400,
            color="black", label="its checkpoint file on disk",
        )  # fmt: skip
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(lanes)
    ax.set_ylim(-0.5, len(lanes) - 0.5)
    if timed:
        import matplotlib.dates as mdates
        from matplotlib.ticker import FuncFormatter

        def hms(x: float, _: object) -> str:
            when: Any = mdates.num2date(x)  # type: ignore[no-untyped-call]
            return str(when.strftime("%H:%M:%S.%f"))[:-3]  # to the millisecond

        ax.xaxis.set_major_formatter(FuncFormatter(hms))
        ax.tick_params(axis="x", labelrotation=30)
        day = rows["first_time"].min().strftime("%Y-%m-%d")
        ax.set_xlabel(f"first commit_time of the log (UTC, from {day})")
    else:
        ax.set_xlabel("first seq of the log")
    ax.set_title(title)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    _save(fig, path)


def streams_chart(table: Any, path: Path, service: str, request: str) -> None:
    """Frames of kind ``request`` (PushRequest, Message) per stream, the busiest first."""
    title = f"{service}: {request} frames per stream"
    rows = table[(table["request"] == request) & table["stream"].notna()]
    if rows.empty:
        _empty(path, title, f"no {request} frames decoded")
        return
    plt = _plt()
    label = rows["instance"] + ": " + rows["stream"] + _partition_suffix(rows)
    per = rows.assign(label=label).groupby("label")["frames"].sum()
    per = per.sort_values(ascending=False)
    shown = per.iloc[: _TOP * 2]
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(shown) + 1.6))
    ax.barh(list(shown.index)[::-1], list(shown.to_numpy())[::-1])
    ax.set_xlabel(f"{request} frames")
    extra = f" ({len(per) - len(shown)} more streams in the table)" if len(per) > len(shown) else ""
    ax.set_title(title + extra)
    _save(fig, path)


def _partition_suffix(rows: Any) -> Any:
    parts = rows["partition"]
    return parts.map(lambda p: "" if p is None or p != p else f" [{int(p)}]")
