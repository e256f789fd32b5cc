"""Versions of an instance as its replicas see them, and an upgrade with replicas.

A replica's binding runs the instance's version of its files (``version``); one started
to upgrade (``upgrade_to``: ``run --upgrade-from OLD --upgrade-version N``) runs the old
code, replaying the log as any secondary does, until the log turns to the new version.
A term's SYNC says which version it ships from which seq; when that is not this
replica's, its core says so (:class:`~..replication.VersionFrom`) and
:meth:`Versions._version_from` decides: a replica started to upgrade to that version
has its binding upgrade in place there (:meth:`.follow.Follower.version_at`: the old
code replays nothing of the new version) and moves to the new version's files once the
upgraded state is its checkpoint 1 (:meth:`.disk.ReplicaDisk.switch_to`); any other
replica stops there, saying how to start it again. A replica started to upgrade that
takes a term upgrades as it does, before it writes a record (the coordinator's
``_become_primary``), so its term ships the new version from its start and its files
move with :meth:`Versions.moved_to`.

:class:`Versions` is a part of :class:`~.node.ReplicaNode`, apart by concern.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from ..core.config import CoordinatorError
from ..replication import Primary, Secondary, VersionFrom
from ..storage.files import InstanceFiles
from .disk import ReplicaDisk

if TYPE_CHECKING:
    import asyncio

    from .follow import Follower

__all__ = ["Versions"]

log = logging.getLogger("ambrosia_py.coordinator")


class Versions:
    """The version side of a replica (see the module); its state is the node's."""

    instance: str
    replica: int
    version: int
    upgrade_to: int | None
    disk: ReplicaDisk
    core: Primary | Secondary
    follower: Follower | None
    _version_said: VersionFrom | None
    _durable_moved: asyncio.Event

    def _pump(self) -> None:
        """Carry out what the core asks (the node's)."""
        raise NotImplementedError

    def _fail(self, exc: BaseException) -> None:
        """The replicated log failed (the node's)."""
        raise NotImplementedError

    def _when_not_syncing(self, step: Callable[[], None]) -> None:
        """Run ``step`` once no sync of the log is in flight (the node's)."""
        raise NotImplementedError

    @property
    def upgrade_pending(self) -> bool:
        """Whether this replica was started to upgrade and its binding has not yet."""
        return self.upgrade_to is not None and self.version < self.upgrade_to

    def attach(self, follower: Follower) -> None:
        """The binding follows the log through ``follower`` from now on."""
        self.follower = follower
        said, self._version_said = self._version_said, None
        if said is not None:
            self._version_from(said)

    def moved_to(self, files: InstanceFiles, committer_id: int, seq: int) -> None:
        """Upgrading as it takes the role: the log goes on in ``files`` (created and
        locked by the committer), from ``seq``, its checkpoint 1 the binding's upgraded
        state. The records before ``seq`` are no longer shipped: a replica that lacks
        them is sent that checkpoint."""
        assert self.upgrade_to is not None
        self.disk.moved_to(files, committer_id, seq)
        self.version = self.upgrade_to
        self.core.log_pruned(seq)
        self._durable_moved.set()  # reads waiting on the old log look again

    def _version_from(self, event: VersionFrom) -> None:
        """The term ships ``event.version`` from ``event.since`` on: upgrade there, or
        stop (see the module)."""
        follower = self.follower
        if follower is None:
            self._version_said = event  # told once the follower is attached
            return
        if event.version == self.upgrade_to and not event.offered:
            files = InstanceFiles(self.disk.files.data_dir, self.instance, event.version)
            follower.version_at(
                event.version, event.since, (files, self._upgrade_started, self._upgraded)
            )
            return
        if event.version == self.upgrade_to:
            why = (
                f"replica {self.replica} was started to upgrade to version {event.version}, "
                f"but the primary of epoch {event.epoch} no longer holds the records of "
                f"version {self.version} this replica lacks"
            )
        else:
            why = (
                f"replica {self.replica} runs version {self.version} of {self.instance!r}; "
                f"the primary of epoch {event.epoch} ships version {event.version} from "
                f"seq {event.since}, which this replica's code cannot replay"
            )
        why += (
            f": it stops. Start it with version {event.version}'s code (no "
            "--upgrade-version): it rejoins from a checkpoint of that version"
        )
        if event.offered:
            self._fail(CoordinatorError(why))
        else:
            follower.version_at(event.version, event.since, None, why)

    def _upgrade_started(self, version: int) -> None:
        """The binding was told to upgrade: it runs ``version`` from now on."""
        self.version = version
        if isinstance(self.core, Secondary):
            self.core.upgraded(version)

    def _upgraded(self, files: InstanceFiles, seq: int) -> None:
        """The upgraded binding's checkpoint 1 of ``files`` (the state before ``seq``) is
        committed: the log goes on there."""

        def switch() -> None:
            new = self.disk.switch_to(files, seq)
            core = self.core
            if isinstance(core, Secondary):
                core.records_durable(new.durable_end)
                core.log_pruned(seq)
            log.info(
                "replica %d upgraded to version %d at seq %d: its log goes on in %s",
                self.replica,
                self.version,
                seq,
                files.path,
            )
            self._pump()

        self._when_not_syncing(switch)
