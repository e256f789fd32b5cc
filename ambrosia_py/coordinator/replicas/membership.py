"""A replica's part in changing its instance's group (the rules:
``coordinator/replication/group.py``; the command: ``ambrosia-py group``).

The registry's store holds the group. A change is written there as the new group
changing from the old (``PrimaryElection.change_group``); then, here:

- the primary finds it at its next look at the store (every :data:`GROUP_EVERY`
  seconds) and steps down, giving the role up in the registry: the next term, of
  whichever replica of either part takes the role, is of the changing group, which
  needs a quorum of each part. Like every primary that steps down it stops, and
  rejoins as a secondary when started again;
- the primary of that term, once it has committed the term's start (every committed
  record is then on ``k`` of the new members), settles the change in the store;
- a replica the settled group leaves out stops, saying so; one a change adds, started
  before the change (it waits, registered, taking no part) or after, catches up as a
  recovering replica does.

:class:`Membership` is a part of :class:`~.node.ReplicaNode`, apart by concern.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine

from ..core.config import CoordinatorError
from ..registry.interface import RegistryError
from ..registry.primary import PrimaryElection, Term
from ..replication import Group, Primary, Secondary

__all__ = ["GROUP_EVERY", "Membership"]

log = logging.getLogger("ambrosia_py.coordinator")

GROUP_EVERY = 0.5  # seconds between looks at the store's group


class LeftGroupError(CoordinatorError):
    """The instance's group, settled, leaves this replica out: it stops."""


class Membership:
    """See the module; its state is the node's."""

    instance: str
    replica: int
    group: Group
    election: PrimaryElection
    core: Primary | Secondary
    term: Term | None
    term_start: int
    _settling: bool

    def _deposed(self, epoch: int, reason: str, *, handed: bool = False) -> None:
        """This replica's term is over (the node's)."""
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        """The replicated log failed (the node's)."""
        raise NotImplementedError

    def _later(self, work: Coroutine[object, object, None]) -> None:
        """Run ``work`` in the background (the node's)."""
        raise NotImplementedError

    def _members(self) -> frozenset[int]:
        """The replicas whose messages are taken: of the group this replica knows, and
        of the group of the term it follows."""
        return self.group.members | self.core.group.members

    def _settle_if_due(self, end: int) -> None:
        """The primary of a changing group's term committed up to ``end``: once that
        covers its start, settle the change."""
        group, term = self.group, self.term
        if group.previous is None or term is None or end < self.term_start or self._settling:
            return
        self._settling = True
        self._later(self._settle(term, group))

    async def _settle(self, term: Term, group: Group) -> None:
        try:
            settled = await asyncio.to_thread(self.election.settle_group, term, group)
        except RegistryError as exc:
            log.warning("replica %d could not settle the group change: %s", self.replica, exc)
            self._settling = False  # tried again at the next commit
            return
        if settled is None:  # the term is over, or the group moved on: the next look says
            self._settling = False
            return
        self.group = settled
        self._settling = False
        log.info(
            "replica %d settled the change of %r's group: %s",
            self.replica,
            self.instance,
            settled.describe(),
        )
        if self.replica not in settled.replicas:
            self._later(asyncio.to_thread(self.election.resign, term))
            self._fail(
                LeftGroupError(
                    f"replica {self.replica} left the group of {self.instance!r} "
                    f"({settled.describe()}): it stops"
                )
            )

    async def _watch_group(self) -> None:
        while True:
            await asyncio.sleep(GROUP_EVERY)
            try:
                stored = await asyncio.to_thread(self.election.group, self.instance)
            except RegistryError as exc:
                log.info("replica %d could not read its group: %s", self.replica, exc)
                continue
            if stored is not None and stored.version != self.group.version:
                self._group_moved(stored)

    def _group_moved(self, stored: Group) -> None:
        core = self.core
        if isinstance(core, Primary):
            if self.term is not None and not self._settling:
                self._deposed(
                    core.epoch,
                    f"the group of {self.instance!r} changed to {stored.describe()}; a term "
                    "of the new group begins",
                    handed=True,
                )
            return
        was_member = self.replica in self.group.members
        if self.replica in stored.members:
            if not was_member:
                log.info(
                    "replica %d joins the group of %r: %s",
                    self.replica,
                    self.instance,
                    stored.describe(),
                )
            self.group = stored
        elif was_member and stored.previous is None:
            self._fail(
                LeftGroupError(
                    f"replica {self.replica} left the group of {self.instance!r} "
                    f"({stored.describe()}): it stops"
                )
            )
