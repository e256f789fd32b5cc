"""Where the demo prints, and in which form: decided once, here.

In a terminal the demo is rich's: a live view redrawn in place, tables in boxes, rules,
a spinner. Anywhere else (``make demo | tee``, a CI log, a file) nothing is redrawn and
nobody sees a spinner, so :class:`Output` prints plain lines instead:

- each step is one line as it happens, stamped with the seconds since the start, and a
  long step says it still runs (:meth:`Output.heartbeat`), so a log never goes quiet for
  a minute while Spark works;
- no line is wrapped (rich would wrap at 80 columns, its width without a terminal,
  cutting messages in the middle): a log viewer wraps, or not, as its reader likes;
- nothing is drawn with box characters: tables are aligned columns, rules a plain line,
  and the live view's last frame (a panel, which rich would print without its final line
  break) is one summary line.

Every module of the demo prints through one :class:`Output`, so ``demo --basics``, the
pipeline, the verdict and the Spark step follow the same rules.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console, JustifyMethod
from rich.table import Table
from rich.text import Text

__all__ = ["HEARTBEAT", "Output"]

HEARTBEAT = 10.0  # seconds: off a terminal, the longest a long step goes without a line
_BOX_DRAWING = re.compile("[\u2500-\u257f]")


class Output:
    """The demo's console and whether it is a terminal (:attr:`terminal`).

    ``console`` defaults to a new :class:`rich.console.Console` on stdout; whether it is
    a terminal is rich's own test (``Console.is_terminal``, which also honours
    ``FORCE_COLOR`` and ``TTY_COMPATIBLE``). ``heartbeat`` is the longest silence, in
    seconds, a long step keeps off a terminal.
    """

    def __init__(self, console: Console | None = None, *, heartbeat: float = HEARTBEAT) -> None:
        self.console = console if console is not None else Console()
        self.terminal = self.console.is_terminal
        self.heartbeat_interval = heartbeat
        self.started = time.monotonic()
        self._last_line = self.started  # when a line was last printed (heartbeats count it)

    def elapsed(self) -> float:
        """Seconds since the demo started (the stamp of :meth:`event`)."""
        return time.monotonic() - self.started

    def print(self, *objects: Any, **options: Any) -> None:
        """:meth:`rich.console.Console.print`; off a terminal without wrapping."""
        if not self.terminal:
            options.setdefault("soft_wrap", True)
        self.console.print(*objects, **options)
        self._last_line = time.monotonic()

    def event(self, text: str, style: str = "") -> None:
        """A line stamped with the seconds since the start."""
        stamp = Text(f"{self.elapsed():6.1f}s  ", style="dim")
        self.print(stamp + Text(text, style=style), highlight=False)

    def progress(self, text: str) -> None:
        """A step's line off a terminal only: in one the live view or a spinner says it."""
        if not self.terminal:
            self.event(text)

    def verbatim(self, text: str) -> None:
        """Another program's output (a command's, the end of a log), as it printed it.

        Off a terminal its box drawing is blanked: a child whose stdout is a pipe still
        draws its tables in boxes (``ambrosia-py instances`` does). A space for each box
        character keeps the columns aligned; a line that was all border goes.
        """
        if not self.terminal:
            kept = []
            for line in text.splitlines():
                plain = _BOX_DRAWING.sub(" ", line).rstrip()
                if plain or not _BOX_DRAWING.search(line):
                    kept.append(plain)
            text = "\n".join(kept)
        self.print(text, markup=False, highlight=False)

    def rule(self, title: str) -> None:
        """A heading: rich's rule in a terminal, else a plain line."""
        if self.terminal:
            self.console.rule(title)
        else:
            self.print(f"-- {title} --", markup=False, highlight=False)

    def table(
        self,
        title: str,
        columns: Sequence[tuple[str, JustifyMethod]],
        rows: Sequence[Sequence[str]],
    ) -> None:
        """A table: rich's in a terminal, else the title and aligned plain columns."""
        if self.terminal:
            table = Table(title=title)
            for header, justify in columns:
                table.add_column(header, justify=justify)
            for row in rows:
                table.add_row(*row)
            self.print(table)
            return
        self.print(title, markup=False, highlight=False)
        for line in _aligned(columns, rows):
            self.print(line, markup=False, highlight=False)

    @contextmanager
    def status(self, text: str) -> Iterator[None]:
        """A spinner saying ``text`` in a terminal; off one, nothing (see :meth:`heartbeat`)."""
        if self.terminal:
            with self.console.status(text):
                yield
        else:
            yield

    @contextmanager
    def heartbeat(self, what: str) -> Iterator[None]:
        """Off a terminal, while the block runs, ``WHAT: still running, N s`` whenever no
        line has been printed for the interval; in a terminal nothing (the live view or a
        spinner shows it runs).

        The line comes from a thread, which ends with the block, pass or fail: it is
        joined before this returns, so it never prints after the step, nor after the
        command returned.
        """
        if self.terminal:
            yield
            return
        interval = self.heartbeat_interval
        start = time.monotonic()
        stop = threading.Event()

        def beat() -> None:
            while True:
                quiet_since = max(self._last_line, start)
                if stop.wait(max(0.0, quiet_since + interval - time.monotonic())):
                    return
                now = time.monotonic()
                if now - max(self._last_line, start) >= interval:
                    self.event(f"{what}: still running, {now - start:.0f} s")

        thread = threading.Thread(target=beat, name=f"demo heartbeat: {what}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _aligned(
    columns: Sequence[tuple[str, JustifyMethod]], rows: Sequence[Sequence[str]]
) -> Iterator[str]:
    """The header and rows as lines, each column as wide as its widest cell, two spaces
    apart, indented by two (the title above is not)."""
    table = [[header for header, _ in columns], *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in table) for i in range(len(columns))]
    for row in table:
        cells = (
            cell.rjust(width) if justify == "right" else cell.ljust(width)
            for cell, width, (_, justify) in zip(row, widths, columns, strict=True)
        )
        yield ("  " + "  ".join(cells)).rstrip()
