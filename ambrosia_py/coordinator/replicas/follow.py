"""A secondary's binding in continuous recovery: loaded from the replica's checkpoint,
then sent each record of the replicated log once it is committed, so that the service's
state is held in memory a few milliseconds behind the primary's, and taking over
replays nothing.

What the binding sends back while it replays is read as on a primary, by the
coordinator's reader, into the intake (:meth:`Intake.follow
<..core.intake.Intake.follow>`): its calls to itself wait there until the log shows them
logged by the primary (:meth:`Intake.replayed <..core.intake.Intake.replayed>`), and
its output for other instances waits in the outboxes until the primary says the
destination has it (:meth:`Follower.trim`, from the primary's TRIM messages). On taking
over, what is left is exactly what a recovery from the same files would have left: the
calls to log, and the output to resend from each destination's position.

Only committed records are replayed (the replication core's
:class:`~..replication.Replayable`): a secondary's log may hold a tail a new primary
truncates, which the binding must never have seen. A checkpoint installed while
following (the primary's log no longer held this log's end) reloads the binding from it,
once the binding has answered a TakeCheckpoint sent behind the last record it was given:
its answer marks where in its stream the output of the old replay ends.

A secondary takes its own checkpoints, so that its log does not grow without end and a
restart replays little. When its log file passes the size trigger, the node rolls to a
new file ``n`` at the log's end ``s`` (:meth:`Follower.checkpoint_at`); the replay sends
the binding TakeCheckpoint right after record ``s - 1`` and goes on; the answer is the
state before ``s`` and is written as checkpoint ``n``. It is committed (recovery starts
there, older files go) only once the replayed log holds every output the binding had
sent by then: a checkpoint's binding does not regenerate them, so until the log holds
them they would be lost to a recovery from it. A log truncated below ``s`` first drops
the plan.

An upgrade comes as a seq from which the log is of another version of the instance
(:meth:`Follower.version_at`): the replay stops before it. A replica started to upgrade
to that version sends its binding UpgradeService there (the binding switches to the new
code, converting its state), takes a checkpoint at once and replays on with the new code;
the checkpoint, committed under the rule above, starts the new version's files. Any
other replica stops once a record from there on is committed: its code cannot replay it.

The primary takes no checkpoints of its own after its first: at its rolls it asks one
secondary for the state at its roll point (:meth:`Follower.take_for`). That checkpoint
is taken the same way, at the same moment in the replay and committed under the same
rule, but is not kept here: it is handed over, to be sent back.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import attrs

from ... import crashpoints
from ...wire import CHECKPOINT_SEQ, Checkpoint, TakeCheckpoint, UpgradeService
from ...wire.records import coalesce_parts, encode_record_parts
from ..core.binding_link import BindingLink
from ..core.checkpoint import IcState
from ..core.config import CoordinatorError
from ..core.events import CheckpointArrived
from ..core.intake import Intake
from ..storage.errors import StorageError
from ..storage.files import InstanceFiles
from ..storage.replay import replay_forms
from .disk import ReplicaDisk, first_of_version, read_checkpoint

__all__ = ["PACE_S", "READ_BYTES", "Follower"]

log = logging.getLogger("ambrosia_py.coordinator")

READ_BYTES = 1 << 20  # the records one read of the log takes to the binding, at most
# Once caught up, the replay waits this long after the next commit before it sends on:
# records then go to the binding a few ms' worth at a time, in fewer and larger sends
# (measured on one machine holding three replicas: 1.11-1.13x the calls/s, p50 no
# worse). Taking over does not wait (finish).
PACE_S = 0.01


@attrs.define
class _Upgrade:
    """Records from ``seq`` on are of version ``version``: the binding upgrades there
    (``files``: the version's, where its first checkpoint goes; ``started(version)`` is
    called once the binding was told, ``done(files, seq)`` once the checkpoint is
    committed), or, with ``files`` None, the replay stops there with ``why``."""

    version: int
    seq: int
    files: InstanceFiles | None
    why: str = ""
    started: Callable[[int], None] | None = None
    done: Callable[[InstanceFiles, int], None] | None = None
    sent: bool = False  # UpgradeService went to the binding


@attrs.define
class _Planned:
    """A checkpoint: of the secondary's own, number ``n``, or (``n`` None) for the
    primary, handed to ``ship``; the state before ``seq``."""

    n: int | None
    seq: int
    ship: Callable[[bytes], None] | None = None
    upgrade: _Upgrade | None = None  # an upgrade's first checkpoint, in its files
    logged_outputs: int = 0  # the intake's, and the inbox, as the replay reached seq
    inbox: dict[str, int] = attrs.field(factory=dict)
    asked: bool = False  # TakeCheckpoint went to the binding
    answer: CheckpointArrived | None = None
    written: IcState | None = None


class Follower:
    """See the module. Nothing is sent the binding before :meth:`start`.
    ``commit(n, seq)`` commits checkpoint ``n``, written, the state before ``seq``."""

    def __init__(
        self,
        binding: BindingLink,
        intake: Intake,
        disk: ReplicaDisk,
        commit: Callable[[int, int], None],
    ) -> None:
        self._binding = binding
        self._intake = intake
        self._disk = disk
        self._commit = commit
        self.state: IcState | None = None  # the checkpoint the binding was loaded from
        self.next_seq = 0  # the next record to send the binding
        self.inbox: dict[str, int] = {}  # per link sender, the seq after its last replayed
        self._target = 0  # records below it may be replayed
        self._trims: dict[str, int] = {}
        self._reload = False  # (re)load the binding next
        self._loading = False  # a load is under way
        self._hurry = False  # taking over: no more pacing
        self._plan: _Planned | None = None
        self._stale = 0  # answers to TakeCheckpoints of plans given up, still to come
        self._wake = asyncio.Event()
        self._moved = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Done once the replay, started, has ended: with what stopped it, if anything.
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fence: asyncio.Future[CheckpointArrived] | None = None
        self._upgrade: _Upgrade | None = None

    @property
    def task(self) -> asyncio.Task[None] | None:
        """The replay, once started: it ends only by failing (or being stopped)."""
        return self._task

    @property
    def planning(self) -> bool:
        """Whether a checkpoint of its own (or an upgrade) is under way."""
        return self._plan is not None or self._upgrade is not None

    def version_at(
        self,
        version: int,
        seq: int,
        upgrade: tuple[InstanceFiles, Callable[[int], None], Callable[[InstanceFiles, int], None]]
        | None,
        why: str = "",
    ) -> None:
        """Records from ``seq`` on are of ``version``: with ``upgrade`` (the version's
        files, and the calls for when the binding was told and when the checkpoint is
        committed) the binding upgrades there; without, the replay stops there, raising
        ``why`` once a record from ``seq`` on is committed."""
        if self._upgrade is not None and self._upgrade.sent:
            return  # upgraded already (a later term says it again)
        if upgrade is None:
            self._upgrade = _Upgrade(version, seq, None, why)
        else:
            files, started, done = upgrade
            self._upgrade = _Upgrade(version, seq, files, why, started, done)
        self._wake.set()

    def start(self) -> None:
        """Load the binding from the replica's committed checkpoint (again, after an
        install) and follow the log."""
        self._reload = True
        plan = self._plan
        if plan is not None and plan.asked and plan.answer is None:
            self._stale += 1  # its answer comes before any other, and is nobody's now
        self._plan = None  # of the log it reloads from no longer
        if self._task is None:
            self._task = asyncio.create_task(self._run())
            self._task.add_done_callback(self._end)
        self._wake.set()

    def _end(self, task: asyncio.Task[None]) -> None:
        if self.ended.done():
            return
        if task.cancelled():
            self.ended.set_result(None)
        elif (error := task.exception()) is not None:
            self.ended.set_exception(error)
        else:
            self.ended.set_result(None)

    def replayable(self, end: int) -> None:
        """The records below ``end`` are committed and in the log."""
        if end > self._target:
            self._target = end
            self._wake.set()

    def trim(self, points: tuple[tuple[str, int], ...]) -> None:
        """The primary's outbox trim points (per destination, the seq below which it has
        what this instance sent it)."""
        for dest, seq in points:
            if seq > self._trims.get(dest, 0):
                self._trims[dest] = seq
        self._intake.trim_outboxes(points)

    def checkpoint_at(self, n: int, seq: int) -> None:
        """The log rolled to file ``n`` at ``seq``: take checkpoint ``n`` there."""
        if self._plan is None and self.state is not None and seq >= self.next_seq:
            self._plan = _Planned(n, seq)
            self._wake.set()

    def take_for(self, seq: int, ship: Callable[[bytes], None]) -> None:
        """The primary rolled its log at ``seq``: take the state there for it, and hand
        its bytes to ``ship`` once it is safe to recover from. Nothing if another
        checkpoint is under way or the replay is past ``seq`` (the primary asks again)."""
        if self._plan is None and self.state is not None and seq >= self.next_seq:
            self._plan = _Planned(None, seq, ship)
            self._wake.set()
        else:
            log.info("no checkpoint at seq %d for the primary: the replay is elsewhere", seq)

    def checkpoint_arrived(self, event: CheckpointArrived) -> bool:
        """The binding's answer to a TakeCheckpoint of the replay's; False: none was
        asked for."""
        if self._stale:
            self._stale -= 1
            self._moved.set()
            return True
        fence = self._fence
        if fence is not None and not fence.done():
            fence.set_result(event)
            return True
        plan = self._plan
        if plan is None or not plan.asked or plan.answer is not None:
            return False
        plan.answer = event
        self._wake.set()
        return True

    async def finish(self, end: int) -> None:
        """Replay every record below ``end`` (committed: this replica's term starts
        there), then stop following. A checkpoint of its own under way is given up, once
        the binding's answer to it is in (it must not be taken for the next one)."""
        task = self._task
        if task is None:
            raise StorageError("the binding was never loaded from a checkpoint")
        self._hurry = True
        self._wake.set()
        self.replayable(end)
        while (
            self.next_seq < end
            or self._reload
            or self._loading
            or self._stale
            or self._unanswered()
        ):
            self._moved.clear()
            moved = asyncio.ensure_future(self._moved.wait())
            try:
                await asyncio.wait([moved, task], return_when=asyncio.FIRST_COMPLETED)
            finally:
                moved.cancel()
            if task.done():
                task.result()  # raises what stopped it
                raise StorageError("the replay stopped before the term's start")
        await self.stop()
        self._plan = None
        if self.next_seq != end:
            raise StorageError(f"the replay reached seq {self.next_seq}, not the term's {end}")

    def _unanswered(self) -> bool:
        plan = self._plan
        return plan is not None and plan.asked and plan.answer is None

    async def stop(self) -> None:
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    # --- the replay -----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            plan = self._plan
            upgrade = self._upgrade
            if upgrade is not None and not upgrade.sent and self.next_seq == upgrade.seq:
                if upgrade.files is None:
                    if self._target > upgrade.seq:  # a record of the new version is committed
                        raise CoordinatorError(upgrade.why)
                elif plan is None or not plan.asked or plan.answer is not None:
                    # A checkpoint of the old version not yet committed would wait for
                    # records the old code must not replay: given up (an answer still to
                    # come is waited for first, as it comes before any other).
                    if plan is not None:
                        log.info("checkpoint at seq %d given up: the binding upgrades", plan.seq)
                    self._plan = plan = _Planned(1, upgrade.seq, upgrade=upgrade)
            if self._reload:
                self._reload = False
                self._loading = True
                try:
                    await self._load()
                finally:
                    self._loading = False
            elif plan is not None and plan.answer is not None and plan.written is None:
                await self._write(plan)
            elif plan is not None and not plan.asked and self.next_seq == plan.seq:
                await self._ask(plan)
            else:
                end = self._target
                if plan is not None and not plan.asked:
                    end = min(end, plan.seq)  # TakeCheckpoint goes right after seq - 1
                if upgrade is not None and not upgrade.sent:
                    end = min(end, upgrade.seq)  # nothing of the new version with old code
                if self.next_seq >= end:
                    self._wake.clear()
                    await self._wake.wait()
                    if not self._hurry:
                        await asyncio.sleep(PACE_S)
                    continue
                await self._replay_some(end)
            self._try_commit()
            self._moved.set()

    async def _load(self) -> None:
        disk = self._disk
        n = disk.state.checkpoint
        if n is None:
            raise StorageError("a replica with no checkpoint cannot load its binding")
        state, _ = read_checkpoint(disk.files, n)
        if self.state is not None:
            # A reload: what the binding sends in answer to the records before it must
            # not be taken for what it sends after. Its answer to a TakeCheckpoint comes
            # after all of that, in order: the intake starts over once it is read.
            fence = self._fence = asyncio.get_running_loop().create_future()
            await self._binding.control(self.state.committer_id, TakeCheckpoint())
            await fence
        await self._binding.send(
            encode_record_parts(state.committer_id, CHECKPOINT_SEQ, [Checkpoint(state.blob)])
        )
        self._intake.follow(state)
        self._intake.trim_outboxes(tuple(self._trims.items()))
        self.state = state
        self.next_seq = state.next_seq
        self.inbox = dict(state.inbox)
        log.info("the binding follows the log from checkpoint %d (seq %d)", n, state.next_seq)

    async def _replay_some(self, end: int) -> None:
        """Send the binding the next committed records below ``end``, one read of the log."""
        rlog = self._disk.log
        if rlog is None:
            raise StorageError("records to replay, but the replica has no log")
        # On the event loop: they were just written (the page cache holds them) and the
        # log's files change only on the loop (appends, truncations, installs). Verified
        # as they are read (check bytes, committer id, seqs): not parsed a second time.
        raws = rlog.read_records(self.next_seq, READ_BYTES)[: end - self.next_seq]
        if not raws:
            raise StorageError(
                f"the log no longer holds record {self.next_seq} (it holds "
                f"{rlog.base}..{rlog.end - 1}), which the binding needs next"
            )
        forms, outputs = replay_forms(raws, self.inbox)
        await self._binding.send(coalesce_parts(forms))
        self.next_seq += len(raws)
        self._intake.replayed(self.next_seq, outputs)
        self._intake.trim_outboxes(tuple(self._trims.items()))

    # --- checkpoints of its own -------------------------------------------------------------

    async def _ask(self, plan: _Planned) -> None:
        """The binding has every record before the plan's seq: ask for its state there."""
        rlog = self._disk.log
        state = self.state
        assert state is not None
        upgrade = plan.upgrade
        if upgrade is not None:
            await self._binding.control(state.committer_id, UpgradeService())
            upgrade.sent = True
            assert upgrade.started is not None
            upgrade.started(upgrade.version)
            log.info("the binding upgrades to version %d at seq %d", upgrade.version, plan.seq)
        elif plan.n is not None and (rlog is None or rlog.log_start(plan.n) != plan.seq):
            log.info("checkpoint %d given up: the log was cut below seq %d", plan.n, plan.seq)
            self._plan = None
            return
        plan.logged_outputs = self._intake.logged_outputs
        plan.inbox = dict(self.inbox)
        plan.asked = True
        await self._binding.control(state.committer_id, TakeCheckpoint())

    async def _write(self, plan: _Planned) -> None:
        state, answer = self.state, plan.answer
        assert state is not None and answer is not None
        written = IcState(
            state.committer_id,
            plan.seq,
            plan.logged_outputs,
            answer.binding_outputs,
            answer.blob,
            plan.inbox,
            answer.outboxes,
            dict(state.senders),
            answer.attached,
        )
        if plan.upgrade is not None:
            assert plan.upgrade.files is not None
            await asyncio.to_thread(first_of_version, plan.upgrade.files, written)
        elif plan.n is not None:  # one for the primary is sent once safe (_try_commit)
            files = self._disk.files
            await asyncio.to_thread(files.write_checkpoint, plan.n, written.encode_parts())
        plan.written = written

    def _try_commit(self) -> None:
        """Commit the plan's checkpoint once the replayed log holds every output its
        binding had sent (see the module)."""
        plan = self._plan
        if plan is None or plan.written is None:
            return
        if self._intake.logged_outputs < plan.written.binding_outputs:
            return
        self._plan = None
        upgrade = plan.upgrade
        if upgrade is not None:
            assert upgrade.files is not None and upgrade.done is not None
            self._upgrade = None
            upgrade.done(upgrade.files, plan.seq)
            log.info("version %d's first checkpoint taken (next seq %d)", upgrade.version, plan.seq)
            return
        if plan.n is None:
            assert plan.ship is not None
            crashpoints.reach("ic.replica.checkpoint.before_ship")
            log.info(
                "checkpoint for the primary taken (%d bytes, next seq %d): sending it",
                len(plan.written.blob),
                plan.seq,
            )
            plan.ship(b"".join(plan.written.encode_parts()))
            return
        crashpoints.reach("ic.replica.checkpoint.before_commit")
        self._commit(plan.n, plan.seq)
        log.info(
            "checkpoint %d taken as a secondary (%d bytes, next seq %d)",
            plan.n,
            len(plan.written.blob),
            plan.seq,
        )
