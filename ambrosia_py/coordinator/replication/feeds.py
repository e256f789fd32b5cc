"""What the primary keeps of each secondary it feeds, and the records it ships: checked
to be on-disk records in order, cut into APPENDs of a bounded size."""

from __future__ import annotations

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
        "last_sent",
        "match",
        "position",
        "reading",
        "sent_end",
        "state",
    )

    def __init__(self, now: float) -> None:
        self.state = FeedState.UNKNOWN
        self.position: Position | None = None
        self.match = 0  # acknowledged durable in this epoch
        self.sent_end = 0  # the next seq to send it
        self.reading = False  # a ReadLog for it is out
        self.last_sent = now
        self.checkpoint_sent: float | None = None  # when the last transfer went out


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
