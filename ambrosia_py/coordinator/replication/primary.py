"""The primary's side of the replicated log, sans-IO.

One :class:`Primary` is one term: made when the registry gives this replica the role
(with the term's epoch), dropped when it steps down. It starts GATHERING: it saves its
epoch, sends NEW_TERM to every replica of its group, and waits for their positions.
Once replicas making a quorum of the group (``group.term_quorum`` of its members, and
while the group changes as many of the old members too: :mod:`.group`), itself counted,
have answered with positions none of which ranks above its own log, none of them
recovering, the term is ESTABLISHED
(:class:`~.events.Established`) and its entry joins the saved history, at the log's end
then (the *term start*); a term never established leaves no entry, so it ranks no log
above another. If so many rank above it that this cannot happen, or
``timing.establish_within`` passes, it steps down naming the best log it heard of
(:class:`~.events.SteppedDown`). Nothing is synced, and
so nothing truncated anywhere, before the term is established: until then the primary
does not know its log holds everything committed.

A recovering replica (started with an empty data dir: a new machine, or one that lost
its disk, and not caught up since) is not counted: it may be the very replica a
committed record was durable on, and counted in its place the quorum would miss the
record. With it left out, a quorum still meets every record committed on ``k``
replicas while at most ``k - 1`` of those lost their disks. Only the founding term, the
instance's first (``founding``), before which nothing can have been committed, counts
it: there every replica but the founder starts empty.

Established, it syncs each replica that has answered (SYNC: the replica truncates what
disagrees and takes the primary's history) and feeds it from where their logs agree:
from records as they are appended while it keeps up, from the log (:class:`ReadLog`,
the adapter calls :meth:`Primary.records_read`) while it is behind, from the checkpoint
(:class:`SendCheckpoint`, :meth:`Primary.checkpoint_read`) when the log no longer holds
where its log ends. Each replica's acknowledged durable end counts toward the commit
point: the highest seq ``c`` such that the primary's own log is durable below ``c``,
``group.k`` of the group's (new) members, the primary among them if it is one, hold the
same durably in this epoch, and ``c`` is at least
the term start (records of earlier terms are committed by the first commit of this one,
never by counting them: the Raft rule).

It never pauses to checkpoint: a secondary takes its checkpoints (:mod:`.rolls`).

A replica started to upgrade that holds the whole log asks for the role (ASK_ROLE, again
while it does). Once ``group.k`` replicas have asked within ``timing.failover_after``
(so the new version's primary has enough replicas that follow it to commit), the primary
picks the one that acknowledged the most (the lowest number on a tie), ships nothing
appended after that moment and commits nothing past it; once that replica has
acknowledged all of it durable, it tells every replica (HANDOVER) and steps down naming
it (:class:`~.events.SteppedDown`, ``handed``). The records appended
meanwhile were never committed: their callers ask the new primary again. If that
replica does not catch up within ``timing.establish_within``, the primary ships on (the
hand-over's code: :mod:`.handover`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .chunks import ChunkTransfer, checkpoint_pieces
from .errors import ReplicationRuleError
from .events import (
    CommitAdvanced,
    Established,
    EventQueue,
    Group,
    ReadLog,
    SaveEpoch,
    SaveHistory,
    Send,
    SendCheckpoint,
    SteppedDown,
    Timing,
)
from .feeds import Feed, batches, record_seqs
from .handover import Handing
from .history import History, agreement
from .messages import (
    Ack,
    Append,
    AskRole,
    Buffer,
    CheckpointChunk,
    Heartbeat,
    Message,
    NewTerm,
    OutboxTrim,
    Position,
    Probe,
    Refuse,
    Resend,
    Silence,
    Sync,
    TakenChunk,
    append_size,
)
from .rolls import Rolling
from .secondary import LogState
from .states import FEED, TERM, FeedEvent, FeedState, TermEvent, TermState, step

__all__ = ["Primary"]


class Primary(Handing, Rolling, EventQueue):
    """The primary of one term (see the module). ``history``, ``log_base`` (the first
    seq the log holds), ``log_end``, ``durable_end`` and ``commit_end`` are the
    replica's as it takes the role; ``epoch`` must exceed every epoch it has seen.
    ``version`` is the instance's version of what the term ships from ``since`` on (its
    SYNC says so; ``since`` defaults to ``log_base``): a replica that upgrades as it
    takes the role passes the new version and its log's end."""

    def __init__(
        self,
        *,
        replica: int,
        group: Group,
        epoch: int,
        history: History,
        log_base: int,
        log_end: int,
        durable_end: int,
        commit_end: int,
        now: float,
        timing: Timing | None = None,
        version: int = 0,
        since: int | None = None,
        founding: bool = False,
    ) -> None:
        if replica not in group.members:
            raise ReplicationRuleError(f"replica {replica} is not one of {sorted(group.members)}")
        if history.entries and history.entries[-1].epoch >= epoch:
            raise ReplicationRuleError(
                f"epoch {epoch} is not above the history's last, {history.entries[-1].epoch}"
            )
        if not 0 <= log_base <= log_end or not log_base <= durable_end <= log_end:
            raise ReplicationRuleError(
                f"log base {log_base}, durable end {durable_end} and end {log_end} out of order"
            )
        since = log_base if since is None else since
        if not log_base <= since <= log_end:
            raise ReplicationRuleError(f"version {version} from {since}, outside the log")
        super().__init__()
        self.replica = replica
        self.group = group
        self.epoch = epoch
        self.timing = timing or Timing()
        self.version = version
        self.since = since
        self.founding = founding
        own = history.effective(log_end)
        self.rank_at_start = own.rank(log_end)
        """The log's rank as the term began: what the replicas' positions are held to."""
        self.history = history
        """The saved history: the term's entry joins it when the term is established
        (an entry of a term that never was would rank this log above logs it lacks
        committed records of)."""
        # Compacted below its checkpoint: the history holds the terms since (history.py).
        self._term_history = own.compacted(log_base).extended(epoch, log_end)
        self.term_start = log_end
        self.log_base = log_base
        self.log_end = log_end
        self.durable_end = durable_end
        self.commit_end = min(commit_end, log_end)
        self.state = TermState.GATHERING
        self._started = now
        # Every member, old ones too while the group changes: a term counts both.
        self._feeds = {r: Feed(now) for r in sorted(group.members) if r != replica}
        self._rolled: tuple[int, int] | None = None  # (seq, replica) asked at the last roll
        self._taken: ChunkTransfer | None = None  # what came of that checkpoint so far
        # Handing the role over: to whom, the log's end then (nothing past it is shipped
        # or committed), and since when.
        self._handing: tuple[int, int, float] | None = None
        self._asks: dict[int, float] = {}  # who asked for the role, when last
        self._events.append(SaveEpoch(epoch))
        if commit_end > log_end:
            self._step_down(
                epoch, TermEvent.OUTRANKED, f"its log ends at {log_end}, below commit {commit_end}"
            )
            return
        for r in self._feeds:
            self._send(r, NewTerm(epoch, group), now)
        self._check_quorum(now)

    @classmethod
    def taking_over(
        cls,
        core: LogState,
        *,
        group: Group,
        epoch: int,
        now: float,
        timing: Timing | None = None,
        version: int = 0,
        since: int | None = None,
        founding: bool = False,
    ) -> Primary:
        """The term of ``epoch`` for a replica whose core (a secondary, or the primary of
        an earlier term) is ``core``, with the log as that core left it."""
        if epoch <= core.epoch:
            raise ReplicationRuleError(f"epoch {epoch} is not above the replica's {core.epoch}")
        return cls(
            replica=core.replica,
            group=group,
            epoch=epoch,
            history=core.history,
            log_base=core.log_base,
            log_end=core.log_end,
            durable_end=core.durable_end,
            commit_end=core.commit_end,
            now=now,
            timing=timing,
            version=version,
            since=since,
            founding=founding,
        )

    # --- the adapter's calls -------------------------------------------------------------

    def receive(self, sender: int, msg: Message, now: float) -> None:
        """A message from replica ``sender``."""
        if self.state is TermState.DEPOSED:
            return
        if sender not in self._feeds:
            return  # a replica of another group, following an earlier term
        if isinstance(msg, Probe):  # a secondary that hears nothing: this one is alive
            # Not through _send: no heartbeat is put off by it (a probe's answer is
            # not heard as the primary's word).
            self._events.append(Send(sender, Silence(self.epoch, msg.round, False)))
            return
        if isinstance(msg, Silence):
            return  # an answer to a probe this replica sent as a secondary
        if msg.epoch > self.epoch:
            self._step_down(
                msg.epoch, TermEvent.HIGHER_EPOCH, f"replica {sender} holds epoch {msg.epoch}"
            )
            return
        match msg:
            case Position() | Ack() | Resend() | TakenChunk() | AskRole() if msg.epoch < self.epoch:
                return  # from before the replica took this term
            case Refuse():
                return  # of a lower epoch than this term's: not about it
            case Position() if msg.group != self.group:
                # Not counted, nor synced: told this term's group, it stops (secondary.py).
                self._send(sender, NewTerm(self.epoch, self.group), now)
            case Position():
                self.state = step("primary", TERM, self.state, TermEvent.POSITION)
                self._feeds[sender].position = msg
                if self.state is TermState.GATHERING:
                    self._check_quorum(now)
                else:
                    self._sync(sender, now)
            case Ack():
                self.state = step("primary", TERM, self.state, TermEvent.ACK)
                self._ack(sender, msg)
                self._check_handover(now)
            case Resend():
                self.state = step("primary", TERM, self.state, TermEvent.RESEND)
                self._resend(sender, msg.from_seq, now)
            case TakenChunk():
                self.state = step("primary", TERM, self.state, TermEvent.TAKEN)
                self._taken_chunk(sender, msg)
            case AskRole():
                self.state = step("primary", TERM, self.state, TermEvent.ASK)
                self._asked_role(sender, now)
            case _:
                if msg.epoch == self.epoch:
                    raise ReplicationRuleError(
                        f"replica {sender} sent {type(msg).__name__} of epoch {msg.epoch}, "
                        f"this replica's term: two primaries in one epoch"
                    )
                self._send(sender, Refuse(self.epoch), now)

    def append(self, records: Sequence[Buffer], now: float) -> None:
        """New records, numbered from :attr:`log_end` on, that the adapter writes to the
        log (it reports their durability with :meth:`records_durable`)."""
        self.state = step("primary", TERM, self.state, TermEvent.APPEND)
        record_seqs(records, self.log_end)
        first = self.log_end
        self.log_end += len(records)
        size = append_size(records)
        for r, feed in self._feeds.items():
            if feed.state is not FeedState.STREAMING:
                continue
            if (
                feed.sent_end == first
                and self.log_end - feed.match <= self.timing.max_inflight
                and feed.inflight_bytes + size <= self.timing.max_inflight_bytes
            ):
                self._send_records(r, first, records, now)
            else:
                feed.state = step("feed", FEED, feed.state, FeedEvent.BEHIND)
                self._pump(r)

    def records_durable(self, end: int) -> None:
        """The log is durable (fdatasync'ed) below ``end``."""
        if self.state is TermState.DEPOSED:
            return
        self.state = step("primary", TERM, self.state, TermEvent.DURABLE)
        self.durable_end = max(self.durable_end, min(end, self.log_end))
        self._advance_commit()

    def records_read(
        self, replica: int, from_seq: int, records: Sequence[Buffer], now: float
    ) -> None:
        """The records a :class:`ReadLog` asked for: ``from_seq`` on, at least one; none
        if the log no longer holds ``from_seq`` (pruned since)."""
        if self.state is TermState.DEPOSED:
            return
        self.state = step("primary", TERM, self.state, TermEvent.READ)
        feed = self._feeds[replica]
        feed.reading = False
        if feed.state is not FeedState.READING or from_seq != feed.sent_end:
            self._pump(replica)  # asked before a resend request moved the feed: stale
            return
        if not records and from_seq < self.log_base:
            self._feed_from(replica, from_seq)
            return
        if not records or from_seq + len(records) > self.log_end:
            raise ReplicationRuleError(
                f"read {len(records)} records from {from_seq}: the log ends at {self.log_end}"
            )
        record_seqs(records, from_seq)
        self._send_records(replica, from_seq, records, now)
        self._pump(replica)

    def checkpoint_read(self, replica: int, seq: int, data: Buffer, now: float) -> None:
        """The checkpoint a :class:`SendCheckpoint` asked for: the state before record
        ``seq``, whole; it goes out in chunks of ``timing.checkpoint_chunk`` bytes."""
        if self.state is TermState.DEPOSED:
            return
        self.state = step("primary", TERM, self.state, TermEvent.READ)
        feed = self._feeds[replica]
        if feed.state is not FeedState.CHECKPOINT:
            return
        if not self.log_base <= seq <= self.log_end:
            raise ReplicationRuleError(
                f"checkpoint at {seq}: the log holds {self.log_base}..{self.log_end}"
            )
        for offset, piece in checkpoint_pieces(data, self.timing.checkpoint_chunk):
            self._send(replica, CheckpointChunk(self.epoch, seq, len(data), offset, piece), now)
        feed.sent_end = seq
        feed.checkpoint_sent = now

    def log_pruned(self, base: int) -> None:
        """The log no longer holds the records below ``base`` (a checkpoint holds them)."""
        if base > self.commit_end:
            raise ReplicationRuleError(f"pruned below {base}, past the commit point")
        self.log_base = max(self.log_base, base)
        self.durable_end = max(self.durable_end, self.log_base)

    def tick(self, now: float) -> None:
        """Time passes: heartbeats, and the deadline of the gathering."""
        if self.state is TermState.DEPOSED:
            return
        self.state = step("primary", TERM, self.state, TermEvent.TICK)
        if (
            self.state is TermState.GATHERING
            and now - self._started >= self.timing.establish_within
        ):
            self._step_down(
                self.epoch,
                TermEvent.OUTRANKED,
                f"no quorum of positions within {self.timing.establish_within} s",
                self._best_ahead(),
            )
            return
        self._handover_lapsed(now)
        for r, feed in self._feeds.items():
            if now - feed.last_sent < self.timing.heartbeat_every:
                continue
            if self.state is TermState.GATHERING or feed.position is None:
                self._send(r, NewTerm(self.epoch, self.group), now)
            else:
                self._send(r, Heartbeat(self.epoch, self.log_end, self.commit_end), now)

    def share_trims(self, points: tuple[tuple[str, int], ...], now: float) -> None:
        """Tell every synced replica the outboxes' trim points (per destination, the seq
        below which it confirmed what this instance sent it): their bindings' replay
        regenerates that output, and they forget it as this replica did."""
        if self.state is not TermState.ESTABLISHED:
            return
        for r, feed in self._feeds.items():
            if feed.position is not None:
                self._send(r, OutboxTrim(self.epoch, points), now)

    def match_of(self, replica: int) -> int:
        """What ``replica`` has acknowledged durable in this term."""
        return self._feeds[replica].match

    def feed_state(self, replica: int) -> FeedState:
        return self._feeds[replica].state

    # --- inside --------------------------------------------------------------------------

    def _send(self, to: int, msg: Message, now: float) -> None:
        self._events.append(Send(to, msg))
        self._feeds[to].last_sent = now

    def _step_down(
        self,
        epoch: int,
        why: TermEvent,
        reason: str,
        better: int | None = None,
        *,
        handed: bool = False,
    ) -> None:
        self.state = step("primary", TERM, self.state, why)
        if epoch > self.epoch:
            self._events.append(SaveEpoch(epoch))
        self._events.append(SteppedDown(max(epoch, self.epoch), reason, better, handed))

    def _best_ahead(self) -> int | None:
        ahead = [
            (f.position.rank(), r)
            for r, f in self._feeds.items()
            if f.position is not None and f.position.rank() > self.rank_at_start
        ]
        return max(ahead)[1] if ahead else None

    def _check_quorum(self, now: float) -> None:
        """Established once replicas holding logs that rank no higher than this one's
        did (this one counted), none of them recovering, make a quorum of the group
        (of each part while it changes); deposed once too many rank higher for that
        ever to happen."""
        counted = {
            r: f.position.rank()
            for r, f in self._feeds.items()
            if f.position is not None and (not f.position.recovering or self.founding)
        }
        behind = {r for r, rank in counted.items() if rank <= self.rank_at_start}
        ahead = set(counted) - behind
        if self.group.term_met(behind | {self.replica}):
            self.state = step("primary", TERM, self.state, TermEvent.QUORUM)
            self.history = self._term_history
            self._events += (SaveHistory(self.history), Established(self.epoch, self.term_start))
            for r, feed in self._feeds.items():
                if feed.position is not None:
                    self._sync(r, now)
            self._advance_commit()
        elif self.group.term_lost(ahead):
            self._step_down(
                self.epoch,
                TermEvent.OUTRANKED,
                f"{len(ahead)} replicas hold logs ahead of this one's",
                self._best_ahead(),
            )

    def _sync(self, replica: int, now: float) -> None:
        feed = self._feeds[replica]
        assert feed.position is not None
        pos = feed.position
        agreed = agreement(pos.history, pos.log_end, self.history, self.log_end)
        sync = Sync(
            self.epoch,
            self.history,
            self.version,
            self.since,
            log_end=self.log_end,
            answers=pos.incarnation,
        )
        self._send(replica, sync, now)
        if agreed is None:
            # No epoch in common: nothing it holds is vouched for (this history may be
            # compacted past its entries). It starts over from the checkpoint, which
            # stands at or past this history's first entry (a history reaches back to
            # its log's checkpoint), so past every record it holds that may be
            # committed; the secondary waits for it, changing nothing meanwhile.
            self._send_checkpoint(replica)
        else:
            self._feed_from(replica, agreed)

    def _send_checkpoint(self, replica: int) -> None:
        feed = self._feeds[replica]
        feed.settle(feed.match, lost_from=0)  # what was sent is superseded
        feed.state = step("feed", FEED, feed.state, FeedEvent.PRUNED)
        feed.checkpoint_sent = None
        self._events.append(SendCheckpoint(replica))

    def _feed_from(self, replica: int, seq: int) -> None:
        feed = self._feeds[replica]
        feed.settle(feed.match, lost_from=seq)  # from seq on it is sent again
        if seq < self.log_base:
            self._send_checkpoint(replica)
            return
        feed.sent_end = seq
        event = FeedEvent.CAUGHT_UP if seq == self.log_end else FeedEvent.BEHIND
        feed.state = step("feed", FEED, feed.state, event)
        self._pump(replica)

    def _pump(self, replica: int) -> None:
        """Ask for the next read of a replica that is behind, if it may take more."""
        feed = self._feeds[replica]
        if feed.state is not FeedState.READING or feed.reading:
            return
        frozen = self._frozen_end
        if frozen is not None and feed.sent_end >= frozen:
            return  # nothing past the hand-over point is shipped
        if feed.sent_end < self.log_base:
            self._feed_from(replica, feed.sent_end)
        elif feed.sent_end == self.log_end:
            feed.state = step("feed", FEED, feed.state, FeedEvent.CAUGHT_UP)
        elif (
            feed.sent_end - feed.match < self.timing.max_inflight
            and feed.inflight_bytes < self.timing.max_inflight_bytes
        ):
            feed.reading = True
            self._events.append(ReadLog(replica, feed.sent_end))

    def _send_records(
        self, replica: int, first: int, records: Sequence[Buffer], now: float
    ) -> None:
        frozen = self._frozen_end
        if frozen is not None:
            records = records[: max(0, frozen - first)]
        feed = self._feeds[replica]
        for i, run in batches(records, self.timing.max_append_bytes):
            self._send(replica, Append(self.epoch, first + i, self.commit_end, tuple(run)), now)
            feed.sent(first + i + len(run), append_size(run))
        self._feeds[replica].sent_end = first + len(records)

    def _ack(self, replica: int, msg: Ack) -> None:
        feed = self._feeds[replica]
        if msg.log_end > self.log_end:
            raise ReplicationRuleError(
                f"replica {replica} acknowledges a log to {msg.log_end}, past {self.log_end}"
            )
        if feed.position is None:
            return
        if msg.durable_end > feed.match:
            feed.match = msg.durable_end
            feed.settle(feed.match)
            self._advance_commit()
        self._pump(replica)

    def _resend(self, replica: int, from_seq: int, now: float) -> None:
        feed = self._feeds[replica]
        if from_seq > self.log_end:
            raise ReplicationRuleError(
                f"replica {replica} asks from {from_seq}, past the log's end {self.log_end}"
            )
        if feed.position is None:
            return
        if feed.state is FeedState.CHECKPOINT:
            # On from the log once it is installed; sent again once it is clearly lost
            # (the request that follows a SYNC comes before the transfer: not that).
            sent = feed.checkpoint_sent
            if from_seq >= self.log_base or (
                sent is not None and now - sent >= self.timing.retry_after
            ):
                self._feed_from(replica, from_seq)
            return
        if from_seq < feed.sent_end:
            self._feed_from(replica, from_seq)

    def _advance_commit(self) -> None:
        if self.state is not TermState.ESTABLISHED:
            return
        candidate = self.durable_end
        frozen = self._frozen_end
        if frozen is not None:
            candidate = min(candidate, frozen)
        # On k of the (new) members: the old ones count toward terms only. This replica
        # is one of the k if it is a member; one leaving counts the others alone.
        members = self.group.replicas
        others = self.group.k - 1 if self.replica in members else self.group.k
        if others > 0:
            matches = sorted(
                (f.match for r, f in self._feeds.items() if r in members), reverse=True
            )
            candidate = min(candidate, matches[others - 1])
        if candidate >= self.term_start and candidate > self.commit_end:
            self.commit_end = candidate
            self._events.append(CommitAdvanced(candidate))
