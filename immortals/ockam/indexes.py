"""The index service's records and what a saved index means, in both dialects; sans-IO.

Seed 003 (*Addition: index management and reliable delivery*) keeps an index per
consumer and stream (and partition, *Partitioned stream index*) for clients that would
rather not keep it themselves. The seed and the released Ockam code agree that saves are
monotonic and that a save has no reply, and disagree on two things (``shared/reference/ockam.md``,
*Semantics of the released service*):

- a Get for a pair never saved: the seed creates a record at 0 and answers 0
  (:attr:`~immortals.ockam.codec.Dialect.SEED`); the released service answers ``none``
  and creates nothing;
- what a client saves and reads back: the seed's is the last index it processed, the
  released one's the next index to read.

A record holds one number in both dialects: the next index to read, one past the last
processed (as the released code stores it, and as checkpoints written before the
dialects hold it). The seed dialect reads it as ``next - 1`` and saves ``L`` as ``L + 1``;
so each dialect reads back exactly what its clients saved, a record written under one
dialect means the same under the other, and old checkpoints load unchanged. The one thing
the seed's number cannot say is whether message 0 was processed: its new record holds 0,
and so does a client that processed message 0 alone (``next`` 0 and 1 both read as 0).

Everything here is a function of the records and the logged request, so replay answers
and creates exactly the same.
"""

from __future__ import annotations

from typing import TypeAlias

from .bare import MAX_UINT
from .codec import (
    Dialect,
    GetIndex,
    GetPartitionIndex,
    Index,
    PartitionIndex,
    SaveIndex,
    SavePartitionIndex,
)

__all__ = ["IndexRequest", "Key", "Records", "answer", "read", "save"]

Key: TypeAlias = tuple[str, str, int]
"""(client id, stream name, partition); a plain index is partition 0's."""

Records: TypeAlias = dict[Key, int]
"""Per key, the next index to read (see the module docstring)."""

IndexRequest: TypeAlias = GetIndex | SaveIndex | GetPartitionIndex | SavePartitionIndex


def read(records: Records, key: Key, dialect: Dialect) -> int | None:
    """What a Get for ``key`` answers in ``dialect``; the seed's may create the record."""
    next_index = records.get(key)
    if dialect is Dialect.SEED:
        if next_index is None:
            # Seed 003, *Creating/retrieving a stream index*: "If the client did not have
            # an index saved before, a new record MUST be created with an index 0".
            records[key] = 0
            return 0
        return max(next_index - 1, 0)
    # Released: none for a pair never saved. A seed save of MAX_UINT keeps 2**64, which
    # the released view cannot carry; it reads as the largest uint.
    return None if next_index is None else min(next_index, MAX_UINT)


def save(records: Records, key: Key, index: int, dialect: Dialect) -> None:
    """Apply a Save of ``index`` for ``key`` in ``dialect``: monotonic, so a lower one
    leaves the record as it was (seed 003, *Updating an index*: "Index storage MUST be
    monotonic")."""
    next_index = index + 1 if dialect is Dialect.SEED else index
    if next_index > records.get(key, -1):
        records[key] = next_index


def answer(
    records: Records, request: IndexRequest, dialect: Dialect
) -> Index | PartitionIndex | None:
    """Apply one index request to ``records``; its reply, or None for a save (the seed
    gives a save no reply, and neither does the released service)."""
    if isinstance(request, GetIndex):
        key = (request.client_id, request.stream_name, 0)
        return Index(request.client_id, request.stream_name, read(records, key, dialect))
    if isinstance(request, GetPartitionIndex):
        key = (request.client_id, request.stream_name, request.partition)
        value = read(records, key, dialect)
        return PartitionIndex(request.client_id, request.stream_name, request.partition, value)
    partition = request.partition if isinstance(request, SavePartitionIndex) else 0
    save(records, (request.client_id, request.stream_name, partition), request.index, dialect)
    return None
