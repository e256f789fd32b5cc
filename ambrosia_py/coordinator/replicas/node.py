"""One replica's side of the replicated log: the cores of ``replication/`` carried out
against this replica's files, the transport and the registry's primary role.

A :class:`ReplicaNode` runs a :class:`~..replication.Secondary` until this replica takes
a term, then a :class:`~..replication.Primary`. It does what their events ask, in order
(``replication/events.py``): each durable step (the epoch and history in
``replica-state``, a truncation, an installed checkpoint) is done before the next event;
shipped records are written at once and their durability reported when a sync ends; a
primary's commit point releases what :class:`.gate.CommitGate` holds. A secondary's
committed records go to its binding through :class:`.follow.Follower`, and past the size
trigger the node rolls its log for a checkpoint of the secondary's own; dealings with
the registry are :class:`.leading.Leading`'s.

Who may lead. A replica with no checkpoint has no state its binding could start from:
it never campaigns, and waits to be sent one. Replica 0 founds an instance nobody has
started (its first start, numbered from seq 1 so that the founding checkpoint stands
past every empty log and is shipped to each new replica); every other term is taken
from the registry when the term it saw falls silent (:class:`~..replication.PrimaryLost`)
or when nobody holds the role.

Versions, and an upgrade as the replicas see it, are :class:`.versions.Versions`'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ...wire import Payload
from ..core.config import CoordinatorError
from ..links.config import LinkSettings
from ..registry.interface import Endpoint
from ..registry.primary import PrimaryElection, Term
from ..replication import (
    CheckpointTaken,
    CommitAdvanced,
    Established,
    Event,
    Group,
    History,
    InstallCheckpoint,
    Message,
    Primary,
    PrimaryLost,
    ReadLog,
    Recovered,
    Replayable,
    ReplicationError,
    RoleHandedOver,
    SaveEpoch,
    SaveHistory,
    Secondary,
    Send,
    SendCheckpoint,
    SteppedDown,
    StoreCheckpointChunk,
    TakeCheckpointFor,
    Timing,
    TrimOutboxes,
    TruncateLog,
    VersionFrom,
    WriteRecords,
)
from ..replication.states import TermState
from ..storage.errors import StorageError
from ..storage.files import InstanceFiles
from ..storage.replica_state import ReplicaState
from .disk import ReplicaDisk
from .gate import CommitGate
from .leading import Leading
from .log_work import LogWork
from .membership import Membership
from .transport import ReplicaTransport
from .versions import Versions

if TYPE_CHECKING:
    from .follow import Follower

__all__ = ["ReplicaNode", "SteppedDownError"]

log = logging.getLogger("ambrosia_py.coordinator")

# After a term given up (no quorum in time, outranked), the next try waits this long,
# doubling each time up to RETRY_MAX; a term established starts over.
RETRY_FIRST = 0.3
# Shipped records of at most this many bytes, with no sync under way, are synced on the
# event loop (the latency path); larger ones, or more while one syncs, in a worker thread.
INLINE_SYNC_BYTES = 64 * 1024
RETRY_MAX = 5.0
# A primary tells its secondaries the outboxes' trim points when they moved, at most this
# often, and at least every TRIM_AGAIN seconds (a replica that joined meanwhile learns them).
TRIM_EVERY = 0.1
TRIM_AGAIN = 1.0


class SteppedDownError(CoordinatorError):
    """This replica was primary and is no more: it stops, to rejoin as a secondary when
    started again (a primary never turns back into a secondary in place: its binding has
    acted on records that were never committed)."""


class ReplicaNode(LogWork, Leading, Membership, Versions):
    """See the module. ``state`` is what ``replica-state`` held at start (or a fresh one)."""

    def __init__(
        self,
        *,
        instance: str,
        group: Group,
        files: InstanceFiles,
        state: ReplicaState,
        election: PrimaryElection,
        settings: LinkSettings,
        timing: Timing | None = None,
        upgrade_to: int | None = None,
    ) -> None:
        self.instance = instance
        self.replica = state.replica
        self.version = files.version  # the instance's version the binding runs
        self.upgrade_to = upgrade_to
        self.group = group
        self.disk = ReplicaDisk(files, state)
        self.election = election
        self.timing = timing or Timing()
        self.transport = ReplicaTransport(
            instance,
            self.replica,
            settings,
            self._received,
            self._address_of,
            data_dir=files.data_dir,
        )
        self.core: Primary | Secondary = self._secondary()
        self.term: Term | None = None
        self.gate: CommitGate | None = None
        self.established = asyncio.Event()
        self.term_start = 0
        self._seen: Term | None = None  # the term the registry last named
        self._won: asyncio.Future[Term] = asyncio.get_running_loop().create_future()
        self._failed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._syncing = False
        self._campaigning = False
        self._retry_at = 0.0  # no term taken before this (monotonic) time
        self._backoff = RETRY_FIRST  # how long after a term given up
        self._tasks: list[asyncio.Task[None]] = []
        self._changed: asyncio.Event | None = None  # set when the term moves on
        self.serving = False  # the binding has been given this replica's log
        self._durable_moved = asyncio.Event()  # set when the primary's log grows durable
        self._backlog: deque[Event] = deque()  # events waiting for a sync to end
        # Records the commit path is writing: (seq, log number, offset, size).
        self._unwritten: deque[tuple[int, int, int, int]] = deque()
        self._background: set[asyncio.Future[None]] = set()
        self.address = Endpoint("", 0)  # where it listens, once started
        # A secondary's binding in continuous recovery (``follow.py``), and a primary's
        # outboxes' trim points, once the coordinator gives them.
        self.follower: Follower | None = None
        self.outbox_trims: Callable[[], tuple[tuple[str, int], ...]] | None = None
        # A primary's: given each checkpoint a secondary took for its rolls (seq, bytes).
        self.on_taken: Callable[[int, bytes], None] | None = None
        self._trims_shared: tuple[tuple[str, int], ...] = ()
        self._trims_at = 0.0
        # A secondary rolls its log for a checkpoint of its own past this many bytes.
        self.trigger_bytes: int | None = None
        self._deferred: deque[Callable[[], None]] = deque()  # disk steps after a sync
        self._published = (-1, False)  # the log position, recovering, last registered
        self._version_said: VersionFrom | None = None  # before a follower was attached
        self._settling = False  # a change of the group is being settled (membership.py)
        self._renewing = False  # a term of a changed group is being asked for (membership.py)
        self._early: list[tuple[int, Message]] = []
        self._held: list[bytes] = []

    # --- start and stop -------------------------------------------------------------------

    def _secondary(self) -> Secondary:
        """The secondary this replica is, from its files as they are now."""
        log, state = self.disk.log, self.disk.state
        base, end = (0, 0) if log is None else (log.base, log.end)
        return Secondary(
            replica=self.replica,
            epoch=state.epoch,
            history=History.of(state.history),
            log_base=base,
            log_end=end,
            commit_end=base,
            now=time.monotonic(),
            timing=self.timing,
            group=self.group,
            version=self.version,
            upgrade_to=self.upgrade_to,
            recovering=state.recovering,
            incarnation=secrets.randbits(62) | 1,  # this start's: never 0
        )

    async def start(self, host: str, port: int, advertised: str) -> None:
        """Listen for the other replicas, register in the registry, and follow its terms."""
        bound = await self.transport.listen(host, port)
        self.address = Endpoint(advertised, bound)
        await self._publish()
        log.info("replica %d listens for its group on %s:%d", self.replica, host, bound)
        self._tasks = [
            asyncio.create_task(self._watch()),
            asyncio.create_task(self._ticks()),
            asyncio.create_task(self._positions()),
            asyncio.create_task(self._watch_group()),
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.transport.close()
        self.disk.close()

    # --- becoming primary -----------------------------------------------------------------

    def lead(self, term: Term, *, founding: bool = False) -> None:
        """Start the term: a :class:`Primary` over this replica's log, from its committed
        checkpoint on (``founding``: the instance's first term, :meth:`founded`)."""
        core = self.core
        if not isinstance(core, Secondary):
            raise SteppedDownError("a new term for a replica already primary")
        # Upgrading, it ships the new version from its term's start (it upgrades before
        # it writes a record); else its version, all of its log.
        upgrade = self.upgrade_to if self.upgrade_pending else None
        self.core = Primary.taking_over(
            core,
            group=self.group,
            epoch=term.epoch,
            now=time.monotonic(),
            timing=self.timing,
            version=self.version if upgrade is None else upgrade,
            since=None if upgrade is None else core.log_end,
            founding=founding,
        )
        self.term = term
        self.gate = CommitGate(self._durable_here)
        # What the secondary knew committed stays so (the term's commit point starts
        # there and only moves on once a record of the term commits).
        self.gate.commit(self.core.commit_end)
        self._pump()

    def founded(self, term: Term, checkpoint: int) -> None:
        """Replica 0 founded the instance: its first start wrote checkpoint
        ``checkpoint`` and the records after it; lead from there."""
        self.disk.save(checkpoint=checkpoint, recovering=False)
        self.disk.open_log(checkpoint)
        self.core = self._secondary()
        self.lead(term, founding=True)

    async def until_committed(self) -> bool:
        """Wait until the term is established and everything before its start committed:
        the log is the one to continue, and may be given to the binding (True). False:
        the term was given up before that (outranked, or no quorum in time); this replica
        follows again (:meth:`until_primary`)."""
        while True:
            gate = self.gate
            if self.term is None or gate is None:
                return False
            if self.established.is_set() and gate.commit_end >= self.term_start:
                self.serving = True
                self._backoff = RETRY_FIRST
                return True
            changed = self._changed = asyncio.Event()
            await self._wait(changed.wait())

    async def _wait(self, aw: Coroutine[object, object, object]) -> None:
        """Await ``aw``, unless the replicated log fails first (then raise that)."""
        task: asyncio.Future[Any] = asyncio.ensure_future(aw)
        await asyncio.wait([task, self._failed], return_when=asyncio.FIRST_COMPLETED)
        if self._failed.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            self._failed.result()
        task.result()

    # --- the committer's hooks (coordinator/core/committer.py Replicating) ---------------

    def appended(self, seq: int, disk_parts: list[Payload], log_number: int, offset: int) -> None:
        core = self.core
        if not isinstance(core, Primary):
            raise SteppedDownError("records appended by a replica that is not primary")
        record = b"".join(disk_parts)
        # Made known to the log once durable (durable()): only then is it surely in the
        # file, whole, for a read that feeds a replica behind.
        self._unwritten.append((seq, log_number, offset, len(record)))
        if core.state is TermState.GATHERING:
            self._held.append(record)  # a term begun in place: on once it is established
            return
        core.append([record], time.monotonic())
        self._pump()

    def durable(self, seq: int, action: Callable[[], None] | None) -> None:
        assert self.gate is not None and self.disk.log is not None
        while self._unwritten and self._unwritten[0][0] <= seq:
            self.disk.log.note(*self._unwritten.popleft())
        self.gate.durable(seq, action)

    def forward(self, action: Callable[[], None]) -> None:
        assert self.gate is not None
        self.gate.forward(action)

    def control(self, action: Callable[[], None]) -> None:
        assert self.gate is not None
        self.gate.control(action)

    def rolled(self, seq: int) -> bool:
        """The primary's log rolled to a new file at ``seq``: whether a secondary was
        asked for the state there (it comes back through :attr:`on_taken`)."""
        core = self.core
        if not isinstance(core, Primary) or self.on_taken is None:
            return False
        asked = core.rolled(seq, time.monotonic())
        self._pump()
        if asked is not None:
            log.info("asked replica %d for the checkpoint at seq %d", asked, seq)
        return asked is not None

    def _send_taken(self, seq: int, data: bytes) -> None:
        """The follower took the checkpoint a ROLL asked for: back to the primary."""
        core = self.core
        if isinstance(core, Secondary):
            core.checkpoint_taken(seq, data)
            self._pump()

    def checkpoint_written(self, n: int) -> None:
        """The committer wrote checkpoint ``n``: recovery starts there from now on."""
        self.disk.save(checkpoint=n)

    def _durable_here(self, end: int) -> None:
        core = self.core
        if isinstance(core, Primary):
            if self.disk.log is not None:
                self.disk.log.synced(end)
            self._durable_moved.set()
            core.records_durable(end)
            self._pump()

    # --- messages and time ----------------------------------------------------------------

    def _received(self, sender: int, msg: Message) -> None:
        if not self._of_group(sender):
            log.warning("a message from replica %d, not of the group: dropped", sender)
            return
        if self._before_renewed(sender, msg):
            return
        try:
            self.core.receive(sender, msg, time.monotonic())
        except Exception as exc:
            self._fail(exc)
            return
        self._pump()

    async def _ticks(self) -> None:
        every = self.timing.heartbeat_every / 2
        while True:
            await asyncio.sleep(every)
            now = time.monotonic()
            try:
                self.core.tick(now)
                self._share_trims(now)
            except Exception as exc:
                self._fail(exc)
                return
            self._pump()

    def _share_trims(self, now: float) -> None:
        core, trims = self.core, self.outbox_trims
        if not isinstance(core, Primary) or trims is None or now - self._trims_at < TRIM_EVERY:
            return
        points = trims()
        if points and (points != self._trims_shared or now - self._trims_at >= TRIM_AGAIN):
            core.share_trims(points, now)
            self._trims_shared, self._trims_at = points, now

    def _fail(self, exc: BaseException) -> None:
        if self._failed.done():
            return
        if isinstance(exc, ReplicationError | StorageError):
            # Said in one line: a peer broke the protocol, or the disk failed.
            line = CoordinatorError(f"replica {self.replica}: {exc}")
            line.__cause__ = exc
            exc = line
        self._failed.set_exception(exc)

    async def guard(self, work: Coroutine[object, object, None]) -> None:
        """Run ``work`` (normal processing) until it ends, or until the replicated log
        fails or this replica steps down: then it is cancelled and that is raised."""
        await self._wait(work)

    # --- carrying out the events ----------------------------------------------------------

    def _pump(self) -> None:
        """Carry out what the core asks, in order (each durable step before the next).

        A truncation or an install must not run while a sync of the log is in flight
        (they close the files it syncs): such an event, and every one after it, waits in
        a backlog that the sync's end drains.
        """
        core = self.core
        try:
            event = core.next_event()
            while event is not None:
                if self._backlog or (
                    self._syncing and isinstance(event, TruncateLog | InstallCheckpoint)
                ):
                    self._backlog.append(event)
                else:
                    self._do(event)
                if self.core is not core:  # stepped down or took over: the rest is stale
                    return
                event = core.next_event()
        except Exception as exc:
            self._fail(exc)
        # What the events sent leaves now, not in the loop's next turn: a record shipped
        # before the commit path syncs it on the event loop, an acknowledgement at once.
        self.transport.flush()

    def _do(self, event: Event) -> None:
        match event:
            case Send(to, message):
                self.transport.send(to, message)
            case SaveEpoch(epoch):
                self.disk.save(epoch=epoch)
            case SaveHistory(history):
                self.disk.save(history=tuple((e.epoch, e.start) for e in history.entries))
            case TruncateLog(end):
                assert self.disk.log is not None
                self.disk.log.truncate(end)
            case WriteRecords(first_seq, records):
                if self.disk.log is None:
                    raise StorageError("records shipped to a replica with no checkpoint")
                self.disk.log.append(first_seq, records)
                if not self._syncing and sum(map(len, records)) <= INLINE_SYNC_BYTES:
                    # Alone and small: synced here, on the event loop, as the primary's
                    # commit path does a lone record (a worker thread's hop costs more).
                    assert isinstance(self.core, Secondary)
                    self.core.records_durable(self.disk.log.sync())
                else:
                    self._sync_soon()
                self._roll_if_due()
            case Replayable(end):
                if self.follower is not None:
                    self.follower.replayable(end)
            case TrimOutboxes(points):
                if self.follower is not None:
                    self.follower.trim(points)
            case PrimaryLost():
                self._later(self._try_lead(event))
            case StoreCheckpointChunk(_, _, offset, data, starts_over):
                self.disk.store_chunk(offset, data, starts_over)
            case TakeCheckpointFor(seq):
                if self.follower is not None:
                    self.follower.take_for(seq, functools.partial(self._send_taken, seq))
            case CheckpointTaken(seq):
                data = self.disk.take_staged()
                if self.on_taken is not None:
                    self.on_taken(seq, data)
            case InstallCheckpoint(seq):
                if self.disk.files.version != self.version:
                    raise CoordinatorError(
                        f"replica {self.replica} is sent a checkpoint while it upgrades to "
                        f"version {self.version}: it stops, and rejoins from a checkpoint "
                        "of that version when started again with its code"
                    )
                n = self.disk.install(seq)
                log.info("installed a shipped checkpoint as checkpoint %d (seq %d)", n, seq)
                if self.follower is not None:
                    self.follower.start()  # the binding (re)loads from it
            case Established(epoch, term_start):
                self.term_start = term_start
                self.established.set()
                self._release_held()
                self._change()
                log.info("epoch %d established at seq %d", epoch, term_start)
            case CommitAdvanced(end):
                assert self.gate is not None
                self.gate.commit(end)
                self._change()
                self._settle_if_due(end)
            case ReadLog(replica, from_seq):
                self._later(self._read(replica, from_seq))
            case SendCheckpoint(replica):
                assert isinstance(self.core, Primary)
                seq, data = self.disk.latest_checkpoint()
                self.core.checkpoint_read(replica, seq, data, time.monotonic())
            case SteppedDown(epoch, reason, _, handed):
                self._deposed(epoch, reason, handed=handed)
            case RoleHandedOver():
                self._later(self._take_handed(event))
            case VersionFrom():
                self._version_from(event)
            case Recovered(epoch, end):
                self.disk.save(recovering=False)
                log.info(
                    "replica %d caught up (its log is durable to seq %d, where the primary "
                    "of epoch %d synced it): it counts toward new terms again",
                    self.replica,
                    end,
                    epoch,
                )

    def _deposed(self, epoch: int, reason: str, *, handed: bool = False) -> None:
        """This replica's term is over: it stops once its binding was given the log (see
        :class:`SteppedDownError`), else it follows again. Handed over, it gives the role
        up in the registry at once, for the replica it handed it to."""
        if handed and self.term is not None:
            self._later(asyncio.to_thread(self.election.resign, self.term))
        if self.serving:
            self._fail(
                SteppedDownError(
                    f"replica {self.replica} is primary no more (epoch {epoch}): "
                    f"{reason}; it stops, and rejoins as a secondary when started again"
                )
            )
        elif self.term is not None:
            self._follow_again(epoch, reason)

    def _change(self) -> None:
        if self._changed is not None:
            self._changed.set()

    def _follow_again(self, epoch: int, reason: str) -> None:
        """Give the term up before the binding saw anything of it: a secondary again."""
        core, term = self.core, self.term
        assert isinstance(core, Primary) and term is not None
        log.info("replica %d gives epoch %d up: %s", self.replica, core.epoch, reason)
        if epoch > self.disk.state.epoch:
            # A higher epoch is adopted durably before anything else, as a secondary
            # adopting one does (a history naming it is saved only under it).
            self.disk.save(epoch=epoch)
        self.core = Secondary.following(
            core,
            epoch=epoch,
            now=time.monotonic(),
            timing=self.timing,
            group=self.group,
            version=self.version,
            upgrade_to=self.upgrade_to,
        )
        self.term = self.gate = None
        self.established.clear()
        self._won = asyncio.get_running_loop().create_future()
        self._later(asyncio.to_thread(self.election.resign, term))
        # Not at once again: with too few replicas up, each try is a store write and a
        # term that cannot be established.
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(2 * self._backoff, RETRY_MAX)
        self._change()

    def _later(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
