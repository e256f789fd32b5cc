"""What the replication simulation (``tests/test_replication_sim.py``) checks of its
replicas after every step: the package's invariants (I1, I2, I4 to I6 of
``coordinator/replication/__init__.py``), and, once healed, convergence. A part of the
simulation, apart by concern; its state is the simulation's."""

from __future__ import annotations

from collections import Counter

from ambrosia_py.coordinator.replication import EpochStart, Group, History, Primary, Secondary

Core = Primary | Secondary


class Node:
    """A replica: its core, and what its disk and memory hold."""

    def __init__(self, rid: int, *, up: bool = True) -> None:
        self.rid = rid
        self.up = up
        self.core: Core | None = None
        self.log: list[bytes] = []  # written, from seq 0 (below base: the checkpoint's)
        self.d_log: list[bytes] = []  # durable
        self.d_base = 0
        self.d_epoch = 0
        self.d_history = History()
        self.staged = bytearray()
        self.seen: tuple[object, int, int] | None = None  # (core, commit, replayed)
        self.d_recovering = False  # saved: lost with its disk, not caught up since
        self.started = up  # ever started: one never started joins empty


class Invariants:
    """The checks; the state is the simulation's."""

    nodes: list[Node]
    group: Group  # the store's
    committed: list[bytes]
    writer: dict[bytes, int]
    acks: dict[int, dict[int, int]]
    frozen: dict[int, tuple[int, int]]
    stats: Counter[str]
    term: tuple[int, int | None]

    def check(self) -> None:
        g = len(self.committed)
        group = self.group
        if group.previous is None:
            # Every committed record is durable on k members (a settled change made it
            # so), but for those lost with their disks and not caught up since.
            members = [n for n in self.nodes if n.rid in group.replicas]
            lost = sum(n.d_recovering for n in members)
            holders = sum(n.d_log[:g] == self.committed for n in members)
            assert holders >= group.k - lost, "a committed record is durable on fewer than k"
        for node in self.nodes:
            core = node.core
            if core is None:
                continue
            upto = min(core.commit_end, len(node.log))
            assert upto <= g and node.log[:upto] == self.committed[:upto], (
                f"replica {node.rid}'s committed prefix is not the committed log"
            )
            replayed = core.replayed_end if isinstance(core, Secondary) else core.commit_end
            if node.seen is not None and node.seen[0] is core:
                assert core.commit_end >= node.seen[1], "a commit point went backward"
                assert replayed >= node.seen[2], "a replay point went backward"
            node.seen = (core, core.commit_end, replayed)
            if isinstance(core, Primary) and core.state.name != "DEPOSED":
                self.check_deposed(core)

    def check_deposed(self, core: Primary) -> None:
        """I6: once replicas holding a higher epoch meet every set of ``k`` of the term's
        members (the set it commits on), the old primary's commit point moves no further
        than what one of them acknowledged before."""
        epoch = core.epoch
        if epoch not in self.frozen:
            higher = {n.rid for n in self.nodes if n.d_epoch > epoch}
            members = core.group.replicas
            if len(higher & members) < core.group.term_quorum:
                return
            acked = self.acks.get(epoch, {})
            bound = max((acked.get(r, 0) for r in higher & members if r != core.replica), default=0)
            self.frozen[epoch] = (bound, core.commit_end)
            self.stats["deposed-checked"] += 1
        bound, then = self.frozen[epoch]
        assert core.commit_end <= max(bound, then), "a deposed primary advanced its commit"

    def check_histories(self) -> None:
        """I1 and I2: each record's epoch, by its log's history, is its writer's (from
        the history's first entry on: it is compacted below a checkpoint); every two
        histories holding an epoch hold the same entries up to it, from the later of
        their first entries on."""
        held: list[tuple[EpochStart, ...]] = []
        for node in self.nodes:
            if node.core is None:
                continue
            history = node.core.history
            first = history.entries[0].start if history.entries else 0
            # Every record of its log above its checkpoint is in its history's reach.
            core = node.core
            assert first <= core.log_base or core.log_end == core.log_base, (node.rid, first)
            for seq, record in enumerate(node.log):
                if seq >= first:
                    assert history.epoch_at(seq) == self.writer[record], (node.rid, seq)
            held.append(history.entries)
            self.stats["compacted"] += bool(history.entries) and history.entries[0].epoch > 1
        for a in held:
            for b in held:
                for i, entry in enumerate(a):
                    j = next((j for j, e in enumerate(b) if e.epoch == entry.epoch), None)
                    if j is None:
                        continue
                    lo = max(a[0].epoch, b[0].epoch)
                    mine = [e for e in a[: i + 1] if e.epoch >= lo]
                    theirs = [e for e in b[: j + 1] if e.epoch >= lo]
                    assert mine == theirs, "histories fork"

    def converged(self) -> bool:
        """One established primary of the store's group, settled; every member's log
        equal to its log, all of it committed and replayed."""
        primary = self.nodes[self.term[1]] if self.term[1] is not None else None
        if primary is None or not isinstance(primary.core, Primary):
            return False
        core = primary.core
        if core.state.name != "ESTABLISHED" or core.commit_end != len(primary.log):
            return False
        if self.group.previous is not None or core.group.replicas != self.group.replicas:
            return False
        return all(
            n.log == primary.log
            and isinstance(n.core, Secondary)
            and n.core.replayed_end == len(n.log)
            for n in self.nodes
            if n is not primary and n.rid in self.group.replicas
        )
