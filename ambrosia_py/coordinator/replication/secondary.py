"""The secondary's side of the replicated log, sans-IO.

A :class:`Secondary` holds an epoch (saved, so a restart keeps refusing lower ones) and
follows the primary of that epoch. Its log and history are made from what is on disk
when it starts; it knows the primary from the registry (:meth:`Secondary.follow`) or from
the first message of its epoch. It moves through :data:`~.states.SECONDARY`:

- Anything of a lower epoch is answered with REFUSE; anything of a higher one makes it
  adopt that epoch (:class:`~.events.SaveEpoch`, durably, before anything else is sent)
  and start JOINING again. Two replicas acting as primary of one epoch is an error.
- JOINING, it answers the primary with its position and waits for a SYNC. It writes
  nothing, acknowledges nothing and learns no commit point: its log may hold a tail the
  primary's does not, and a commit point says which records of *the primary's* log are
  committed.
- A SYNC brings the primary's history. The secondary computes, from the histories alone,
  where its log stops agreeing with the primary's (:func:`~.history.agreement`, with the
  primary's last epoch open-ended, so a late or repeated SYNC truncates nothing more),
  truncates there (:class:`~.events.TruncateLog`, never below the commit point it knows),
  takes the history (:class:`~.events.SaveHistory`) and is STREAMING.
- STREAMING, it appends what arrives in order (:class:`~.events.WriteRecords`), skipping
  what it already holds; a gap asks the primary to resend from its log's end (RESEND, not
  repeated within ``timing.retry_after``). Each durability report is acknowledged (ACK);
  a heartbeat is answered with one too, so a lost acknowledgement costs one heartbeat.
  The commit points that arrive say which of its records may be replayed to the binding
  (:class:`~.events.Replayable`: committed *and* in its log).
- Trim points for the outboxes (TRIM), in any state, are passed on
  (:class:`~.events.TrimOutboxes`): what the replayed binding sent other instances and
  they confirmed to the primary is dropped here too.
- A checkpoint comes in chunks (INSTALLING) when the primary's log no longer holds where
  this log ends; the last chunk installs it (:class:`~.events.InstallCheckpoint`) and the
  log starts over, empty, at the checkpoint's seq. A SYNC whose history, compacted,
  shares no epoch with this log's while this log holds records below its first entry
  vouches for none of them: the replica changes nothing, acknowledges nothing, and waits
  for the primary's checkpoint (INSTALLING), which replaces the whole log; only then
  does it take the history.
- A SYNC also says which version of the instance the term ships from which seq on
  (:class:`~.messages.Sync`). When that is not the version its binding runs
  (``version``), it says so (:class:`~.events.VersionFrom`): the binding must replay
  nothing from there with its code, and either upgrades in place there or the replica
  stops (the adapter's choice). The records themselves are bytes to it and are still
  written and acknowledged. A checkpoint of another version than its binding's is never
  installed: one of an older version (below the term's ``since``, its version the
  binding's) is waited past, one of the term's is reported.
- A replica started to upgrade (``upgrade_to``, a version above its own) that holds the
  whole log of a term of its own version, durably, asks the primary for the role
  (ASK_ROLE, again every ``retry_after``). A HANDOVER to it reports
  :class:`~.events.RoleHandedOver`: it takes the role from that term at once. A HANDOVER
  to another leaves the role to that one for ``2 * failover_after``: no probe, no report
  of a lost primary meanwhile (:meth:`~.handover.Asking.leaves_role`; the hand-over's
  code is in :mod:`.handover`).
- A replica started with an empty data dir (``recovering``: a new machine, or one that
  lost its disk) may have acknowledged records it no longer holds, so its positions say
  it recovers and new terms do not count them. It has caught up once its log, STREAMING,
  is durable up to the ``log_end`` of a SYNC of its epoch that answers a POSITION of
  this start (``incarnation``, picked by the adapter at each start: a SYNC queued before
  the disk was lost may arrive after), where the primary's log ended then: every record
  it may have acknowledged before is below that, or was never committed. It reports it
  (:class:`~.events.Recovered`, to be saved).
- A ROLL asks it, STREAMING, for the state before the primary's roll point
  (:class:`~.events.TakeCheckpointFor`); what its binding takes there it sends back in
  chunks (TAKEN, :meth:`Secondary.checkpoint_taken`), so the primary never pauses to
  checkpoint. Asked in another state it does nothing: the primary asks at its next roll.

:meth:`Secondary.tick` watches the primary. Nothing from it (message of any kind) for
``timing.failover_after`` is not yet enough to take the role: a secondary cut off from
the others alone would take it from a primary that serves them well, and the primary,
told by the registry, would stop. So it first asks the other replicas (PROBE, numbered
rounds, every ``failover_after / 2`` while the silence lasts) whether they find the
primary silent too, and reports :class:`~.events.PrimaryLost` only once ``term_quorum -
1`` of them said so (SILENCE) in one round: the quorum a new term needs to be
established, so a take-over that could not be established is not tried (Raft's
pre-vote). A replica answers "silent" when it has heard nothing from its primary for
``failover_after / 2``; a primary always answers "not silent". The report comes again,
after a new round, every ``failover_after`` while the silence lasts. Probes neither
raise nor refuse epochs. In a group of one (a core alone) the report comes at once.
The probing is in :mod:`.prevote`.

A secondary runs in the group of the term it follows (:mod:`.group`): a NEW_TERM brings
it. One that names another group under the same number as this replica's (replicas
started with other ``--replicas`` or ``--replication-ack``) stops it
(:class:`~.errors.GroupMismatchError`): a term's quorum meets every set of replicas a
record was committed on only if all count alike.
"""

from __future__ import annotations

from typing import Protocol

from .chunks import ChunkTransfer, checkpoint_pieces
from .errors import GroupMismatchError, ReplicationRuleError
from .events import (
    EventQueue,
    Group,
    InstallCheckpoint,
    Recovered,
    Replayable,
    SaveEpoch,
    SaveHistory,
    Send,
    StoreCheckpointChunk,
    TakeCheckpointFor,
    Timing,
    TrimOutboxes,
    TruncateLog,
    VersionFrom,
    WriteRecords,
)
from .handover import Asking
from .history import History, agreement
from .messages import (
    Ack,
    Append,
    AskRole,
    CheckpointChunk,
    Handover,
    Heartbeat,
    Message,
    NewTerm,
    OutboxTrim,
    Position,
    Probe,
    Refuse,
    Resend,
    Roll,
    Silence,
    Sync,
    TakenChunk,
)
from .prevote import Probing
from .states import SECONDARY, SecondaryEvent, SecondaryState, step

__all__ = ["LogState", "Secondary"]

SE = SecondaryEvent


class LogState(Protocol):
    """What a core knows of its replica's log, which the next core of the replica starts
    from when the replica's role changes (:meth:`Secondary.following`,
    :meth:`~.primary.Primary.taking_over`)."""

    @property
    def replica(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def history(self) -> History: ...
    @property
    def log_base(self) -> int: ...
    @property
    def log_end(self) -> int: ...
    @property
    def durable_end(self) -> int: ...
    @property
    def commit_end(self) -> int: ...


class Secondary(Asking, Probing, EventQueue):
    """A secondary replica (see the module). ``epoch`` and ``history`` are what it saved;
    ``log_base`` the seq its latest checkpoint stands before, ``log_end`` where its log
    ends, ``durable_end`` where its durable part ends (``log_end`` if not given: a log
    as scanned after a restart); ``commit_end`` a seq known committed in that log (the
    checkpoint's, after a restart; a primary stepping down passes its own);
    ``replayed_end`` how much of it the binding has (``log_base`` if not given: it
    reloads from the checkpoint). ``group``: the replicas it asks before reporting the
    primary lost (see the module). ``version``: the instance's version its binding
    runs; ``upgrade_to``: the one it was started to upgrade to, if any.
    ``recovering``: it started with an empty data dir and has not caught up since (its
    positions say so, and a new term does not count them; see the module)."""

    def __init__(
        self,
        *,
        replica: int,
        epoch: int,
        history: History,
        log_base: int,
        log_end: int,
        commit_end: int,
        now: float,
        timing: Timing | None = None,
        primary: int | None = None,
        durable_end: int | None = None,
        replayed_end: int | None = None,
        group: Group | None = None,
        version: int = 0,
        upgrade_to: int | None = None,
        recovering: bool = False,
        incarnation: int = 0,
    ) -> None:
        group = Group.of({replica}) if group is None else group
        if recovering and incarnation == 0:
            raise ReplicationRuleError("a recovering replica needs an incarnation other than 0")
        if history.entries and history.entries[-1].epoch > epoch:
            raise ReplicationRuleError(
                f"history holds epoch {history.entries[-1].epoch}, above the saved {epoch}"
            )
        durable = log_end if durable_end is None else durable_end
        if not 0 <= log_base <= durable <= log_end:
            raise ReplicationRuleError(
                f"log base {log_base}, durable end {durable} and end {log_end} out of order"
            )
        super().__init__()
        self.replica = replica
        self.epoch = epoch
        self.history = history
        self.timing = timing or Timing()
        self.primary = primary
        self.state = SecondaryState.JOINING
        self.log_base = log_base
        self.log_end = log_end
        self.durable_end = durable
        self.commit_end = max(log_base, min(commit_end, log_end))
        self.replayed_end = log_base if replayed_end is None else min(replayed_end, self.commit_end)
        self._heard = now  # the last message from the primary, or the start
        self._lost_said = now  # the last PrimaryLost, or the start
        self.group = group
        self._round = 0  # the last probe round asked
        self._probe = None  # the round under way, if any (prevote.py)
        self._asked: tuple[type[Message], int, float] | None = None
        self._checkpoint: ChunkTransfer | None = None
        self._checkpoint_heard = now
        self._roll: tuple[int, int] | None = None  # (epoch, seq) of the last ROLL taken
        self.version = version
        # What the SYNC of this epoch said: the version the term ships from a seq on.
        self.term_version: tuple[int, int] | None = None
        self._offered_said = False  # a checkpoint of another version was reported
        self.upgrade_to = upgrade_to
        self.recovering = recovering
        self.incarnation = incarnation
        self._recover_to: int | None = None  # the log end of this epoch's SYNC, recovering
        self._primary_end = 0  # the primary's log end, as last heard in this epoch
        self._asked_role: float | None = None  # when ASK_ROLE last went out
        self._left_to: tuple[int, float] | None = None  # (replica, when) handed the role
        self._apart: Sync | None = None  # a SYNC that waits for the checkpoint it brings
        self._replay()

    @classmethod
    def following(
        cls,
        core: LogState,
        *,
        epoch: int,
        now: float,
        timing: Timing | None = None,
        group: Group | None = None,
        version: int = 0,
        upgrade_to: int | None = None,
    ) -> Secondary:
        """The secondary a replica goes on as when its primary core steps down
        (:class:`~.events.SteppedDown`: ``epoch`` is the one it names), with the log as
        that core left it, written and durable, and its binding where it was."""
        return cls(
            replica=core.replica,
            epoch=epoch,
            history=core.history,
            log_base=core.log_base,
            log_end=core.log_end,
            durable_end=core.durable_end,
            commit_end=core.commit_end,
            replayed_end=core.commit_end,
            now=now,
            timing=timing,
            group=group,
            version=version,
            upgrade_to=upgrade_to,
        )

    # --- the adapter's calls -------------------------------------------------------------

    def position(self) -> Position:
        """What this log holds, as a POSITION says it (and the registry may publish)."""
        history = self.history.effective(self.log_end)
        return Position(
            self.epoch, self.log_end, history, self.group, self.recovering, self.incarnation
        )

    def follow(self, epoch: int, primary: int, now: float) -> None:
        """The registry names ``primary`` as holding the term of ``epoch``."""
        if epoch < self.epoch or primary == self.replica:
            return  # old news; or this replica's own term, which its adapter takes up
        if epoch > self.epoch:
            self._adopt(epoch)
        elif self.primary is not None and self.primary != primary:
            raise ReplicationRuleError(
                f"replicas {self.primary} and {primary} both named primary of epoch {epoch}"
            )
        self.primary = primary
        self._heard = now
        self._probe = None
        if self.state is SecondaryState.JOINING:
            self._ask(Position, self.log_end, now, force=True)

    def receive(self, sender: int, msg: Message, now: float) -> None:
        """A message from replica ``sender``."""
        if isinstance(msg, Position | Ack | Resend | Refuse | TakenChunk | AskRole):
            return  # meant for a primary: this replica is not one
        if isinstance(msg, Probe):
            self._answer_probe(sender, msg, now)
            return
        if isinstance(msg, Silence):
            self._answered(sender, msg, now)
            return
        if msg.epoch < self.epoch:
            self._events.append(Send(sender, Refuse(self.epoch)))
            return
        if isinstance(msg, NewTerm) and msg.group != self.group:
            self._take_group(sender, msg)
        if msg.epoch > self.epoch:
            self._adopt(msg.epoch)
        if self.primary is None:
            self.primary = sender
        elif self.primary != sender:
            raise ReplicationRuleError(
                f"replicas {self.primary} and {sender} both act as primary of epoch {msg.epoch}"
            )
        self._heard = now
        self._probe = None
        before = self.state
        match msg:
            case NewTerm():
                self.state = step("secondary", SECONDARY, before, SE.NEW_TERM)
                self._ask(Position, self.log_end, now, force=True)
            case Sync() if self._shares_nothing(msg):
                self.state = step("secondary", SECONDARY, before, SE.SYNC_APART)
                self._apart = msg
                self._checkpoint = None
                self._checkpoint_heard = now
                self._take_version(msg)
            case Sync():
                self.state = step("secondary", SECONDARY, before, SE.SYNC)
                self._sync(msg, now)
            case Append():
                self.state = step("secondary", SECONDARY, before, SE.APPEND)
                if before is SecondaryState.STREAMING:
                    self._append(msg, now)
                elif before is SecondaryState.JOINING:
                    self._ask(Position, self.log_end, now)
            case Heartbeat():
                self.state = step("secondary", SECONDARY, before, SE.HEARTBEAT)
                self._primary_end = max(self._primary_end, msg.log_end)
                if before is SecondaryState.STREAMING:
                    self._learn_commit(msg.commit_end)
                    self._events.append(Send(sender, self._ack()))
                    if msg.log_end > self.log_end:
                        self._ask(Resend, self.log_end, now)
                elif before is SecondaryState.JOINING:
                    self._ask(Position, self.log_end, now)
            case CheckpointChunk():
                self._chunk(msg, now)
            case OutboxTrim():
                self.state = step("secondary", SECONDARY, before, SE.TRIM)
                self._events.append(TrimOutboxes(msg.points))
            case Roll():
                self.state = step("secondary", SECONDARY, before, SE.ROLL)
                if before is SecondaryState.STREAMING:
                    self._roll = (msg.epoch, msg.seq)
                    self._events.append(TakeCheckpointFor(msg.seq))
            case Handover():
                self.state = step("secondary", SECONDARY, before, SE.HANDOVER)
                self._handed(msg, sender, now)

    def checkpoint_taken(self, seq: int, data: bytes | memoryview) -> None:
        """The checkpoint a :class:`TakeCheckpointFor` asked for, the state before record
        ``seq``: sent to the primary that asked, in chunks of ``timing.checkpoint_chunk``
        bytes, if this replica still follows it (no higher epoch since)."""
        if self._roll != (self.epoch, seq) or self.primary is None:
            return
        self._roll = None
        for offset, piece in checkpoint_pieces(data, self.timing.checkpoint_chunk):
            chunk = TakenChunk(self.epoch, seq, len(data), offset, piece)
            self._events.append(Send(self.primary, chunk))

    def upgraded(self, version: int) -> None:
        """The binding upgraded in place to ``version`` (where a
        :class:`~.events.VersionFrom` said): it runs that version from now on."""
        self.version = version

    def records_durable(self, end: int) -> None:
        """The log is durable (fdatasync'ed) below ``end``."""
        end = min(end, self.log_end)
        if end <= self.durable_end:
            return
        self.durable_end = end
        if self.state is SecondaryState.STREAMING and self.primary is not None:
            self._events.append(Send(self.primary, self._ack()))
        self._check_recovered()

    def log_pruned(self, base: int) -> None:
        """The log no longer holds the records below ``base`` (a checkpoint does)."""
        if base > self.replayed_end:
            raise ReplicationRuleError(f"pruned below {base}, past what was replayed")
        self.log_base = max(self.log_base, base)
        self.durable_end = max(self.durable_end, self.log_base)  # the checkpoint holds them

    def tick(self, now: float) -> None:
        """Time passes: a silent primary is probed, then reported lost; a stalled transfer
        given up; the role asked for (see the module)."""
        self._ask_role(now)
        self._watch_primary(now)
        if (
            self.state is SecondaryState.INSTALLING
            and now - self._checkpoint_heard >= self.timing.retry_after
        ):
            self.state = step("secondary", SECONDARY, self.state, SE.STALLED)
            self._checkpoint = None
            self._ask(Position, self.log_end, now, force=True)

    # --- inside --------------------------------------------------------------------------

    def _take_group(self, sender: int, msg: NewTerm) -> None:
        """The term's group is the one this replica runs in from now on: the store's
        when the term began. Only another group under this one's number is refused."""
        if msg.group.version == self.group.version:
            raise GroupMismatchError(
                f"replica {sender}, primary of epoch {msg.epoch}, runs in a group of "
                f"{msg.group.describe()}; this replica was started in one of "
                f"{self.group.describe()} (--replicas, --replication-ack): every replica "
                "of an instance must be started with the same two, or a record committed "
                "on one group's replicas could be missing from the other's quorum"
            )
        self.group = msg.group

    def _adopt(self, epoch: int) -> None:
        self.epoch = epoch
        self.primary = None
        self.state = step("secondary", SECONDARY, self.state, SE.HIGHER_EPOCH)
        self._checkpoint = None
        self._asked = None
        self.term_version = None
        self._offered_said = False
        self._primary_end = 0
        self._recover_to = None
        self._left_to = None
        self._apart = None
        self._events.append(SaveEpoch(epoch))

    def _ack(self) -> Ack:
        return Ack(self.epoch, self.durable_end, self.log_end)

    def _ask(self, kind: type[Message], at: int, now: float, *, force: bool = False) -> None:
        """Send a position or a resend request, unless the same one went out less than
        ``retry_after`` ago."""
        if self.primary is None:
            return
        last = self._asked
        if (
            not force
            and last is not None
            and last[:2] == (kind, at)
            and now - last[2] < self.timing.retry_after
        ):
            return
        self._asked = (kind, at, now)
        msg: Message = self.position() if kind is Position else Resend(self.epoch, at)
        self._events.append(Send(self.primary, msg))

    def _shares_nothing(self, msg: Sync) -> bool:
        """Whether ``msg``'s history shares no epoch with this log's while the log holds
        records below that history's first entry (see the module)."""
        first = msg.history.entries[0].start if msg.history.entries else 0
        return (
            self.log_base < min(first, self.log_end)
            and agreement(self.history, self.log_end, msg.history, None) is None
        )

    def _joined(self, theirs: History) -> History:
        """The primary's history, with this one's entries before its first kept: the
        primary's may be compacted past this log's checkpoint, and a history must say
        who wrote every record its log holds (so that this replica, primary one day,
        compacts only below a checkpoint of its own)."""
        if not theirs.entries or theirs.entries[0] not in self.history.entries:
            return theirs
        first = theirs.entries[0].epoch
        below = tuple(e for e in self.history.entries if e.epoch < first)
        return History((*below, *theirs.entries)) if below else theirs

    def _check_recovered(self) -> None:
        """Recovering, caught up once its log, streaming, is durable up to where the
        primary's log ended as it synced this replica in this epoch."""
        if (
            self.recovering
            and self._recover_to is not None
            and self.state is SecondaryState.STREAMING
            and self.durable_end >= self._recover_to
        ):
            self.recovering = False
            self._events.append(Recovered(self.epoch, self.durable_end))

    def _take_version(self, msg: Sync) -> None:
        if self.recovering and msg.answers == self.incarnation:  # both kinds come here
            # Sent once the primary had a POSITION of this start: not one queued before.
            self._recover_to = max(self._recover_to or 0, msg.log_end)
        self.term_version = (msg.version, msg.since)
        if msg.version != self.version:
            self._events.append(VersionFrom(msg.epoch, msg.version, msg.since))

    def _sync(self, msg: Sync, now: float) -> None:
        # Below its checkpoint a log holds nothing to compare: those records are
        # committed (a checkpoint is only ever of committed state), so it agrees there,
        # also when its history is empty (a checkpoint installed before any SYNC).
        self._apart = None
        agreed = max(agreement(self.history, self.log_end, msg.history, None) or 0, self.log_base)
        if agreed < self.log_end:
            if agreed < min(self.commit_end, self.log_end) or agreed < self.log_base:
                raise ReplicationRuleError(
                    f"epoch {msg.epoch}'s history agrees with this log only below {agreed}: "
                    f"truncating there would drop records known committed (commit "
                    f"{self.commit_end}, checkpoint {self.log_base})"
                )
            self._events.append(TruncateLog(agreed))
            self.log_end = agreed
            self.durable_end = min(self.durable_end, agreed)
        history = self._joined(msg.history)
        if history != self.history:
            self.history = history
            self._events.append(SaveHistory(history))
        self._take_version(msg)
        self._ask(Resend, self.log_end, now, force=True)
        assert self.primary is not None
        self._events.append(Send(self.primary, self._ack()))
        self._check_recovered()

    def _append(self, msg: Append, now: float) -> None:
        self._primary_end = max(self._primary_end, msg.end)
        self._learn_commit(msg.commit_end, replay=False)
        if msg.first_seq > self.log_end:
            self._ask(Resend, self.log_end, now)
        else:
            fresh = msg.records[self.log_end - msg.first_seq :]
            if fresh:
                self._events.append(WriteRecords(self.log_end, fresh))
                self.log_end += len(fresh)
            else:  # all held already: say where this log is
                assert self.primary is not None
                self._events.append(Send(self.primary, self._ack()))
        self._replay()

    def _learn_commit(self, commit_end: int, *, replay: bool = True) -> None:
        self.commit_end = max(self.commit_end, commit_end)
        if replay:
            self._replay()

    def _replay(self) -> None:
        end = min(self.commit_end, self.log_end)
        if end > self.replayed_end:
            self.replayed_end = end
            self._events.append(Replayable(end))

    def _chunk(self, msg: CheckpointChunk, now: float) -> None:
        state = self.state
        key = (msg.epoch, msg.seq, msg.total)
        held = self._checkpoint if self._checkpoint and self._checkpoint.key == key else None
        if (msg.seq <= self.log_end and self._apart is None) or not self._loadable(msg):
            kind = SE.CHUNK_STALE
        else:
            gained = (held or ChunkTransfer(key)).missing_after(msg.offset, len(msg.data))
            kind = SE.CHUNK_LAST if gained == 0 else SE.CHUNK
        self.state = step("secondary", SECONDARY, state, kind)
        if self.state is SecondaryState.JOINING:
            self._checkpoint = None
            self._ask(Position, self.log_end, now)
            return
        if kind is SE.CHUNK_STALE:
            return
        self._checkpoint_heard = now
        transfer = held or ChunkTransfer(key)
        self._checkpoint = transfer
        if transfer.add(msg.offset, len(msg.data)):
            self._events.append(
                StoreCheckpointChunk(msg.seq, msg.total, msg.offset, msg.data, held is None)
            )
        if kind is SE.CHUNK_LAST:
            self._checkpoint = None
            self._events.append(InstallCheckpoint(msg.seq))
            self.log_base = self.log_end = self.durable_end = msg.seq
            self.commit_end = max(self.commit_end, msg.seq)
            self.replayed_end = msg.seq  # the binding reloads from the checkpoint
            apart, self._apart = self._apart, None
            if apart is not None:  # the log is the primary's now: so is its history
                self.history = apart.history
                self._events.append(SaveHistory(apart.history))
            self._ask(Resend, self.log_end, now, force=True)
            self._check_recovered()

    def _loadable(self, msg: CheckpointChunk) -> bool:
        """Whether the binding can load the checkpoint ``msg`` is a chunk of: one of the
        term's version, or (below its ``since``) of the version before it; if the term's
        and not the binding's, that is said (once per term)."""
        if self.term_version is None:
            return True  # no SYNC of this epoch yet: the chunk is not taken (JOINING)
        version, since = self.term_version
        ours = version == self.version
        if (msg.seq >= since) == ours:
            return True
        if not ours and not self._offered_said:
            self._offered_said = True
            self._events.append(VersionFrom(msg.epoch, version, msg.seq, offered=True))
        return False
