"""The errors of the replicated log: malformed frames, and broken rules.

:class:`ReplicationProtocolError` is a :class:`~ambrosia_py.wire.errors.ProtocolError`:
bytes from a replica that do not decode, named by field and offset. The connection they
came on is closed. :class:`ReplicationRuleError` is a well-formed message (or a call of
the adapter) that breaks a rule the package's invariants rest on (two primaries in one
epoch, a truncation below the commit point, histories that disagree before a shared
epoch): it means a bug or a corrupt data dir, never a network fault, and the replica
stops rather than carry on with a log it cannot trust. :class:`GroupMismatchError`: a
replica started with another group (``--replicas``, ``--replication-ack``) than its
primary's; it stops, saying so.
"""

from __future__ import annotations

from ...wire.errors import ProtocolError

__all__ = [
    "GroupMismatchError",
    "ReplicationError",
    "ReplicationProtocolError",
    "ReplicationRuleError",
]


class ReplicationError(Exception):
    """Anything the replicated log refuses."""


class ReplicationProtocolError(ProtocolError, ReplicationError):
    """A replication frame that does not decode: what was wrong and at which offset."""


class ReplicationRuleError(ReplicationError):
    """A message or a call that breaks one of the replicated log's rules."""


class GroupMismatchError(ReplicationError):
    """This replica runs another group (replicas, ack) than its primary's."""
