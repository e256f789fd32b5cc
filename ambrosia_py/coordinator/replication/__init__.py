"""The replicated log of an active/active instance: its protocol, sans-IO.

An instance run with replicas (``--replica N``, each with its own data dir) has one
**primary** at a time, chosen by a lease in the registry's store, each term with an
**epoch** from that store that grows with every new term (``registry/primary.py``). The
primary alone takes input and writes the log; it ships every record to the
**secondaries** as it writes it. A record is **committed** once it is durable
(fdatasync'ed) on ``k`` replicas, the primary one of them (``--replication-ack k``,
default a majority of the ``n`` registered); only committed records are forwarded to the
binding, acknowledged to other instances or answered on the ingress. Secondaries write
what is shipped to their own logs, in the same record format, and replay the committed
part to their bindings (continuous recovery). This package is the protocol: messages
and their bytes (:mod:`.messages`), the primary's side (:mod:`.primary`), the
secondary's (:mod:`.secondary`), the state machines (:mod:`.states`), the epoch
history (:mod:`.history`). No sockets, files or clocks: bytes and calls in, events out
(:mod:`.events`), time passed in as ``now``.

Failover. The primary sends every replica something at least every
``heartbeat_every`` (50 ms); a secondary that hears nothing for ``failover_after``
(300 ms) reports the primary lost, and its adapter takes the role over in the registry
from the term it saw. Detection is the replicas' own; the lease's TTL only bounds how
long a dead primary's key lingers. Safety never rests on timing: it rests on epochs and
quorums, as follows.

Terms. Each replica keeps an epoch history beside its log (:class:`~.history.History`):
``(epoch, start)`` entries saying which term wrote which part of the log. A log's
**rank** is ``(last epoch, log end)`` (Raft's "at least as up to date"; an entry stands
for the no-op record a Raft leader writes when its term starts, and takes no seq). Two
quorum sizes meet: commits need ``k`` replicas, a term needs ``q = n - k + 1``
(:class:`~.events.Group`); ``k + q > n``, so any two such sets share a replica.

The rule for the tail on a new term.

1. The new primary saves its epoch and sends NEW_TERM. A replica adopts a higher epoch
   durably before it answers, with its POSITION (its log's end and history); from then
   on it refuses everything of a lower epoch.
2. The term is established once ``q`` replicas (the primary counted) have answered with
   logs ranking no higher than the primary's own: that is how the candidate learns it
   is the most up to date of a quorum. Only then does the term's entry join its history,
   at its log's end (the **term start**): a term never established leaves no entry, so
   it raises no log's rank. If more than ``n - q`` replicas rank higher it can never be
   established, and the primary steps down naming the best log it heard of (the adapter
   lets that replica take over); likewise after ``establish_within``. The registry may
   pick candidates by published positions; safety comes from this check, not from that.
3. Only then does it SYNC anyone: the replica computes, from the two histories alone,
   where its log stops agreeing with the primary's (the latest epoch both hold, then the
   sooner end of that epoch's part, the primary's current epoch taken open-ended),
   truncates its log there, and takes the primary's history. What it truncates is an
   uncommitted tail: records an old primary shipped that too few replicas acknowledged.
   Nothing committed is ever truncated (I3, I4 below). A new primary's history is
   compacted below its checkpoint (:meth:`~.history.History.compacted`: every record
   there is committed), so it holds the terms since, not every term there ever was; a
   replica whose history then shares no epoch with it while its log holds records below
   the history's first entry cannot be told where it agrees: it truncates nothing and
   starts over from the primary's checkpoint, which replaces its whole log (Raft's
   snapshot install).
4. Commit counts only acknowledgements of the current epoch, which only synced replicas
   send, and only up to a point at or past the term start: earlier terms' records are
   committed along with the first commit of the new term, never by counting them (Raft's
   figure 8: a replica holding them but not yet the term start still ranks below a log
   that lacks them).

Invariants (``tests/test_replication_sim.py`` checks them after every step of
thousands of seeded runs over a network that delays, reorders, drops and partitions,
with crashes that lose what was not fdatasync'ed, and elections).

- I1 (one writer per seq and epoch): a record whose history says epoch ``e`` was written
  by the primary of ``e``; a primary never truncates its own log during its term.
- I2 (histories nest): every two histories that hold an epoch hold the same entries up
  to it, from the later of their first entries on (the primary's, copied whole by SYNC,
  compacted only of entries below a checkpoint). With I1, two logs agree below
  :func:`~.history.agreement` of their histories: the Log Matching property.
- I3 (completeness): a record committed in the term of ``e`` is in the log of the
  primary of every established later term, under the same epoch. By induction on terms:
  the commit set (``k`` replicas acknowledging in ``e``) and the later term's quorum
  (``q``, having adopted the later epoch) share a replica ``r``. ``r`` acknowledged
  before adopting (after, it refuses ``e``), at or past the term start of ``e``, so the
  position it gave holds the record and ranks at least ``(e, ...)``; syncs to terms in
  between kept it, by induction. The new primary ranks at least as high as ``r``. Same
  last epoch: both logs' parts of it come from its one writer (I1), and the primary's
  is the longer. A higher one, ``f``: its history holds the term start of ``f``, so its
  log agrees with that of the primary of ``f`` up to there, and that log held the record
  there, by induction.
- I4 (nothing committed is lost): every committed record is durable on ``k`` replicas.
  A SYNC truncates only past the agreement, which by I3 lies past every committed record
  the replica holds; a secondary refuses (error) a SYNC that would cut below the commit
  point it knows.
- I5 (one committed log): no two replicas ever hold different records at a seq either
  knows committed; every replica's committed prefix is a prefix of every other's;
  commit points never go backward.
- I6 (a deposed primary is harmless): once ``q`` replicas have adopted a higher epoch, the
  old primary's commit point cannot pass what a member of that quorum acknowledged
  before it adopted: ``k`` acknowledgements need one of them.

The adapter (the coordinator, not in this package) carries out the events in order,
each *durable* one made durable before the next: saving the epoch and the history (a
small file beside the log), truncating the log at a seq (the storage's scan, cut back,
fsync'ed), writing shipped records and reporting when they are fdatasync'ed, reading
records of its log from a seq, reading and installing checkpoints (with the seq each
stands before), and telling the binding which records to replay.
"""

from .errors import (
    GroupMismatchError,
    ReplicationError,
    ReplicationProtocolError,
    ReplicationRuleError,
)
from .events import (
    CheckpointTaken,
    CommitAdvanced,
    Established,
    Event,
    Group,
    InstallCheckpoint,
    PrimaryLost,
    ReadLog,
    Recovered,
    Replayable,
    RoleHandedOver,
    SaveEpoch,
    SaveHistory,
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
from .frames import FrameReader, decode_frame
from .history import EpochStart, History, agreement
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
    encode_frame,
    encode_parts,
)
from .primary import Primary
from .secondary import LogState, Secondary

__all__ = [
    "Ack",
    "Append",
    "AskRole",
    "CheckpointChunk",
    "CheckpointTaken",
    "CommitAdvanced",
    "EpochStart",
    "Established",
    "Event",
    "FrameReader",
    "Group",
    "GroupMismatchError",
    "Handover",
    "Heartbeat",
    "History",
    "InstallCheckpoint",
    "LogState",
    "Message",
    "NewTerm",
    "OutboxTrim",
    "Position",
    "Primary",
    "PrimaryLost",
    "Probe",
    "ReadLog",
    "Refuse",
    "Recovered",
    "Replayable",
    "RoleHandedOver",
    "ReplicationError",
    "ReplicationProtocolError",
    "ReplicationRuleError",
    "Resend",
    "Roll",
    "SaveEpoch",
    "SaveHistory",
    "Secondary",
    "Send",
    "SendCheckpoint",
    "Silence",
    "SteppedDown",
    "StoreCheckpointChunk",
    "Sync",
    "TakeCheckpointFor",
    "TakenChunk",
    "Timing",
    "TrimOutboxes",
    "TruncateLog",
    "VersionFrom",
    "WriteRecords",
    "agreement",
    "decode_frame",
    "encode_frame",
    "encode_parts",
]
