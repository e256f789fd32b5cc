"""Recovery's replay: every logged record from a checkpoint's log on, verified, to the binding.

Shared by the coordinator's recovery and ``ambrosia-py debug``. A torn tail of the last
log is cut (recovery) or only reported (debug); damage before it stops with
:class:`~ambrosia_py.coordinator.storage.CorruptLogError`. While replaying it counts the
binding's replayable outputs and the link senders' watermarks, which the coordinator
needs to de-duplicate what the binding regenerates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs

from .. import accel, wire
from .binding_link import BindingLink
from .ic_core import IcState
from .routing import count_replayable
from .storage import CorruptLogError, InstanceFiles

__all__ = ["Replayed", "replay_log"]

log = logging.getLogger("ambrosia_py.coordinator")


def _replayable(record: wire.Payload) -> int:
    """How many of a record's messages (in wire form) are replayable (not impulses)."""
    body = memoryview(record)[wire.HEADER_SIZE :]
    n = count_replayable(body)  # forks and impulses, the common case, without decoding
    return _count_replayable(wire.decode_messages(body, 0, len(body))) if n is None else n


def _count_replayable(messages: Iterable[wire.Message]) -> int:
    """Batches (types 5 and 13, as the released coordinator logs them) count by the calls
    in them: a batch is not a call, but what it carries is (tests/test_disk_vectors.py)."""
    n = 0
    for m in messages:
        if isinstance(m, wire.RpcBatch | wire.CountReplayableRpcBatch):
            n += _count_replayable(m.messages)
        elif isinstance(m, wire.IncomingReturnValue) or (
            isinstance(m, wire.IncomingRpc) and m.rpc_type != wire.RpcType.IMPULSE
        ):
            n += 1
    return n


# The C accelerator's wire form of an on-disk record (its first ``length`` raw bytes, the
# length field made positive): the same bytes as ``wire.disk_to_wire``, in one copy.
_crecords = accel.load("ambrosia_py.wire._crecords")


def _wire_form(raw: wire.RawRecord) -> bytes:
    """The wire form of an on-disk record (the pure-Python twin of the loop's fast path)."""
    return wire.disk_to_wire(raw.header, raw.body)


def _link_marks(raw: wire.RawRecord) -> dict[str, int]:
    """Per link sender, the seq after its last message in this record (the watermarks)."""
    if raw.tail is None:
        return {}
    return {w.name: w.last_seq + 1 for w in raw.tail.watermarks}


# Replayed records go to the binding in batches of up to this many records or bytes:
# a send per record cost a tenth of the coordinator's replay time.
_BATCH_RECORDS = 256
_BATCH_BYTES = 1 << 20
_JOIN_BELOW = 4096  # a batch whose records average fewer bytes goes as one joined buffer


async def _send(binding: BindingLink, batch: list[wire.Payload], size: int) -> None:
    """One send of a batch of records: small ones joined (one buffer to the socket
    rather than one each, for the cost of copying a few bytes), large ones as they are."""
    await binding.send([b"".join(batch)] if size < _JOIN_BELOW * len(batch) else batch)


@attrs.frozen
class Replayed:
    next_seq: int
    last_log: int
    outputs: int  # replayable outputs of the binding in the replayed records
    inbox: dict[str, int]  # per link sender, the seq after its last logged message


async def replay_log(
    files: InstanceFiles,
    binding: BindingLink,
    state: IcState,
    first_log: int,
    *,
    repair: bool,
) -> Replayed:
    """Send every logged record from ``first_log`` on, verified, in wire form."""
    logs = [n for n in files.log_numbers() if n >= first_log]
    next_seq = state.next_seq
    replayed = outputs = 0
    inbox = dict(state.inbox)
    to_wire = None if _crecords is None else _crecords.disk_to_wire
    for n in logs:
        scan = files.scan_log(
            n, committer_id=state.committer_id, next_seq=next_seq, last=n == logs[-1], repair=repair
        )
        batch: list[wire.Payload] = []  # records sent together: one send per batch
        batched = 0
        try:
            for raws in scan.batches():
                for raw in raws:
                    if to_wire is None:
                        record = _wire_form(raw)
                    else:
                        record = to_wire(raw.raw, raw.header.length)
                    batch.append(record)
                    batched += len(record)
                    if len(batch) >= _BATCH_RECORDS or batched >= _BATCH_BYTES:
                        await _send(binding, batch, batched)
                        batch, batched = [], 0
                    # Messages from other instances' links are replayable too, but not the
                    # binding's outputs: the watermarks say how many of them the record
                    # holds.
                    tail = raw.tail
                    if tail is not None and tail.watermarks:  # none: nothing from links
                        marks = _link_marks(raw)
                        from_links = sum(seq - inbox.get(name, 0) for name, seq in marks.items())
                        inbox.update(marks)
                        outputs -= from_links
                    outputs += _replayable(record)
                replayed += len(raws)
        except CorruptLogError:
            if batch:  # the verified records before the damage still go, as one by one
                await _send(binding, batch, batched)
            raise
        if batch:
            await _send(binding, batch, batched)
        if scan.next_seq is not None:
            next_seq = scan.next_seq
        if scan.damage is not None:
            d = scan.damage
            verb = "cut" if repair else "found"
            log.warning(
                "%s a torn tail of %s: %d bytes at offset %d (%s)%s",
                verb,
                d.path.name,
                d.dropped_bytes,
                d.offset,
                d.reason,
                "" if d.kept is None else f"; the cut bytes are kept in {d.kept}",
            )
    log.info("replayed %d records from logs %s; next seq %d", replayed, logs, next_seq)
    return Replayed(next_seq, logs[-1] if logs else first_log, outputs, inbox)
