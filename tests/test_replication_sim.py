"""A deterministic, seeded simulation of the replicated log: 3 and 5 replicas.

Each replica is a core (:class:`Primary` or :class:`Secondary`) with a log in two parts,
what is written and what is durable, a saved epoch and history, and a checkpoint base.
The simulation is their adapter and their world: it carries out the cores' events in
order, ships every message as bytes (encoded and decoded) through a network that delays,
reorders, duplicates, drops and partitions, crashes replicas (a crash keeps only what
was fdatasync'ed), loses machines with their disks (at most ``k - 1`` at a time: a lost
replica comes back empty and counts as lost until it has caught up), restarts them,
prunes logs behind checkpoints, and plays the
registry: a new term, with the next epoch, for whoever takes the role over from the term
a replica reported lost (the reporter itself, or the best log by published positions),
or for the replica a deposed candidate names. Time is a number the simulation advances.

After every step it checks the package's invariants (I4 to I6 of its docstring), and
every few steps and at the end I1 and I2; each run ends healed and quiet, and must then
converge: one established primary, every log equal to its log, all of it committed.
With ``changes``, the registry's group changes too, as an operator would change it (a
replica added, one removed, one replaced, the ack changed), with two replicas more on
hand to add: the store's group becomes the new one changing from the old, a new term
begins soon after, and the primary of a term of it settles the change once it has
committed its start. A replica that leaves is stopped once the change is settled; one
that joins starts empty (recovering), or from the disk it left with.

A failure names its seed; ``Sim(seed, n, k, changes).run()`` replays it exactly.
"""

from __future__ import annotations

import heapq
import random
from collections import Counter
from collections.abc import Callable

import pytest

from ambrosia_py.coordinator.replication import (
    Ack,
    CheckpointTaken,
    CommitAdvanced,
    Established,
    Event,
    Group,
    History,
    InstallCheckpoint,
    Primary,
    PrimaryLost,
    ReadLog,
    Recovered,
    Refuse,
    Replayable,
    RoleHandedOver,
    SaveEpoch,
    SaveHistory,
    Secondary,
    Send,
    SendCheckpoint,
    SteppedDown,
    StoreCheckpointChunk,
    Sync,
    TakeCheckpointFor,
    Timing,
    TruncateLog,
    WriteRecords,
    decode_frame,
    encode_frame,
)
from ambrosia_py.coordinator.replication.states import SecondaryState
from ambrosia_py.wire.records import encode_disk_record
from ambrosia_py.wire.varint import decode_uvarint, encode_uvarint
from tests.replication_sim_invariants import Core, Invariants, Node

TIMING = Timing(max_inflight=6, max_inflight_bytes=300, max_append_bytes=200, checkpoint_chunk=512)


def checkpoint_bytes(records: list[bytes]) -> bytes:
    return b"".join(encode_uvarint(len(r)) + r for r in records)


def checkpoint_records(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        size, pos = decode_uvarint(data, pos)
        out.append(data[pos : pos + size])
        pos += size
    return out


class Sim(Invariants):
    def __init__(self, seed: int, n: int, k: int | None = None, *, changes: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.group = Group.of(set(range(n)), k, version=1)  # the store's
        spare = 2 if changes else 0
        self.nodes = [Node(i, up=i < n) for i in range(n + spare)]
        self.now = 0.0
        self.net: list[tuple[float, int, int, int, bytes]] = []
        self.later: list[tuple[float, int, Callable[[], None]]] = []
        self.order = 0
        self.blocked: set[tuple[int, int]] = set()
        self.fifo: dict[tuple[int, int], float] = {}  # the last in-order arrival per link
        self.heal_at = 0.0
        self.committed: list[bytes] = []  # the one committed log, as it grows
        self.writer: dict[bytes, int] = {}  # record -> the epoch that wrote it
        self.term: tuple[int, int | None] = (0, None)  # the registry's current term
        self.acks: dict[int, dict[int, int]] = {}  # epoch -> replica -> durable acked
        self.frozen: dict[int, tuple[int, int]] = {}  # epoch -> (bound, commit then)
        self.stats: Counter[str] = Counter()
        self.p_drop = self.rng.choice((0.0, 0.02, 0.1))
        self.p_crash = self.rng.choice((0.0, 0.004, 0.012))
        self.p_partition = self.rng.choice((0.0, 0.01, 0.03))
        # Replicas that ask for the role as ones started to upgrade do (ASK_ROLE).
        self.p_ask = self.rng.choice((0.0, 0.5))
        self.p_lose = self.rng.choice((0.0, 0.004))
        self.p_change = self.rng.choice((0.005, 0.02)) if changes else 0.0
        self.chaos = True
        for node in self.nodes[:n]:
            node.core = self.fresh_secondary(node)
        self.grant(self.rng.randrange(n))

    # --- the adapter ---------------------------------------------------------------------

    def fresh_secondary(self, node: Node) -> Secondary:
        return self.asking(
            Secondary(
                replica=node.rid,
                epoch=node.d_epoch,
                history=node.d_history,
                log_base=node.d_base,
                log_end=len(node.d_log),
                commit_end=node.d_base,
                now=self.now,
                timing=TIMING,
                group=self.group,
                recovering=node.d_recovering,
                incarnation=self.rng.randrange(1, 2**62),  # picked anew at each start
            )
        )

    def asking(self, core: Secondary) -> Secondary:
        # Started to upgrade to a version no term ships: it asks, and stays at its own.
        core.upgrade_to = 1 if self.rng.random() < self.p_ask else None
        return core

    def schedule(self, delay: float, action: Callable[[], None]) -> None:
        self.order += 1
        heapq.heappush(self.later, (self.now + delay, self.order, action))

    def drain(self, node: Node) -> None:
        while node.core is not None and (event := node.core.next_event()) is not None:
            self.carry_out(node, node.core, event)

    def carry_out(self, node: Node, core: Core, event: Event) -> None:
        match event:
            case Send(to, msg):
                if isinstance(msg, Refuse):
                    self.stats["refusals"] += 1
                if isinstance(msg, Ack):
                    acked = self.acks.setdefault(msg.epoch, {})
                    acked[node.rid] = max(acked.get(node.rid, 0), msg.durable_end)
                self.send(node.rid, to, encode_frame(msg))
            case SaveEpoch(epoch):
                assert epoch >= node.d_epoch
                node.d_epoch = epoch
            case SaveHistory(history):
                node.d_history = history
            case TruncateLog(end):
                assert node.d_base <= end < len(node.log)
                self.stats["truncations"] += 1
                node.log = node.log[:end]
                node.d_log = node.d_log[:end]
            case WriteRecords(first, records):
                assert first == len(node.log), (first, len(node.log))
                node.log += [bytes(r) for r in records]
            case Replayable(end):
                assert node.log[:end] == self.committed[:end], "replays an uncommitted record"
            case CommitAdvanced(end):
                self.commit(node, end)
                if isinstance(core, Primary):
                    self.settle(core, end)
            case Established():
                self.stats["established"] += 1
                if self.chaos and self.rng.random() < self.p_crash * 25:  # mid term start
                    self.schedule(self.rng.uniform(0, 0.02), lambda: self.crash_if(node, core))
            case ReadLog(replica, from_seq):
                delay = self.rng.uniform(0, 0.003)
                self.schedule(delay, lambda: self.read(node, core, replica, from_seq))
            case SendCheckpoint(replica):
                self.schedule(0.001, lambda: self.send_checkpoint(node, core, replica))
            case StoreCheckpointChunk(seq, total, offset, data, starts_over):
                if starts_over:
                    node.staged = bytearray(total)
                node.staged[offset : offset + len(data)] = data
            case InstallCheckpoint(seq):
                records = checkpoint_records(bytes(node.staged))
                assert len(records) == seq and records == self.committed[:seq]
                self.stats["installs"] += 1
                node.log, node.d_log, node.d_base = records, list(records), seq
            case TakeCheckpointFor(seq):
                until = self.now + 0.3
                self.schedule(0.001, lambda: self.take_for(node, core, seq, until))
            case CheckpointTaken(seq):
                records = checkpoint_records(bytes(node.staged))
                assert records == self.committed[:seq], "a checkpoint kept is not committed"
                self.stats["taken"] += 1
            case SteppedDown(epoch, _, better, handed):
                self.step_down(node, core, epoch, None if handed else better)
            case PrimaryLost(epoch, _):
                self.take_over(node, epoch)
            case Recovered():
                self.stats["recovered"] += 1
                node.d_recovering = False
            case RoleHandedOver(epoch, _):
                if self.term[0] == epoch and self.may_lead(node):  # as the registry would
                    self.stats["role-handed"] += 1
                    self.grant(node.rid)

    def read(self, node: Node, core: Core, replica: int, from_seq: int) -> None:
        if node.core is not core or not isinstance(core, Primary):
            return
        count = self.rng.randint(1, 8)
        held = node.log[from_seq : from_seq + count] if from_seq >= node.d_base else []
        core.records_read(replica, from_seq, held, self.now)
        self.drain(node)

    def send_checkpoint(self, node: Node, core: Core, replica: int) -> None:
        if node.core is not core or not isinstance(core, Primary):
            return
        data = checkpoint_bytes(node.log[: node.d_base])
        core.checkpoint_read(replica, node.d_base, data, self.now)
        self.drain(node)

    def take_for(self, node: Node, core: Core, seq: int, until: float) -> None:
        """A secondary's binding takes the state before ``seq`` once it has replayed
        that far (or the request is given up), and it goes back to the primary."""
        if node.core is not core or not isinstance(core, Secondary):
            return
        if core.replayed_end < seq:
            if self.now < until:
                self.schedule(0.002, lambda: self.take_for(node, core, seq, until))
            return
        core.checkpoint_taken(seq, checkpoint_bytes(node.log[:seq]))
        self.drain(node)

    def roll(self, node: Node) -> None:
        core = node.core
        assert isinstance(core, Primary)
        core.rolled(core.log_end, self.now)
        self.drain(node)

    def commit(self, node: Node, end: int) -> None:
        have = len(self.committed)
        assert node.log[: min(end, have)] == self.committed[: min(end, have)], (
            "two records committed at one seq"
        )
        self.committed += node.log[have:end]
        assert len(self.committed) >= end

    def send(self, src: int, dst: int, frame: bytes) -> None:
        """Between two replicas messages keep their order, mostly: a few are held up
        long enough for later ones to pass them, a few arrive twice, some are lost."""
        if (src, dst) in self.blocked or self.rng.random() < self.p_drop:
            return
        for _ in range(2 if self.rng.random() < 0.02 else 1):
            at = self.now + self.rng.uniform(0.0005, 0.004)
            if self.rng.random() < 0.03:
                at += self.rng.uniform(0, 0.12)
            else:
                at = max(at, self.fifo.get((src, dst), 0.0))
                self.fifo[(src, dst)] = at
            self.order += 1
            heapq.heappush(self.net, (at, self.order, src, dst, frame))

    def deliver(self, src: int, dst: int, frame: bytes) -> None:
        node = self.nodes[dst]
        if node.core is None or (src, dst) in self.blocked:
            return
        msg = decode_frame(frame)
        core = node.core
        before = core.state
        core.receive(src, msg, self.now)
        if isinstance(msg, Sync) and core.state is SecondaryState.INSTALLING:
            self.stats["apart"] += before is not SecondaryState.INSTALLING
        self.drain(node)
        if node.core is not core and msg.epoch > core.epoch and node.core is not None:
            node.core.receive(src, msg, self.now)  # what deposed it, to the secondary now
            self.drain(node)

    # --- the registry --------------------------------------------------------------------

    def rank(self, node: Node) -> tuple[int, int]:
        core = node.core
        assert core is not None
        if isinstance(core, Primary):
            return core.history.rank(core.log_end)
        return core.position().rank()

    def may_lead(self, node: Node) -> bool:
        """As the adapter: a replica lost with its disk does not campaign until it has
        caught up (it holds no checkpoint until one is installed, and then recovers); one
        not of the store's group's members never does."""
        return not node.d_recovering and node.rid in self.group.members

    def grant(self, rid: int) -> None:
        """A new term for ``rid``, in the store's group (a term of any other cannot
        begin: the store checks the group in the transaction)."""
        node = self.nodes[rid]
        assert rid in self.group.members
        old = node.core
        assert old is not None
        epoch = self.term[0] + 1
        self.term = (epoch, rid)
        self.stats["terms"] += 1
        node.core = Primary.taking_over(
            old, group=self.group, epoch=epoch, now=self.now, timing=TIMING
        )
        assert old.log_end == len(node.log)
        self.drain(node)
        for other in self.nodes:
            if other.rid != rid and other.up and self.rng.random() < 0.5:
                self.schedule(
                    self.rng.uniform(0, 0.02), lambda o=other, e=epoch: self.follow(o, e, rid)
                )

    def follow(self, node: Node, epoch: int, primary: int) -> None:
        if isinstance(node.core, Secondary):
            node.core.follow(epoch, primary, self.now)
            self.drain(node)

    def take_over(self, node: Node, seen: int) -> None:
        if seen < self.term[0]:
            primary = self.term[1]
            assert primary is not None
            self.follow(node, self.term[0], primary)
            return
        live = [n for n in self.nodes if n.up and self.may_lead(n)]
        if not self.may_lead(node) or not live:
            return
        if self.rng.random() < 0.5:
            chosen = node
        else:
            chosen = max(live, key=lambda n: (self.rank(n), self.rng.random()))
        self.grant(chosen.rid)

    def step_down(self, node: Node, core: Core, epoch: int, better: int | None) -> None:
        assert isinstance(core, Primary)
        self.stats["step-downs"] += 1
        node.core = self.asking(
            Secondary.following(core, epoch=epoch, now=self.now, timing=TIMING, group=core.group)
        )
        if (
            better is not None
            and self.term == (core.epoch, node.rid)
            and self.nodes[better].up
            and self.may_lead(self.nodes[better])
        ):
            self.stats["handed-over"] += 1
            self.grant(better)

    # --- the world -----------------------------------------------------------------------

    def crash_if(self, node: Node, core: Core) -> None:
        if node.core is core:
            self.crash(node)

    def crash(self, node: Node) -> None:
        self.stats["crashes"] += 1
        node.up = False
        node.core = None
        node.log = list(node.d_log)
        node.staged = bytearray()

    def lose(self, node: Node) -> None:
        """The machine is lost with its disk: the replica comes back empty."""
        self.crash(node)
        self.stats["losses"] += 1
        node.log, node.d_log, node.d_base = [], [], 0
        node.d_epoch, node.d_history = 0, History()
        node.d_recovering = True
        if self.term[1] == node.rid:
            # Its term's epoch may be known nowhere else now. The registry's lease runs
            # out and its watchers see the role free: one of them takes it.
            self.schedule(self.rng.uniform(0.05, 0.3), lambda e=self.term[0]: self.lapse(e))

    def recovering(self, rid: int) -> bool:
        """Holds nothing a term may count: lost with its disk, or a new machine."""
        node = self.nodes[rid]
        return node.d_recovering or not node.started

    def may_lose(self, node: Node) -> bool:
        """At most ``k - 1`` of a group's members lost with their disks and not caught
        up (of each part, while it changes)."""
        parts = (self.group, self.group.previous)
        for g in (g for g in parts if g is not None and node.rid in g.replicas):
            if sum(map(self.recovering, g.replicas)) >= g.k - 1:
                return False
        return True

    def change(self) -> None:
        """The operator changes the store's group; the primary steps down (the next
        term, of the new group, begins soon after)."""
        old = self.group
        if old.previous is not None:
            return  # one change at a time: the store refuses another
        members = set(old.replicas)
        outside = [n.rid for n in self.nodes if n.rid not in members]
        what = self.rng.choice(("add", "remove", "replace", "ack"))
        if what in ("add", "replace") and outside:
            members.add(self.rng.choice(outside))
        if what in ("remove", "replace") and len(members) > 1:
            members.discard(self.rng.choice(sorted(members)))
        k = self.rng.choice((None, self.rng.randint(1, len(members))))
        new = old.changed(members, k)
        for rid in new.replicas - old.replicas:
            node = self.nodes[rid]
            if not node.up and node.started and self.rng.random() < 0.5:
                node.started = False  # a new machine this time, not the disk it left with
                node.log, node.d_log, node.d_base = [], [], 0
                node.d_epoch, node.d_history = 0, History()
        # As the command refuses it: a group whose terms could not be established until
        # replicas that cannot catch up without a term have caught up (a new one joins
        # recovering, empty).
        if sum(map(self.recovering, members)) > new.k - 1:
            return
        self.group = new
        self.stats["changes"] += 1
        for rid in self.group.replicas - old.replicas:
            node = self.nodes[rid]
            self.schedule(self.rng.uniform(0.01, 0.2), lambda n=node: n.up or self.restart(n))

    def poll(self) -> None:
        """A primary finds the store's group changed since its term began (its
        periodic read of the store) and resigns: whoever takes the role next (itself
        included) begins a term of the new group."""
        primary = self.nodes[self.term[1]] if self.term[1] is not None else None
        if primary is None or not isinstance(primary.core, Primary):
            return
        group = primary.core.group
        if group != self.group and group.settled != self.group:
            self.stats["resigned"] += 1
            self.lapse(self.term[0])

    def settle(self, core: Primary, end: int) -> None:
        """The primary of a changing group's term, once it has committed its start,
        settles the change (if its term is still the current one); the replicas that
        left stop."""
        group = core.group
        if (
            group.previous is None
            or end < core.term_start
            or self.term[0] != core.epoch
            or self.group != group
        ):
            return
        self.group = group.settled
        self.stats["settled"] += 1
        for node in self.nodes:
            if node.up and node.rid not in self.group.replicas:
                self.crash(node)
        if core.replica not in self.group.replicas:
            # It resigned as it stopped: the role is free, and a watcher campaigns.
            self.stats["left-primary"] += 1
            self.schedule(self.rng.uniform(0.01, 0.1), lambda e=core.epoch: self.lapse(e))

    def lapse(self, epoch: int) -> None:
        live = [n for n in self.nodes if n.up and self.may_lead(n)]
        if self.term[0] == epoch and live:
            self.stats["lapses"] += 1
            self.grant(self.rng.choice(live).rid)

    def restart(self, node: Node) -> None:
        if not node.started:  # a new machine, once the instance was founded
            node.started, node.d_recovering = True, True
        node.up = True
        node.core = self.fresh_secondary(node)
        self.drain(node)

    def fsync(self, node: Node) -> None:
        assert node.core is not None
        node.d_log = list(node.log)
        node.core.records_durable(len(node.log))
        self.drain(node)

    def client(self, node: Node) -> None:
        core = node.core
        assert isinstance(core, Primary)
        records = []
        for i in range(self.rng.randint(1, 3)):
            seq = core.log_end + i
            record = encode_disk_record(7, seq, f"{core.epoch}/{seq}/{self.order}".encode())
            self.writer[record] = core.epoch
            records.append(record)
        node.log += records
        core.append(records, self.now)
        self.drain(node)

    def prune(self, node: Node) -> None:
        """A checkpoint taken of what is committed and replayed; the log before it goes."""
        core = node.core
        assert core is not None
        done = core.commit_end if isinstance(core, Primary) else core.replayed_end
        if done > node.d_base:
            base = self.rng.randint(node.d_base + 1, done)
            node.d_base = base
            if len(node.d_log) < base:  # the checkpoint holds them durably now
                node.d_log = node.log[:base]
            core.log_pruned(base)

    def partition(self) -> None:
        n = len(self.nodes)
        cut = self.rng.sample(range(n), self.rng.randint(1, n // 2))
        one_way = self.rng.random() < 0.3
        self.blocked = set()
        for a in cut:
            for b in set(range(n)) - set(cut):
                self.blocked.add((a, b))
                if not one_way:
                    self.blocked.add((b, a))
        self.heal_at = self.now + self.rng.uniform(0.05, 0.8)
        self.stats["partitions"] += 1

    def step(self, chaos: bool) -> None:
        self.now += self.rng.uniform(0.001, 0.012)
        if self.rng.random() < 0.2:
            self.poll()
        if self.blocked and self.now >= self.heal_at:
            self.blocked = set()
        while self.net and self.net[0][0] <= self.now:
            _, _, src, dst, frame = heapq.heappop(self.net)
            self.deliver(src, dst, frame)
        while self.later and self.later[0][0] <= self.now:
            heapq.heappop(self.later)[2]()
        for node in self.nodes:
            if node.up:
                assert node.core is not None
                node.core.tick(self.now)
                self.drain(node)
                if self.rng.random() < (0.3 if chaos else 1.0):
                    self.fsync(node)
        primary = self.nodes[self.term[1]] if self.term[1] is not None else None
        if (
            primary is not None
            and isinstance(primary.core, Primary)
            and primary.core.state.name == "ESTABLISHED"
            and self.rng.random() < (0.5 if chaos else 0.05)
        ):
            self.client(primary)
            if self.rng.random() < 0.05:
                self.roll(primary)
        if not chaos:
            for node in self.nodes:
                if not node.up and node.rid in self.group.members:
                    self.restart(node)
            return
        if self.rng.random() < self.p_change:
            self.change()
        for node in self.nodes:
            if node.up and self.may_lose(node) and self.rng.random() < self.p_lose:
                self.lose(node)
            elif node.up and self.rng.random() < self.p_crash:
                self.crash(node)
            elif not node.up and node.rid in self.group.members and self.rng.random() < 0.02:
                self.restart(node)
            elif node.up and self.rng.random() < 0.01:
                self.prune(node)
        if not self.blocked and self.rng.random() < self.p_partition:
            self.partition()
        live = [n for n in self.nodes if n.up and self.may_lead(n)]
        if live and self.rng.random() < 0.003:  # the lease lapses: a live primary's taken
            self.stats["lapses"] += 1
            self.grant(self.rng.choice(live).rid)

    # --- a run ---------------------------------------------------------------------------

    def run(self, steps: int = 400, settle: float = 6.0) -> None:
        for i in range(steps):
            self.step(chaos=True)
            self.check()
            if i % 40 == 0:
                self.check_histories()
        self.blocked = set()
        self.p_drop = 0.0
        self.chaos = False
        deadline = self.now + settle
        while not self.converged():
            assert self.now < deadline, f"seed {self.seed}: no convergence once healed"
            self.step(chaos=False)
            self.check()
        self.check_histories()


ALL_PATHS = ("truncations", "installs", "step-downs", "deposed-checked")
LOSSES = ("losses", "recovered")  # machines lost with their disks, and caught up again


CHANGES = ("changes", "settled", "resigned", "recovered")


@pytest.mark.parametrize(
    ("n", "k", "runs", "paths", "changes"),
    [
        (3, None, 1000, (*ALL_PATHS, *LOSSES, "role-handed", "compacted", "apart"), False),
        (5, None, 400, (*ALL_PATHS, *LOSSES, "role-handed", "compacted", "apart"), False),
        (5, 2, 200, ("installs", "step-downs", *LOSSES), False),  # a term needs 4 of 5
        (5, 4, 200, (*ALL_PATHS, *LOSSES), False),  # a term needs 2 of 5
        (3, 1, 200, ("installs", "step-downs"), False),  # every replica's position is needed
        # the group changes: members added, removed and replaced, the ack changed
        (3, None, 400, (*ALL_PATHS, *CHANGES), True),
        (5, None, 200, (*ALL_PATHS, *CHANGES), True),
    ],
)
def test_random_runs_keep_the_invariants(
    n: int, k: int | None, runs: int, paths: tuple[str, ...], changes: bool
) -> None:
    totals: Counter[str] = Counter()
    for seed in range(runs):
        sim = Sim(seed, n, k, changes=changes)
        try:
            sim.run()
        except Exception as exc:
            raise AssertionError(
                f"Sim({seed}, {n}, {k}, changes={changes}).run(): {exc!r}"
            ) from exc
        totals += sim.stats
    # The runs went down every path the invariants are about.
    for what in ("crashes", "partitions", "lapses", "refusals", "taken", *paths):
        assert totals[what] > 0, (what, totals)
    assert totals["terms"] > runs
