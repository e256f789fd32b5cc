"""The pipeline demo's live view: counters, the processes, and each crash as it happens.

:class:`PipelineView` holds what the demo last saw (the counters, each service's state)
and renders it on every refresh of a :class:`rich.live.Live`; crashes and recoveries are
printed above the live part as lines, so they stay in the scrollback. Off a terminal
(:mod:`.output`) there is no live part: the lines alone, and at the end one plain line
summing up what the live view would show.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import attrs
from rich.console import Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from .output import Output

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

    def __init__(self, out: Output, events: int) -> None:
        self.out = out
        self.events = events
        self.counters = Counters()
        self.services = {name: ServiceState() for name in SERVICES}
        self.next_step = ""

    def elapsed(self) -> float:
        return self.out.elapsed()

    def event(self, text: str, style: str = "") -> None:
        """A line in the scrollback, stamped with the seconds since the start."""
        self.out.event(text, style)

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

    def summary(self) -> str:
        """What the live view shows, in one line (its stand-in off a terminal)."""
        c = self.counters
        services = ", ".join(
            f"{name} {svc.state} ({svc.kills} SIGKILLs)" for name, svc in self.services.items()
        )
        return (
            f"pipeline: {c.produced:,} produced, {c.stored:,} stored, {c.delivered:,} "
            f"delivered, {c.aggregated:,} aggregated of {self.events:,}; {services}"
        )

    @contextmanager
    def live(self) -> Iterator[None]:
        """The live view for the ``with`` block (refreshed four times a second); off a
        terminal, :meth:`summary` once the block ends, pass or fail."""
        if self.out.terminal:
            console = self.out.console
            with Live(get_renderable=self.render, console=console, refresh_per_second=4):
                yield
            return
        try:
            yield
        finally:
            self.out.event(self.summary())
