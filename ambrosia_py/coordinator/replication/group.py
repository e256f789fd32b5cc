"""Who an instance's replicas are, and how many make a record committed, sans-IO.

A :class:`Group` is the registered replicas of an instance and the replication ack
``k``: a record is committed once durable on ``k`` of them, the primary among them
(default: a majority). A new primary needs positions from ``term_quorum`` of them,
itself counted: ``n - k + 1``, so that every such quorum meets every set of ``k``.

The group is kept in the registry's store, which numbers each group it holds
(``version``); a term runs in the group the store held when the term began. A change
of members or ack goes in two steps, as Raft's joint consensus does:

- the store's group becomes the new one with the old as its ``previous``: a term of
  that group needs positions from a quorum of *each* (the old quorum meets every
  record committed in the old group, the new one every record an earlier term of the
  new group committed), and commits on ``k`` of the new members;
- once such a term has committed its start, every committed record is durable on ``k``
  of the new members, and its primary *settles* the change: the store's group becomes
  the new one alone, and later terms count the new members only.

A term whose group is not the store's current one cannot begin (the store checks the
group's version in the transaction that begins a term), so no term counts an old group
alone once a change is under way.
"""

from __future__ import annotations

from collections.abc import Collection

import attrs

__all__ = ["MAX_REPLICAS", "MAX_REPLICA_NUMBER", "Group"]

MAX_REPLICAS = 255
"""Members of one group, at most."""
MAX_REPLICA_NUMBER = 2**31 - 1


@attrs.frozen
class Group:
    """See the module. ``previous`` is the group a change under way comes from (it has
    no previous of its own)."""

    replicas: frozenset[int]
    k: int
    version: int = 0
    previous: Group | None = None

    @classmethod
    def of(
        cls,
        replicas: Collection[int],
        k: int | None = None,
        *,
        version: int = 0,
        previous: Group | None = None,
    ) -> Group:
        members = frozenset(replicas)
        if not members:
            raise ValueError("a replica group needs at least one replica")
        if len(members) > MAX_REPLICAS:
            raise ValueError(f"a replica group of {len(members)}, over {MAX_REPLICAS}")
        if any(not 0 <= r <= MAX_REPLICA_NUMBER for r in members):
            raise ValueError(f"replica numbers are 0 to {MAX_REPLICA_NUMBER}: {sorted(members)}")
        chosen = len(members) // 2 + 1 if k is None else k
        if not 1 <= chosen <= len(members):
            raise ValueError(f"replication ack {chosen} is not in 1..{len(members)}")
        if version < 0:
            raise ValueError(f"group version {version} is below 0")
        if previous is not None and previous.previous is not None:
            raise ValueError("a group changing from a group that was changing")
        return cls(members, chosen, version, previous)

    @property
    def n(self) -> int:
        return len(self.replicas)

    @property
    def term_quorum(self) -> int:
        return self.n - self.k + 1

    @property
    def members(self) -> frozenset[int]:
        """Every replica a term of this group talks to: the new members and, while a
        change is under way, the old ones."""
        if self.previous is None:
            return self.replicas
        return self.replicas | self.previous.replicas

    def changed(self, replicas: Collection[int], k: int | None = None) -> Group:
        """The store's next group: ``replicas`` committing on ``k`` (default: a
        majority), changing from this one, settled (the one it changes from is said by
        members and ack only, as messages carry it)."""
        if self.previous is not None:
            raise ValueError(f"a change is under way already: {self.describe()}")
        return Group.of(
            replicas, k, version=self.version + 1, previous=Group(self.replicas, self.k)
        )

    @property
    def settled(self) -> Group:
        """The group once its change is settled: the new members alone."""
        return Group(self.replicas, self.k, self.version + 1) if self.previous else self

    def _parts(self) -> tuple[Group, ...]:
        return (self,) if self.previous is None else (self, self.previous)

    def term_met(self, holders: Collection[int]) -> bool:
        """Whether positions from ``holders`` are enough for a term: a quorum of each
        part."""
        held = frozenset(holders)
        return all(len(held & g.replicas) >= g.term_quorum for g in self._parts())

    def term_lost(self, ahead: Collection[int]) -> bool:
        """Whether, with ``ahead`` out of the count, no term can be met any more."""
        out = frozenset(ahead)
        return any(len(out & g.replicas) > g.n - g.term_quorum for g in self._parts())

    def describe(self) -> str:
        """In words, for messages: members and ack, and the change under way."""
        now = f"replicas {_numbers(self.replicas)} committing on {self.k}"
        if self.previous is None:
            return now
        return f"{now} (changing from {self.previous.describe()})"


def _numbers(replicas: frozenset[int]) -> str:
    return ",".join(map(str, sorted(replicas)))
