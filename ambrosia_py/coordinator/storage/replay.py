"""Recovery's replay: every logged record from a checkpoint's log on, verified, to the binding.

Shared by the coordinator's recovery and ``ambrosia-py debug``. A torn tail of the last
log is cut (recovery) or only reported (debug); damage before it stops with
:class:`~ambrosia_py.coordinator.storage.files.CorruptLogError`. While replaying it counts the
binding's replayable outputs and the link senders' watermarks, which the coordinator
needs to de-duplicate what the binding regenerates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import attrs

from ... import accel, wire
from ..core.binding_link import BindingLink
from ..core.checkpoint import IcState
from ..core.routing import count_replayable
from .files import InstanceFiles

__all__ = ["Replayed", "replay_forms", "replay_log"]

log = logging.getLogger("ambrosia_py.coordinator")


def _replayable(record: wire.Payload) -> int:
    """How many of a record's messages (in wire form) are replayable (not impulses)."""
    n = count_replayable(record, wire.HEADER_SIZE)  # forks and impulses, without decoding
    if n is None:
        body = memoryview(record)[wire.HEADER_SIZE :]
        return _count_replayable(wire.decode_messages(body, 0, len(body)))
    return n


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


async def _send(binding: BindingLink, forms: list[bytes]) -> None:
    """One send of a run of records (a send per record cost a tenth of replay's time):
    small records joined, large ones as they are (``wire.coalesce_parts``)."""
    await binding.send(wire.coalesce_parts(forms))


def replay_forms(raws: list[wire.RawRecord], inbox: dict[str, int]) -> tuple[list[bytes], int]:
    """The wire forms of a run of on-disk records, to send to the binding, and how many
    of the binding's own replayable outputs they hold; ``inbox`` (per link sender, the
    seq after its last logged message) is moved past the records' watermarks.

    Messages from other instances' links are replayable too, but not the binding's
    outputs: the watermarks say how many of them the records hold.
    """
    if _crecords is None:
        forms = [_wire_form(raw) for raw in raws]
    else:
        to_wire = _crecords.disk_to_wire
        forms = [to_wire(raw.raw, raw.header.length) for raw in raws]
    outputs = 0
    for raw in raws:
        tail = raw.tail
        if tail is not None and tail.watermarks:  # none: nothing from links
            marks = _link_marks(raw)
            outputs -= sum(seq - inbox.get(name, 0) for name, seq in marks.items())
            inbox.update(marks)
    outputs += sum(map(_replayable, forms))
    return forms, outputs


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
    for n in logs:
        scan = files.scan_log(
            n, committer_id=state.committer_id, next_seq=next_seq, last=n == logs[-1], repair=repair
        )
        for raws in scan.batches():
            # A run of records, up to the reader's batch, goes to the binding in one send
            # (damage raises CorruptLogError after the verified records before it went).
            forms, binding_outputs = replay_forms(raws, inbox)
            await _send(binding, forms)
            outputs += binding_outputs
            replayed += len(raws)
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
