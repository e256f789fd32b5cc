"""The pipeline demo's live view: counters, the processes, and each crash as it happens.

:class:`PipelineView` holds what the demo last saw (the counters, each service's state)
and renders it on every refresh of a :class:`rich.live.Live`; crashes and recoveries are
printed above the live part as lines, so they stay in the scrollback (and in a log when
the output is not a terminal, where only the final frame of the live part is shown).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

__all__ = ["Counters", "PipelineView", "ServiceState"]

PIPELINE = "producer -> Ockam hub -> Wallaroo connector -> Wallaroo worker (aggregates)"
SERVICES = ("hub", "connector", "worker")


@attrs.define
class Counters:
    """Readings at each stage, as last seen."""

    produced: int = 0  # made by the producer and handed to its publisher
    stored: int = 0  # in the hub's durable log (confirmed, or already delivered)
    delivered: int = 0  # the worker's point for the stream: in the worker's durable log
    aggregated: int = 0  # folded into the per-sensor counts and sums
    reconnects: int = 0  # the producer's reconnects to the hub
    recovered: int = 0  # readings the producer found stored after a drop (not sent again)


@attrs.define
class ServiceState:
    """One immortal as the view shows it."""

    state: str = "starting"  # starting, up, killed, recovering
    pids: str = ""  # service process / coordinator
    kills: int = 0
    since: float = attrs.field(factory=time.monotonic)


_LABELS = (
    ("produced", "made by the producer"),
    ("stored", "in the hub's log"),
    ("delivered", "in the worker's log"),
    ("aggregated", "in the sensors' sums"),
)
_STYLES = {"up": "green", "starting": "yellow", "recovering": "yellow", "killed": "red"}


class PipelineView:
    """The state the live view renders; :meth:`event` prints a line above it."""

    def __init__(self, console: Console, events: int) -> None:
        self.console = console
        self.events = events
        self.counters = Counters()
        self.services = {name: ServiceState() for name in SERVICES}
        self.next_step = ""
        self.started = time.monotonic()

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def event(self, text: str, style: str = "") -> None:
        """A line in the scrollback, stamped with the seconds since the start."""
        stamp = Text(f"{self.elapsed():6.1f}s  ", style="dim")
        self.console.print(stamp + Text(text, style=style), highlight=False)

    def set_service(self, name: str, state: str, pids: str | None = None) -> None:
        svc = self.services[name]
        if state != svc.state:
            svc.state, svc.since = state, time.monotonic()
        if pids is not None:
            svc.pids = pids

    def render(self) -> RenderableType:
        counts = Table.grid(padding=(0, 2))
        for _ in range(4):
            counts.add_column()
        for key, meaning in _LABELS:
            value = getattr(self.counters, key)
            bar = ProgressBar(
                total=max(1, self.events), completed=min(value, self.events), width=32
            )
            counts.add_row(key, bar, Text(f"{value:>9,}", style="bold"), Text(meaning, "dim"))
        c = self.counters
        extra = (
            f"producer: {c.reconnects} reconnects mid-push, {c.recovered} readings "
            "found stored after a drop (not pushed again)"
        )
        procs = Table.grid(padding=(0, 2))
        for _ in range(4):
            procs.add_column()
        now = time.monotonic()
        for name, svc in self.services.items():
            state = Text(f"{svc.state} {now - svc.since:4.1f}s", _STYLES.get(svc.state, ""))
            procs.add_row(name, state, f"pids {svc.pids}", f"SIGKILLs {svc.kills}")
        body = Group(
            Text(PIPELINE, style="bold"),
            Text(""),
            counts,
            Text(extra, style="dim"),
            Text(""),
            procs,
            Text(self.next_step, style="cyan"),
        )
        return Panel(body, title="ambrosia-py demo", subtitle=f"{self.elapsed():.1f} s")

    @contextmanager
    def live(self) -> Iterator[Live]:
        """The live view for the ``with`` block (refreshed four times a second)."""
        with Live(get_renderable=self.render, console=self.console, refresh_per_second=4) as live:
            yield live
