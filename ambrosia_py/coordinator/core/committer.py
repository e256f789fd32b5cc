"""The coordinator's log in steady state: records in, durable, forwarded; rolls and checkpoints.

:class:`Committer` is the asyncio side of group commit. It asks the intake for the next
record (:meth:`Intake.next_record <.intake.Intake.next_record>`) only when the log can
take it, so a record holds everything that arrived while the one before it was written,
and hands it to the :class:`~.commit.CommitPipeline` by one method,
:meth:`Committer._commit_next`: for the rounds of the commit loop, for a request that a
link read brought alone (:meth:`Committer.input_read`), and for what must be durable
before a checkpoint is committed. The pipeline writes and syncs it; once it is durable,
the record is forwarded to the binding (:mod:`.forwarding`) and its link senders are told.

Checkpoints (reference ambrosia.md, *Checkpoints*): when the binding sends TakeCheckpoint
or the log passes its size trigger, the committer moves to log N+1 and sends
TakeCheckpoint (a seq -1 record) between the last record of log N and the first of log
N+1, so the binding's answer is the state at the start of log N+1: it becomes
``serverchkpt<N+1>``, written atomically only once everything the binding sent before
it is durable, and only then committed in the registry, in the background
(:mod:`.recording`: a registry that cannot be reached does not stop the coordinator).
Until then recovery uses checkpoint N and replays both logs.

A replicated primary does not ask its binding at the size trigger (its binding never
pauses after its first checkpoint): it rolls, and one of its secondaries, whose binding
replays the same log, takes the state at the roll and sends it back
(``coordinator/replicas``); it becomes ``serverchkpt<N+1>`` the same way. Only when no
secondary keeps up to be asked does the binding take it, as standalone.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Protocol

import attrs

from ... import crashpoints, wire
from ...wire import TakeCheckpoint
from ..links.peers import PeerLinks
from ..registry.interface import InstanceRegistry
from ..storage.files import InstanceFiles, LogWriter
from .binding_link import BindingLink
from .checkpoint import IcState, StateFormatError
from .commit import CommitPipeline
from .config import CoordinatorConfig
from .events import CheckpointArrived, RecordReady
from .forwarding import Forwarded, Forwarder, LogPlace
from .intake import Intake
from .recording import CheckpointRecorder

__all__ = ["Committer", "Replicating"]

log = logging.getLogger("ambrosia_py.coordinator")

# Link input of at most this many bytes, alone, is logged from the read that brought it
# (Committer.input_read): its record stays within the commit pipeline's latency path.
_ALONE_MAX_BYTES = 64 * 1024


@attrs.frozen
class _LogStart:
    """What the checkpoint that pairs with a log must record about its start."""

    next_seq: int
    logged_outputs: int
    inbox: dict[str, int]


class Replicating(Protocol):
    """What a replicated primary's log adds (``coordinator/replicas``): each record is
    shipped as it is written, and what its durability releases (forwarding to the
    binding, confirmations to link senders, a control message behind them) waits until
    enough replicas hold it."""

    def appended(
        self, seq: int, disk_parts: list[wire.Payload], log_number: int, offset: int
    ) -> None:
        """Record ``seq`` (its disk form) is being written at ``offset`` of log
        ``log_number``."""
        ...

    def durable(self, seq: int, action: Callable[[], None] | None) -> None:
        """Record ``seq`` is durable here; ``action`` runs once it is committed."""
        ...

    def forward(self, action: Callable[[], None]) -> None:
        """Forward the record just made durable, once committed."""
        ...

    def control(self, action: Callable[[], None]) -> None:
        """Send a control message, behind every record held so far."""
        ...

    def rolled(self, seq: int) -> bool:
        """The log rolled to a new file at ``seq``, its end: whether a secondary was
        asked for the state there (it comes to :meth:`Committer.checkpoint_taken`);
        False: the binding is asked."""
        ...


class Committer:
    """One instance's log: its files, the log being written, and the commit loop.

    :meth:`start` gives it the binding and the forwarder (and starts the pipeline's sync
    stage); :meth:`run` is the commit loop of normal processing, until :meth:`end_input`.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        registry: InstanceRegistry,
        files: InstanceFiles,
        intake: Intake,
    ) -> None:
        self.config = config
        self.registry = registry
        self.files = files
        self.intake = intake
        self.links: PeerLinks | None = None  # once links are open
        self.log_number = 0
        self.writer: LogWriter | None = None
        self.trigger_bytes = int(config.log_trigger_mb * 1024 * 1024)
        self._log_start: dict[int, _LogStart] = {}
        self._binding: BindingLink | None = None
        self._forwarder: Forwarder | None = None
        self._pipeline: CommitPipeline[Forwarded] | None = None
        self._held: list[Forwarded] | None = None  # durable, forwarded once released
        self._wake = asyncio.Event()
        self._eof = False
        self._parked = False  # the commit loop waits for input
        self._roll_requested = False
        self._binding_asked = False  # the roll requested is the binding's TakeCheckpoint
        self._awaiting_checkpoint: int | None = None  # the log it will pair with
        self._taken: tuple[int, bytes] | None = None  # a secondary's, to keep (checkpoint_taken)
        self._checkpointed = 0  # the newest checkpoint written
        self._arrived: CheckpointArrived | None = None  # answer not yet committed
        self._committing = False
        self._room = asyncio.Event()
        self._max_pending = int(config.max_pending_mb * 1024 * 1024)
        self.recorder = CheckpointRecorder(registry, config.instance, self.wake)
        self.replication: Replicating | None = None  # a replicated primary's
        # Told each checkpoint number once its file is written (a replica keeps it in its
        # own data dir: the registry's is the instance's, shared by its replicas).
        self.on_checkpoint: Callable[[int], None] | None = None

    def start(self, binding: BindingLink, forwarder: Forwarder) -> None:
        """From here on, records are forwarded (by ``forwarder``) to ``binding``."""
        self._binding = binding
        self._forwarder = forwarder
        self._pipeline = CommitPipeline(
            self._forward, max_unsynced=2 * self.config.max_record_bytes
        )

    async def close(self) -> None:
        """Stop the pipeline's sync stage (:meth:`run` did, if it ran), close the log, and
        wait for the checkpoint being recorded in the registry."""
        if self._pipeline is not None:
            await self._pipeline.close()
        if self.writer is not None:
            self.writer.close()
        await self.recorder.close()

    # -- the one way a record reaches the log ------------------------------------------------

    def _commit_next(self, alone: bool | None = None, upto: int | None = None) -> bool:
        """Append the intake's next record (see :meth:`Intake.next_record`) to the log:
        written now, synced by the pipeline, forwarded and confirmed to its link senders
        only once durable. False: there was none.

        ``alone`` (None: nothing is pending behind it, not even unread bytes on the
        binding's socket) says it is a request waiting for its answer: it takes the
        latency path. Otherwise more input is on its way, and blocking the loop on a sync
        would stop reading and batching it. Call only while the pipeline is ready.
        """
        record = self.intake.next_record(self.config.max_record_bytes, upto)
        if record is None:
            return False
        self._room.set()
        writer = self.writer
        pipeline = self._pipeline
        assert writer is not None and pipeline is not None and self._binding is not None
        if alone is None:
            alone = not self.intake.pending and not self._binding.has_unread()
        confirm = functools.partial(self._made_durable, record) if record.marks else None
        replication = self.replication
        if replication is not None:
            replication.appended(record.seq, record.disk_parts, self.log_number, writer.size)
            confirm = functools.partial(replication.durable, record.seq, confirm)
        pipeline.append(
            writer,
            record.disk_parts,
            (record.wire_parts, LogPlace(writer.path, writer.size, record.size)),
            confirm,
            size=record.size,
            alone=alone,
        )
        if writer.size >= self.trigger_bytes:  # written inline; the loop checks the others
            self._roll_requested = True
        return True

    def _made_durable(self, record: RecordReady) -> None:
        self.intake.made_durable(record)
        if self.links is not None:
            self.links.durable(record.marks)

    def _forward(self, item: Forwarded) -> None:
        if self._held is not None:
            self._held.append(item)
        elif self.replication is not None:
            assert self._forwarder is not None
            self.replication.forward(functools.partial(self._forwarder.put, *item))
        else:
            assert self._forwarder is not None
            self._forwarder.put(*item)

    def hold_forwarding(self) -> None:
        """Keep durable records from the binding until :meth:`release_forwarding` (a first
        start echoes record 0 only once checkpoint 1 is committed)."""
        self._held = []

    def release_forwarding(self) -> None:
        held, self._held = self._held or [], None
        for item in held:
            self._forward(item)

    def _check_size(self) -> None:
        if self.writer is not None and self.writer.size >= self.trigger_bytes:
            self._roll_requested = True

    # -- input arriving ----------------------------------------------------------------------

    def wake(self) -> None:
        """Input or a control event arrived: the commit loop has work."""
        self._wake.set()

    def end_input(self) -> None:
        """No more input: the commit loop logs what is pending and ends."""
        self._eof = True
        self._wake.set()

    def input_read(self) -> None:
        """A read of link input was queued: logged and forwarded at once if it is a
        request alone, else by the commit loop, woken for it.

        The commit loop's latency round, run from the read that brought the input (a loop
        turn and a task switch less on every awaited call's path): only while the loop
        waits with nothing else to do, nothing is in flight, and the input pending is
        small and all there is (nothing unread from the binding either). A failure is
        left for the loop to raise.
        """
        pipeline = self._pipeline
        if (
            pipeline is None
            or not self._parked
            or self._wake.is_set()
            or not pipeline.idle
            or not self.intake.pending
            or self.intake.pending_bytes > _ALONE_MAX_BYTES
            or self._binding is None
            or self._binding.has_unread()
        ):
            self._wake.set()
            return
        try:
            self._commit_next(alone=True)
        except Exception:
            self._wake.set()  # the loop raises it (pipeline.check)
            return
        if self._roll_requested or self.intake.pending:
            self._wake.set()  # the loop rolls the log, or takes what a record left

    async def room_for_input(self) -> None:
        """While the commit loop runs, the readers of the binding (once links are open)
        and of links wait while more than ``max_pending_mb`` of input is pending; TCP
        then slows their senders down. Records written and not yet synced do not count:
        the next record must fill while one syncs."""
        while not self.has_room():
            self._room.clear()
            await self._room.wait()

    def has_room(self) -> bool:
        """Whether :meth:`room_for_input` would return at once."""
        return not (self._committing and self.intake.pending_bytes > self._max_pending)

    # -- checkpoints and logs ----------------------------------------------------------------

    def open_log(self, n: int) -> None:
        if self.writer is not None:
            self.writer.close()
        self.log_number = n
        self._log_start[n] = _LogStart(
            self.intake.next_seq, self.intake.logged_outputs, dict(self.intake.inbox.durable)
        )
        self.writer = self.files.open_log(n)

    def request_roll(self) -> None:
        """The binding asked for a checkpoint (TakeCheckpoint)."""
        self._roll_requested = self._binding_asked = True

    def checkpoint_arrived(self, event: CheckpointArrived) -> bool:
        """The binding's checkpoint after a roll, committed by the commit loop; False if
        none was asked for (or one is already waiting)."""
        if self._awaiting_checkpoint is None or self._arrived is not None:
            return False
        self._arrived = event
        return True

    async def commit_checkpoint(self, n: int, arrived: CheckpointArrived) -> None:
        """Write checkpoint n once everything queued before it is durable, then commit it
        (checkpoint 1 before this returns; a later one in the background)."""
        pipeline = self._pipeline
        assert pipeline is not None
        while True:
            await pipeline.wait_ready()
            if not self._commit_next(upto=arrived.enqueued):
                break
        await pipeline.flush()
        start = self._log_start[n]
        state = IcState(
            self.intake.committer_id,
            start.next_seq,
            start.logged_outputs,
            arrived.binding_outputs,
            arrived.blob,
            start.inbox,
            arrived.outboxes,
            dict(self.intake.inbox.incarnations),
            arrived.attached,
        )
        await self._keep(n, state, f" ({len(arrived.blob)} bytes, next seq {start.next_seq})")

    async def _keep(self, n: int, state: IcState, details: str) -> None:
        """Write checkpoint ``n`` and commit it."""
        await asyncio.to_thread(self.files.write_checkpoint, n, state.encode_parts())
        self._checkpointed = max(self._checkpointed, n)
        crashpoints.reach("ic.checkpoint.before_commit")
        if self.on_checkpoint is not None:
            self.on_checkpoint(n)
        await self.recorder.record(self.files.version, n, details)

    def checkpoint_taken(self, seq: int, data: bytes) -> None:
        """A secondary's checkpoint for the roll at ``seq`` (:meth:`Replicating.rolled`):
        the commit loop keeps it as the checkpoint of the log that starts there."""
        self._taken = (seq, data)
        self.wake()

    async def _keep_taken(self, seq: int, data: bytes) -> None:
        n = next((k for k, start in self._log_start.items() if start.next_seq == seq), None)
        if n is None or n <= self._checkpointed:
            log.info("a checkpoint taken for seq %d came after a newer one: not kept", seq)
            return
        where = f"the checkpoint a secondary took for seq {seq}"
        try:
            state = IcState.decode(data, where)
        except StateFormatError as exc:
            log.warning("%s: not kept", exc)
            return
        if state.next_seq != seq or state.committer_id != self.intake.committer_id:
            log.warning(
                "%s stands before seq %d of committer %d: not kept",
                where,
                state.next_seq,
                state.committer_id,
            )
            return
        # A secondary knows the incarnations of link senders only from the checkpoint it
        # loaded; this primary's are the same and those linked since.
        senders = {**state.senders, **self.intake.inbox.incarnations}
        state = attrs.evolve(state, senders=senders)
        await self._keep(n, state, f" (taken by a secondary, {len(data)} bytes, next seq {seq})")

    def move_to_version(self, version: int) -> None:
        """An upgrade: the instance's files of ``version``, emptied of what an earlier
        attempt that never committed left, become this log's."""
        new = InstanceFiles(self.config.data_dir, self.config.instance, version)
        new.create()
        new.acquire_lock()
        new.clear()  # an earlier upgrade attempt that never committed
        self.adopt_files(new)

    def adopt_files(self, files: InstanceFiles) -> None:
        """Go on in ``files`` (locked by the caller), another version's."""
        if files is not self.files:
            self.files.release_lock()
            self.files = files

    async def _roll(self) -> None:
        """Move to the next log; the checkpoint that pairs with it comes from a secondary
        (a replicated primary's size trigger) or, asked now, from the binding."""
        assert self._forwarder is not None
        self.open_log(self.log_number + 1)
        crashpoints.reach("ic.log.roll")  # the new log exists; no checkpoint registers it yet
        binding_asked, self._binding_asked = self._binding_asked, False
        self._roll_requested = False
        replication = self.replication
        if (
            not binding_asked
            and replication is not None
            and replication.rolled(self.intake.next_seq)
        ):
            log.info("rolled to log %d; a secondary takes its checkpoint", self.log_number)
            return
        self._awaiting_checkpoint = self.log_number
        log.info("rolled to log %d; asking for checkpoint %d", self.log_number, self.log_number)
        # After the old log's records: put in order behind them.
        take = functools.partial(
            self._forwarder.control, self.intake.committer_id, TakeCheckpoint()
        )
        if self.replication is not None:
            self.replication.control(take)
        else:
            take()

    # -- normal processing -------------------------------------------------------------------

    async def run(self) -> None:
        """Group commit: one record per round, durable before it is forwarded; then what
        is still pending, once the input has ended."""
        pipeline = self._pipeline
        assert pipeline is not None and self._forwarder is not None
        self._committing = True
        try:
            await self._rounds(pipeline)
            await pipeline.flush()
            await self._forwarder.flush()
        finally:
            self._committing = False
            self._room.set()
            await pipeline.close()  # its sync stage ends with the loop

    async def _rounds(self, pipeline: CommitPipeline[Forwarded]) -> None:
        while True:
            pipeline.check()  # what a latency round from a read (input_read) met
            self.recorder.check()  # the registry refused a checkpoint
            if not pipeline.ready:
                # A record is being written (or the sync stage is behind): the next one
                # takes in everything that arrives meanwhile. Once the write ended, its
                # size may call for a roll, which comes before the next record.
                await pipeline.wait_ready()
                continue
            self._check_size()
            if self._taken is not None:
                (seq, data), self._taken = self._taken, None
                await self._keep_taken(seq, data)
                continue
            if self._arrived is not None and self._awaiting_checkpoint is not None:
                arrived, self._arrived = self._arrived, None
                await pipeline.flush()  # input before the checkpoint must be durable
                await self.commit_checkpoint(self._awaiting_checkpoint, arrived)
                self._awaiting_checkpoint = None
                continue
            if self._roll_requested and self._awaiting_checkpoint is None:
                await pipeline.flush()  # the old log is complete before the new one starts
                await self._roll()
                continue
            if self._commit_next():
                continue
            if self._eof:
                return
            self._wake.clear()
            self._parked = True
            try:
                await self._wake.wait()
            finally:
                self._parked = False
