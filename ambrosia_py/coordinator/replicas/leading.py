"""A replica's dealings with the registry: where it listens and how far its log
reaches (published for ``instances`` and for the other replicas to dial), the terms the
registry names (followed), and taking the primary role: founding an instance nobody has
started, taking over from a term found silent, taking the role when nobody holds it, or
taking it from a live primary that handed it over (an upgrade's).

:class:`Leading` is a part of :class:`~.node.ReplicaNode`, apart by concern: the node
drives the replication cores; this talks to the registry (its calls, blocking, run in
worker threads) and hands the node a term once one is won.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from ..registry.interface import Endpoint, RegistryError
from ..registry.primary import PrimaryElection, Term
from ..replication import Group, Primary, PrimaryLost, RoleHandedOver, Secondary
from .disk import ReplicaDisk

__all__ = ["POSITION_EVERY", "Leading"]

log = logging.getLogger("ambrosia_py.coordinator")

POSITION_EVERY = 1.0  # seconds between updates of the log position the registry shows
# Handed the role, a replica tries to take it this long (the old primary gives it up in
# the registry as it steps down), this often.
HANDED_WITHIN = 2.0
HANDED_RETRY = 0.02


class Leading:
    """The registry side of a replica (see the module); its state is the node's."""

    instance: str
    replica: int
    group: Group
    election: PrimaryElection
    disk: ReplicaDisk
    core: Primary | Secondary
    term: Term | None
    address: Endpoint
    _published: tuple[int, bool]
    _seen: Term | None
    _won: asyncio.Future[Term]
    _failed: asyncio.Future[None]
    _campaigning: bool
    _retry_at: float
    _renewing: bool  # the store renews this primary's term (membership.py)

    def _end(self) -> int:
        return self.core.log_end

    def _pump(self) -> None:
        """Carry out what the core asks (the node's)."""
        raise NotImplementedError

    def _deposed(self, epoch: int, reason: str) -> None:
        """A higher epoch holds the role (the node's)."""
        raise NotImplementedError

    async def _publish(self) -> None:
        """Register (again) where this replica listens, how far its log reaches and
        whether it recovers."""
        said = (self._end(), self.disk.state.recovering)
        await asyncio.to_thread(
            self.election.register_replica, self.instance, self.replica, self.address, *said
        )
        self._published = said

    async def _positions(self) -> None:
        """Keep the log position the registry shows (``instances``: how far behind each
        replica is) within a second of the log's."""
        while True:
            await asyncio.sleep(POSITION_EVERY)
            if (self._end(), self.disk.state.recovering) != self._published:
                try:
                    await self._publish()
                except RegistryError as exc:  # shown late, not wrong: said, and tried again
                    log.info("replica %d could not publish its position: %s", self.replica, exc)

    async def _watch(self) -> None:
        watch = self.election.watch_primary(self.instance)
        try:
            async for term in watch:
                self._seen = term
                if term is None:
                    await self._try_lead(None)
                elif isinstance(self.core, Secondary) and term.replica != self.replica:
                    self.core.follow(term.epoch, term.replica, time.monotonic())
                    self._pump()
                elif (
                    isinstance(self.core, Primary)
                    and term.epoch > self.core.epoch
                    and not (term.replica == self.replica and self._renewing)
                ):
                    # Taken over while cut off from the replicas (it could commit nothing
                    # since): it learns it here if the registry still reaches it.
                    self._deposed(
                        term.epoch,
                        f"the registry names replica {term.replica} primary of epoch {term.epoch}",
                    )
        finally:
            await watch.aclose()

    async def _try_lead(self, lost: PrimaryLost | None) -> None:
        """Take the role: from the silent term seen, or when nobody holds it."""
        core = self.core
        now = time.monotonic()
        if (
            self._campaigning
            or self.term is not None
            or self.disk.state.checkpoint is None
            or self.disk.state.recovering
            or self._won.done()
            or now < self._retry_at
            or (isinstance(core, Secondary) and core.leaves_role(now))
        ):
            return
        term, _ = await self._take(None if lost is None else lost.epoch)
        if term is not None and not self._won.done():
            if lost is None:
                why = "nobody held it"
            elif lost.primary is None:
                why = f"nothing came from the primary of epoch {lost.epoch}"
            else:
                why = f"replica {lost.primary} fell silent"
            log.info("replica %d is primary from epoch %d (%s)", self.replica, term.epoch, why)
            self._won.set_result(term)

    async def _take(self, seen: int | None) -> tuple[Term | None, bool]:
        """One try at the role: campaign if nobody holds it; else take it over from the
        current term if its epoch is at most ``seen`` (the term found silent, or handed
        over: a newer one is alive as far as this replica knows, and it may have begun
        while the lookup was on its way). The term won, if any, and whether a newer
        term holds the role."""
        self._campaigning = True
        try:
            end = self._end()
            # The term is of the group the store holds as it begins (the transaction
            # checks that it still does): a replica of neither part takes no term.
            group = await asyncio.to_thread(self.election.group, self.instance)
            if group is None or self.replica not in group.members:
                return None, False
            current = await asyncio.to_thread(self.election.current, self.instance)
            if current is None:
                term = await asyncio.to_thread(
                    self.election.campaign,
                    self.instance,
                    self.replica,
                    end,
                    group_version=group.version,
                )
            elif seen is None or current.epoch > seen:
                return None, True
            else:
                term = await asyncio.to_thread(
                    self.election.take_over,
                    self.instance,
                    self.replica,
                    current,
                    end,
                    group_version=group.version,
                )
            if term is not None:
                self.group = group
            return term, False
        except RegistryError as exc:
            log.warning("replica %d could not take the primary role: %s", self.replica, exc)
            return None, False
        finally:
            self._campaigning = False

    async def _take_handed(self, handed: RoleHandedOver) -> None:
        """The primary of ``handed.epoch`` stepped down for this replica: take the role
        from that term as soon as the registry lets it (the old primary gives it up as
        it steps down), unless a newer term comes first."""
        deadline = time.monotonic() + HANDED_WITHIN
        while not self._won.done() and self.term is None and time.monotonic() < deadline:
            if self._campaigning:
                await asyncio.sleep(HANDED_RETRY)
                continue
            term, newer = await self._take(handed.epoch)
            if newer:
                return  # a newer term: not this replica's to take
            if term is not None and not self._won.done():
                log.info(
                    "replica %d is primary from epoch %d (replica %d handed it over)",
                    self.replica,
                    term.epoch,
                    handed.primary,
                )
                self._won.set_result(term)
                return
            await asyncio.sleep(HANDED_RETRY)

    async def found(self) -> Term:
        """Take the first term of an instance never started (replica 0 only), once enough
        replicas are live to establish it (a term must hear from ``term_quorum``)."""
        said = False
        while True:
            live = await asyncio.to_thread(self.election.replicas, self.instance)
            if len(live) >= self.group.term_quorum:
                break
            if not said:
                log.info(
                    "replica %d waits for %d of the %d replicas to start before founding %r",
                    self.replica,
                    self.group.term_quorum,
                    self.group.n,
                    self.instance,
                )
                said = True
            await asyncio.sleep(0.1)
        term = await asyncio.to_thread(
            self.election.campaign,
            self.instance,
            self.replica,
            0,
            group_version=self.group.version,
        )
        if term is None:
            raise RegistryError(
                f"another replica of {self.instance!r} holds the primary role, or its group "
                "changed before it was founded"
            )
        log.info(
            "replica %d founds %r, primary from epoch %d", self.replica, self.instance, term.epoch
        )
        return term

    async def until_primary(self) -> Term:
        """Follow as a secondary until this replica takes a term; raise what failed."""
        waiting: list[asyncio.Future[Any]] = [self._won, self._failed]
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if self._failed.done():
            self._failed.result()
        return self._won.result()

    async def _address_of(self, replica: int) -> Endpoint | None:
        try:
            found = await asyncio.to_thread(self.election.replicas, self.instance)
        except RegistryError:
            return None
        for r in found:
            if r.replica == replica:
                return r.address
        return None
