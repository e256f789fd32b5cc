"""The analytics report's page: one self-contained ``index.html`` (inline style, no
scripts, nothing fetched) beside its PNG charts, and the tables as Parquet under
``tables/``.

The page leads with the totals it was built from, then one section per chart: what is
counted (the definitions of :mod:`.report_tables`), the chart, and the head of its table
(the whole table is the Parquet file the section names).
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = ["Section", "TOTAL_LABELS", "total_label", "write_page", "write_tables"]

_ROWS_SHOWN = 40

TOTAL_LABELS = {
    "log_files": "log files",
    "instance_versions": "instance versions",
    "records": "records (with messages)",
    "messages": "messages (batches flattened; a damaged record or region is one)",
    "damaged": "damaged records or regions",
    "calls": "calls (async + fork + impulse)",
    "async": "async calls",
    "fork": "fork calls",
    "impulse": "impulses",
    "returns": "return values",
    "other": "other messages (not RPC)",
    "payload_bytes": "payload bytes",
    "undecoded_frames": "transport calls or frames not decoded",
    "restarts": "restarts (recoveries) the logs show",
    "maybe_restarts": "new logs that were a checkpoint or a restart (the files do not say)",
}


def total_label(name: str) -> str:
    """What the page calls the total ``name``: :data:`TOTAL_LABELS`, or for a service's
    ``<plug-in>_frames`` its frames decoded (:mod:`.report_plugins`)."""
    if name in TOTAL_LABELS:
        return TOTAL_LABELS[name]
    if name.endswith("_frames"):
        from .report_plugins import registered

        for plugin in registered():
            if name == f"{plugin.name}_frames":
                return f"{plugin.title} frames decoded"
    return name


_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 70em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.85em; margin: 0.5em 0; }
td, th { border: 1px solid #ddd; padding: 2px 6px; text-align: right; }
th { background: #f3f3f3; } td:first-child, th:first-child { text-align: left; }
img { max-width: 100%; border: 1px solid #eee; }
p.note { color: #555; font-size: 0.9em; }
"""


@attrs.frozen
class Section:
    """One part of the page: a heading, what it counts, its charts and its tables."""

    title: str
    text: str
    charts: tuple[str, ...]  # PNG file names beside index.html
    tables: tuple[str, ...]  # table names (tables/<name>.parquet)


def write_tables(out: Path, tables: dict[str, Any]) -> None:
    """Each pandas table as ``out/tables/<name>.parquet``."""
    folder = out / "tables"
    folder.mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        table.to_parquet(folder / f"{name}.parquet", index=False)


def _table_html(name: str, table: Any) -> str:
    shown = table.head(_ROWS_SHOWN)
    # 15 significant digits: epoch seconds keep their milliseconds, means stay short.
    body = shown.to_html(
        index=False, na_rep="", border=0, escape=True, float_format="{:.15g}".format
    )
    more = f" (the first {_ROWS_SHOWN} of {len(table)} rows)" if len(table) > _ROWS_SHOWN else ""
    where = html.escape(f"tables/{name}.parquet")
    return f'<p class="note">Table <a href="{where}">{where}</a>{more}:</p>\n{body}'


def write_page(
    out: Path,
    data_dir: Path,
    totals: dict[str, int],
    sections: Sequence[Section],
    tables: dict[str, Any],
    notes: Sequence[str],
) -> Path:
    """Write ``out/index.html``; return its path."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    rows = "\n".join(
        f"<tr><td>{html.escape(total_label(k))}</td><td>{v:,}</td></tr>" for k, v in totals.items()
    )
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>ambrosia-py analyze: {html.escape(str(data_dir))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        f"<h1>Recorded logs of {html.escape(str(data_dir))}</h1>",
        f'<p class="note">Built {now} by <code>ambrosia-py analyze</code> from these totals'
        " (every number below is counted from the same rows):</p>",
        f'<table id="totals"><tr><th>total</th><th>count</th></tr>\n{rows}\n</table>',
        *(f'<p class="note">{html.escape(n)}</p>' for n in notes),
    ]
    for section in sections:
        parts.append(f"<h2>{html.escape(section.title)}</h2>")
        parts.append(f"<p>{html.escape(section.text)}</p>")
        for chart in section.charts:
            alt = html.escape(section.title)
            parts.append(f'<p><img src="{html.escape(chart)}" alt="{alt}"></p>')
        for name in section.tables:
            parts.append(_table_html(name, tables[name]))
    parts.append("</body></html>\n")
    page = out / "index.html"
    page.write_text("\n".join(parts), encoding="utf-8")
    return page
