"""What the primary keeps of each secondary it feeds, and the records it ships: checked
to be on-disk records in order, cut into APPENDs of a bounded size."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence

from ...wire.errors import ProtocolError
from ...wire.records import parse_header
from .errors import ReplicationRuleError
from .messages import Buffer, Position, append_size
from .states import FeedState

__all__ = ["Feed", "batches", "record_seqs"]


class Feed:
    """What the primary knows of one secondary."""

    __slots__ = (
        "checkpoint_sent",
        "inflight_bytes",
        "last_sent",
        "match",
        "position",
        "reading",
        "sent_end",
        "state",
        "unacked",
    )

    def __init__(self, now: float) -> None:
        self.state = FeedState.UNKNOWN
        self.position: Position | None = None
        self.match = 0  # acknowledged durable in this epoch
        self.sent_end = 0  # the next seq to send it
        self.reading = False  # a ReadLog for it is out
        self.last_sent = now
        self.checkpoint_sent: float | None = None  # when the last transfer went out
        # The APPENDs sent and not yet acknowledged: (the seq after their records, their
        # bytes), in order; and those bytes summed.
        self.unacked: deque[tuple[int, int]] = deque()
        self.inflight_bytes = 0

    def sent(self, end: int, size: int) -> None:
        """An APPEND of ``size`` bytes, its records ending before ``end``, went out (one
        of records acknowledged already, sent again, is not waited for)."""
        if end > self.match:
            self.unacked.append((end, size))
            self.inflight_bytes += size

    def settle(self, acked: int, lost_from: int | None = None) -> None:
        """What is acknowledged below ``acked`` is no longer in flight; nor, with
        ``lost_from``, what was sent from there on (the replica asks for it again)."""
        unacked = self.unacked
        while unacked and unacked[0][0] <= acked:
            self.inflight_bytes -= unacked.popleft()[1]
        if lost_from is not None:
            while unacked and unacked[-1][0] > lost_from:
                self.inflight_bytes -= unacked.pop()[1]


def record_seqs(records: Sequence[Buffer], first_seq: int) -> None:
    """Check that ``records`` are on-disk records numbered ``first_seq`` on."""
    for i, record in enumerate(records):
        try:
            seq = parse_header(record, 0, on_disk=True).seq
        except ProtocolError as exc:
            raise ReplicationRuleError(f"record {i} of a batch: {exc}") from None
        if seq != first_seq + i:
            raise ReplicationRuleError(f"record {i} of a batch has seq {seq}, not {first_seq + i}")


def batches(records: Sequence[Buffer], limit: int) -> Iterator[tuple[int, Sequence[Buffer]]]:
    """``records`` cut into runs of at most ``limit`` bytes (a larger record alone):
    ``(index of the first, run)``."""
    start = 0
    while start < len(records):
        stop = start + 1
        size = append_size(records[start:stop])
        while stop < len(records) and size + append_size(records[stop : stop + 1]) <= limit:
            size += append_size(records[stop : stop + 1])
            stop += 1
        yield start, records[start:stop]
        start = stop
