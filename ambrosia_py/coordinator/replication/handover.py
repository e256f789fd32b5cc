"""Handing the role to a replica started to upgrade, without a failover's wait: the
secondary's side (:class:`Asking`: ASK_ROLE once it holds the whole log, and a HANDOVER
taken or left to another) and the primary's (:class:`Handing`: once ``group.k`` have
asked, nothing more shipped or committed, then HANDOVER and a step-down). The rules are
in ``secondary.py`` and ``primary.py``; these are parts of those cores, apart by concern,
their state the cores'.
"""

from __future__ import annotations

from collections import deque

from .events import Event, Group, RoleHandedOver, Send, Timing
from .feeds import Feed
from .messages import AskRole, Handover, Message
from .states import FEED, FeedEvent, FeedState, SecondaryState, TermEvent, TermState, step

__all__ = ["Asking", "Handing"]


class Asking:
    """A secondary's side of a hand-over (see the module)."""

    replica: int
    epoch: int
    version: int
    upgrade_to: int | None
    primary: int | None
    state: SecondaryState
    term_version: tuple[int, int] | None
    durable_end: int
    log_end: int
    timing: Timing
    _events: deque[Event]
    _primary_end: int
    _asked_role: float | None
    _left_to: tuple[int, float] | None

    @property
    def wants_role(self) -> bool:
        """Started to upgrade and not upgraded yet: it asks the primary for the role."""
        return self.upgrade_to is not None and self.version < self.upgrade_to

    def leaves_role(self, now: float) -> bool:
        """Whether the primary handed the role to another replica lately: this one does
        not take it meanwhile (see the module)."""
        left = self._left_to
        return left is not None and now - left[1] < 2 * self.timing.failover_after

    def _handed(self, msg: Handover, sender: int, now: float) -> None:
        """The primary steps down for ``msg.to``: this replica, or another."""
        if msg.to == self.replica:
            self._events.append(RoleHandedOver(msg.epoch, sender))
        else:
            self._left_to = (msg.to, now)

    def _ask_role(self, now: float) -> None:
        """Ask for the role, started to upgrade, once the whole log of a term of this
        binding's version is durable here."""
        asked = self._asked_role
        if (
            not self.wants_role
            or self.state is not SecondaryState.STREAMING
            or self.primary is None
            or self.term_version is None
            or self.term_version[0] != self.version
            or self.durable_end < max(self._primary_end, self.log_end)
            or (asked is not None and now - asked < self.timing.retry_after)
        ):
            return
        self._asked_role = now
        self._events.append(Send(self.primary, AskRole(self.epoch, self.log_end)))


class Handing:
    """A primary's side of a hand-over (see the module)."""

    epoch: int
    group: Group
    timing: Timing
    state: TermState
    log_end: int
    _feeds: dict[int, Feed]
    _handing: tuple[int, int, float] | None  # (to, the log's end then, since when)
    _asks: dict[int, float]

    def _send(self, to: int, msg: Message, now: float) -> None:
        """Send ``msg`` to replica ``to`` (the core's)."""
        raise NotImplementedError

    def _step_down(
        self,
        epoch: int,
        why: TermEvent,
        reason: str,
        better: int | None = None,
        *,
        handed: bool = False,
    ) -> None:
        """End the term (the core's)."""
        raise NotImplementedError

    def _pump(self, replica: int) -> None:
        """Feed ``replica`` on, if it may take more (the core's)."""
        raise NotImplementedError

    def _advance_commit(self) -> None:
        """Move the commit point on, if it may (the core's)."""
        raise NotImplementedError

    @property
    def _frozen_end(self) -> int | None:
        """While handing over: the end of what may still be shipped and committed."""
        return None if self._handing is None else self._handing[1]

    def _asked_role(self, replica: int, now: float) -> None:
        """``replica``, started to upgrade, asks for the role: once enough have (see the
        module), ship nothing appended from now on, and hand it over once it holds the
        rest (at once, if it does)."""
        feed = self._feeds[replica]
        if self._handing is not None or feed.state not in (FeedState.STREAMING, FeedState.READING):
            return
        self._asks[replica] = now
        asking = [
            r
            for r, t in self._asks.items()
            if now - t < self.timing.failover_after and r in self.group.replicas
        ]
        if len(asking) < self.group.k:
            return
        to = max(asking, key=lambda r: (self._feeds[r].match, -r))
        self._handing = (to, self.log_end, now)
        self._check_handover(now)

    def _check_handover(self, now: float) -> None:
        handing = self._handing
        if handing is None or self.state is not TermState.ESTABLISHED:
            return
        to, end, _ = handing
        if self._feeds[to].match < end:
            return
        for r in self._feeds:
            self._send(r, Handover(self.epoch, to, end), now)
        reason = f"handed the role to replica {to}, which holds its log to {end}"
        self._step_down(self.epoch, TermEvent.HANDED, reason, to, handed=True)

    def _handover_lapsed(self, now: float) -> None:
        """A hand-over the chosen replica did not complete in time is given up: ship on,
        commit on."""
        handing = self._handing
        if handing is None or now - handing[2] < self.timing.establish_within:
            return
        self._handing = None
        for r, feed in self._feeds.items():
            if feed.state is FeedState.STREAMING and feed.sent_end < self.log_end:
                feed.state = step("feed", FEED, feed.state, FeedEvent.BEHIND)
            self._pump(r)
        self._advance_commit()
