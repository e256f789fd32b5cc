"""A replica's part in changing its instance's group (the rules:
``coordinator/replication/group.py``; the command: ``ambrosia-py group``).

The registry's store holds the group. A change is written there as the new group
changing from the old (``PrimaryElection.change_group``); then, here:

- the primary finds it at its next look at the store (every :data:`GROUP_EVERY`
  seconds) and begins a new term of its own in the changing group (the store's
  ``renew``: the role stays its, under a higher epoch), which needs a quorum of each
  part; the records it appends meanwhile wait until the term is established. If the
  store will not renew its term, or the term is not established, it steps down and
  stops, as every primary that steps down does;
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
import time
from collections.abc import Coroutine

from ..core.config import CoordinatorError
from ..registry.interface import RegistryError
from ..registry.primary import PrimaryElection, Term
from ..replication import Group, Message, Primary, Secondary, Timing
from ..replication.states import TermState
from .disk import ReplicaDisk

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
    timing: Timing
    _settling: bool
    _renewing: bool
    _early: list[tuple[int, Message]]  # of the renewed epoch, before it is known here
    _held: list[bytes]  # records appended while a renewed term gathers
    disk: ReplicaDisk

    def _received(self, sender: int, msg: Message) -> None:
        """A message from another replica (the node's)."""
        raise NotImplementedError

    def _pump(self) -> None:
        """Carry out what the core asks (the node's)."""
        raise NotImplementedError

    def _deposed(self, epoch: int, reason: str, *, handed: bool = False) -> None:
        """This replica's term is over (the node's)."""
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        """The replicated log failed (the node's)."""
        raise NotImplementedError

    def _later(self, work: Coroutine[object, object, None]) -> None:
        """Run ``work`` in the background (the node's)."""
        raise NotImplementedError

    def _of_group(self, sender: int) -> bool:
        """Whether messages from ``sender`` are taken: a replica of the group this one
        knows, or of the group of the term it follows."""
        return sender in self.group.members or sender in self.core.group.members

    def _before_renewed(self, sender: int, msg: Message) -> bool:
        """While the store renews this primary's term, keep what comes under a higher
        epoch for the new term: the others may learn its epoch from the registry's watch
        before this replica learns it from the store's answer (the old term would step
        down, taking the renewed epoch for another's)."""
        if self._renewing and isinstance(self.core, Primary) and msg.epoch > self.core.epoch:
            self._early.append((sender, msg))
            return True
        return False

    def _release_held(self) -> None:
        """A renewed term is established: the records appended while it gathered go to
        it, durable as far as they were reported so while it gathered."""
        core = self.core
        if self._held and isinstance(core, Primary):
            held, self._held = self._held, []
            core.append(held, time.monotonic())
            if self.disk.log is not None:
                core.records_durable(self.disk.log.durable_end)

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

    async def _renew(self, term: Term, core: Primary, group: Group) -> None:
        """Begin a term of ``group`` in place of ``term``, keeping the role."""
        try:
            renewed = await asyncio.to_thread(
                self.election.renew, term, core.log_end, group_version=group.version
            )
        except RegistryError as exc:
            log.warning("replica %d could not renew its term: %s", self.replica, exc)
            renewed = None
        finally:
            self._renewing = False
        early, self._early = self._early, []
        if self.term is not term or self.core is not core:
            return  # the term ended meanwhile
        if renewed is None:
            why = f"the group changed to {group.describe()}, and its term could not be renewed"
            self._deposed(core.epoch, why, handed=True)
        else:
            self._begin_renewed(core, renewed, group)
        for sender, msg in early:
            self._received(sender, msg)

    def _begin_renewed(self, core: Primary, renewed: Term, group: Group) -> None:
        self.group, self.term = group, renewed
        self.core = Primary.taking_over(
            core,
            group=group,
            epoch=renewed.epoch,
            now=time.monotonic(),
            timing=self.timing,
            version=core.version,
            since=max(core.since, core.log_base),
        )
        log.info(
            "replica %d is primary from epoch %d (the group of %r changed to %s)",
            self.replica,
            renewed.epoch,
            self.instance,
            group.describe(),
        )
        self._pump()

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
            if self.term is None or self._settling or self._renewing:
                return
            if core.state is not TermState.ESTABLISHED:
                self._deposed(core.epoch, f"the group changed to {stored.describe()}")
                return
            self._renewing = True
            self._later(self._renew(self.term, core, stored))
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
