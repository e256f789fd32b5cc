"""The check before a take-over (Raft's pre-vote), a secondary's side: it probes the
other replicas once its primary fell silent, answers their probes, and reports the
primary lost only once enough of them agree. The rules are in ``secondary.py``
(:meth:`~.secondary.Secondary.tick`); this is a part of that core, apart by concern, its
state the core's.
"""

from __future__ import annotations

from collections import deque

from .events import Event, Group, PrimaryLost, Send, Timing
from .messages import Probe, Silence

__all__ = ["Probing"]


class Probing:
    """A secondary's probes and its answers to others' (see the module)."""

    replica: int
    epoch: int
    primary: int | None
    group: Group
    timing: Timing
    _events: deque[Event]
    _heard: float  # the last message from the primary, or the start
    _lost_said: float  # the last PrimaryLost, or the start
    _round: int  # the last probe round asked
    _probe: _Round | None  # the round under way, if any

    def leaves_role(self, now: float) -> bool:
        """Whether the role is left to another for now (the core's)."""
        raise NotImplementedError

    def _answer_probe(self, sender: int, msg: Probe, now: float) -> None:
        """Silent: nothing heard from the primary for ``failover_after / 2``."""
        silent = now - self._heard >= self.timing.failover_after / 2
        self._events.append(Send(sender, Silence(self.epoch, msg.round, silent)))

    def _watch_primary(self, now: float) -> None:
        """Past ``failover_after`` of silence: probe the others (again every half of it
        while it lasts), or report the primary lost at once when no other's word is
        needed."""
        failover_after = self.timing.failover_after
        if (
            now - max(self._heard, self._lost_said) < failover_after
            or self.leaves_role(now)
            or self.replica not in self.group.members  # waits to be added: no part yet
        ):
            return
        others = self._others()
        if not others:
            self._lost(now)
        elif self._probe is None or now - self._probe.sent >= failover_after / 2:
            self._round += 1
            self._probe = _Round(self._round, now)
            for replica in others:
                self._events.append(Send(replica, Probe(self.epoch, self._round)))

    def _others(self) -> list[int]:
        """The replicas to probe; none when no other's word is needed."""
        if self.group.term_met({self.replica}):
            return []
        return sorted(self.group.members - {self.replica})

    def _answered(self, sender: int, msg: Silence, now: float) -> None:
        probe = self._probe
        if probe is None or msg.round != probe.round or not msg.silent:
            return
        probe.agreed.add(sender)
        if self.group.term_met(probe.agreed | {self.replica}):
            self._lost(now)

    def _lost(self, now: float) -> None:
        self._probe = None
        self._lost_said = now
        self._events.append(PrimaryLost(self.epoch, self.primary))


class _Round:
    """One round of probes: when it was asked, and who answered "silent"."""

    def __init__(self, round: int, sent: float) -> None:
        self.round = round
        self.sent = sent
        self.agreed: set[int] = set()
