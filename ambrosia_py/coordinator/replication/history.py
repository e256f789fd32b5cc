"""Which term wrote which part of a log: the epoch history, and where two logs agree.

A log record does not say which primary wrote it (the record format is AMBROSIA's), so
every replica keeps beside its log a short list of :class:`EpochStart` entries: ``(epoch,
start)``, the epoch of a term and the seq at which that term's part of the log begins.
A primary adds its own entry when its term starts, at its log's end then (its *term
start*), before it writes a record of the term; a secondary copies the primary's whole
history when it syncs to it. Epochs strictly grow along the list; starts never go down.
Two entries may share a start: a term that wrote nothing before the next one began.

An entry whose start lies past the log's end (the log lost an unsynced tail in a crash,
the history was saved first) says nothing yet: only the *effective* entries, those that
start at or before the end, count. The epoch of record ``seq`` is the epoch of the last
effective entry starting at or before it; the log's **last epoch** is that of its last
effective entry. A replica's **rank** is ``(last epoch, log end)``, compared in that
order: the Raft rule of the up-to-date log, with the entry a term start adds standing
for the no-op record a Raft leader writes (it occupies no seq).

:func:`agreement` finds the seq up to which two logs hold the same records from their
histories alone: the latest epoch both hold, then the sooner of the two ends of that
epoch's part. That it is exact rests on the package's invariants (every two histories
holding an epoch hold the same entries up to it, from the later of their first entries
on; a record's epoch names the primary that wrote it); a pair of histories that breaks
the first is refused.

A history is **compacted** below a seq whose records are all committed (a checkpoint's):
the entries wholly below it go, the one covering it stays (:meth:`History.compacted`),
so a history holds the terms since its log's checkpoint, not every term there ever was.
Only a primary compacts, below its own checkpoint; a secondary keeps its own entries
before the first of the primary's it takes, so every history reaches back to its log's
checkpoint. Two histories then may share no epoch although their logs share committed
records; who holds such a log is told so (:func:`agreement` says None) and starts over
from the primary's checkpoint (``secondary.py``), which stands past every record of it
that may be committed.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from .errors import ReplicationRuleError

__all__ = ["MAX_POSITION", "EpochStart", "History", "agreement"]

MAX_POSITION = 2**63 - 1
"""The largest epoch or seq: AMBROSIA's seqs are signed 64-bit numbers."""


@attrs.frozen
class EpochStart:
    """The term of ``epoch`` wrote the log from seq ``start`` on (until the next entry)."""

    epoch: int
    start: int


@attrs.frozen
class History:
    """A replica's epoch history: entries in order, epochs strictly growing, starts never
    going down; every epoch at least 1, every start at least 0."""

    entries: tuple[EpochStart, ...] = ()

    def __attrs_post_init__(self) -> None:
        prev: EpochStart | None = None
        for i, entry in enumerate(self.entries):
            if not 1 <= entry.epoch <= MAX_POSITION or not 0 <= entry.start <= MAX_POSITION:
                raise ReplicationRuleError(f"history entry {i}: {entry} out of range")
            if prev is not None and (entry.epoch <= prev.epoch or entry.start < prev.start):
                raise ReplicationRuleError(
                    f"history entry {i}: {entry} does not follow {prev} "
                    "(epochs must grow, starts never go down)"
                )
            prev = entry

    @classmethod
    def of(cls, pairs: Iterable[tuple[int, int]]) -> History:
        """A history from ``(epoch, start)`` pairs."""
        return cls(tuple(EpochStart(e, s) for e, s in pairs))

    def effective(self, end: int) -> History:
        """The entries that say something about a log ending at ``end``."""
        n = len(self.entries)
        while n and self.entries[n - 1].start > end:
            n -= 1
        return self if n == len(self.entries) else History(self.entries[:n])

    def last_epoch(self, end: int) -> int:
        """The epoch of the last effective entry for a log ending at ``end`` (0: none)."""
        eff = self.effective(end).entries
        return eff[-1].epoch if eff else 0

    def rank(self, end: int) -> tuple[int, int]:
        """``(last epoch, end)``: the higher, the more up to date the log."""
        return (self.last_epoch(end), end)

    def epoch_at(self, seq: int) -> int:
        """The epoch of the term that wrote record ``seq`` (0: no entry covers it)."""
        found = 0
        for entry in self.entries:
            if entry.start > seq:
                break
            found = entry.epoch
        return found

    def compacted(self, floor: int) -> History:
        """This history without the entries wholly below ``floor`` (every record below
        it committed): from the last entry starting at or before it on."""
        keep = 0
        for i, entry in enumerate(self.entries):
            if entry.start > floor:
                break
            keep = i
        return self if keep == 0 else History(self.entries[keep:])

    def extended(self, epoch: int, start: int) -> History:
        """This history with a new term's entry at its end."""
        return History((*self.entries, EpochStart(epoch, start)))

    def __len__(self) -> int:
        return len(self.entries)


def agreement(mine: History, my_end: int, theirs: History, their_end: int | None) -> int | None:
    """The seq up to which the log ``mine``/``my_end`` holds the same records as the log
    ``theirs``/``their_end``: everything below it agrees, the record at it does not (or
    one of the logs ends there). None if the two share no epoch: then they agree on
    nothing either history can vouch for (see the module on compaction).

    ``their_end`` None stands for a primary's log while its term goes on: the part of its
    last epoch has no end yet, as far as what the other log may hold of it goes (a
    secondary computes its truncation point so, from the history a Sync brings, and gets
    the same answer however late the Sync arrives).

    Raises :class:`ReplicationRuleError` if the two histories hold an epoch at different
    starts or disagree on the entries before it (from the later first entry on).
    """
    a = mine.effective(my_end).entries
    b = theirs.entries if their_end is None else theirs.effective(their_end).entries
    where = {entry.epoch: j for j, entry in enumerate(b)}
    for i in range(len(a) - 1, -1, -1):
        j = where.get(a[i].epoch)
        if j is None:
            continue
        first = max(a[0].epoch, b[0].epoch)  # compacted: only what both still hold
        a_held = [e for e in a[: i + 1] if e.epoch >= first]
        b_held = [e for e in b[: j + 1] if e.epoch >= first]
        if a_held != b_held:
            raise ReplicationRuleError(
                f"histories disagree up to epoch {a[i].epoch}: "
                f"{_show(a[: i + 1])} against {_show(b[: j + 1])}"
            )
        a_stop = a[i + 1].start if i + 1 < len(a) else my_end
        if j + 1 < len(b):
            return min(a_stop, b[j + 1].start)
        return a_stop if their_end is None else min(a_stop, their_end)
    return None


def _show(entries: tuple[EpochStart, ...] | list[EpochStart]) -> str:
    return "[" + ", ".join(f"({e.epoch}, {e.start})" for e in entries) + "]"
