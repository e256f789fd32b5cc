"""Replaying recorded history offline, and finding where it stops being deterministic.

``ambrosia-py replay`` restores a checkpoint of an instance and runs its logged records
through the service's code, exactly as recovery would, writing nothing. With
``verify=True`` it runs *two* replays in lockstep from every checkpoint and compares
them after each message: the state (attribute by attribute) and the outputs (calls,
forks, return values). A handler that reads the clock, draws a random number or depends
on anything but its logged input makes the two runs differ at that very message, and
the report names the record, its method and what differed. At the end of each interval
the recomputed state is also compared with the next recorded checkpoint, which catches
a divergence between the live run and the replay.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import cloudpickle

from .. import wire
from ..coordinator.ic_core import IcState
from ..coordinator.registry import REGISTRY_FILE, RegistryError
from ..coordinator.registry_files import instance_directories, open_registry_for_start
from ..coordinator.storage import InstanceFiles
from ..ingress.envelope import INGRESS_METHOD_ID, RetentionEnvelope, decode_envelope
from ..ingress.errors import IngressProtocolError
from ..ingress.keys import describe_key
from ..wire import IncomingReturnValue, IncomingRpc, LogRecord
from .checkpoint import decode_snapshot
from .dispatcher import Dispatcher
from .errors import BindingError
from .files import StateFiles, state_files_dir, use_state_files
from .immortal import Immortal

__all__ = ["Divergence", "ReplayResult", "replay_instance"]


@attrs.frozen
class Divergence:
    """The first message at which replay was not deterministic."""

    seq: int
    method: str
    what: str  # "state" or "outputs" or "checkpoint"
    details: str

    def __str__(self) -> str:
        return f"record {self.seq}, method {self.method}: {self.what} differs: {self.details}"


@attrs.frozen
class ReplayResult:
    checkpoint: int
    records: int
    messages: int
    last_seq: int | None
    state: dict[str, Any]
    divergence: Divergence | None = None


def _instance_files(data_dir: Path, instance: str) -> InstanceFiles:
    """The instance's files, by its registry entry; a missing or damaged registry is a
    clear error (the same refusal as ``run``'s), and replay never creates one."""
    if not (Path(data_dir) / REGISTRY_FILE).exists() and not instance_directories(data_dir):
        raise BindingError(f"no instance {instance!r} in {data_dir}: it has no registry")
    try:
        registry = open_registry_for_start(data_dir, instance)
    except RegistryError as exc:
        raise BindingError(str(exc)) from None
    try:
        info = registry.get(instance)
    finally:
        registry.close()
    if info is None:
        raise BindingError(f"no instance {instance!r} in {data_dir}")
    return InstanceFiles(data_dir, instance, info.current_version)


def _records(
    files: InstanceFiles, first_log: int, state: IcState, to_seq: int | None
) -> Iterator[LogRecord]:
    """Logged records from ``first_log`` on, one message per record, up to ``to_seq``."""
    logs = [n for n in files.log_numbers() if n >= first_log]
    next_seq = state.next_seq
    for n in logs:
        scan = files.scan_log(
            n, committer_id=state.committer_id, next_seq=next_seq, last=n == logs[-1], repair=False
        )
        for raw in scan:
            if to_seq is not None and raw.seq > to_seq:
                return
            for msg in wire.decode_messages(raw.body, 0, len(raw.body)):
                yield LogRecord(raw.header.committer_id, raw.seq, (msg,))
        if scan.next_seq is not None:
            next_seq = scan.next_seq


def _method(service: type[Immortal], record: LogRecord) -> str:
    (msg,) = record.messages
    if isinstance(msg, IncomingRpc):
        if msg.method_id == INGRESS_METHOD_ID:  # the method is in the logged envelope
            try:
                call = decode_envelope(msg.args)
            except IngressProtocolError:
                return "(a malformed ingress call)"
            if isinstance(call, RetentionEnvelope):
                return "(ingress retention setting)"
            spec = service.rpc_methods().get(call.method_id)
            name = spec.name if spec else f"#{call.method_id}"
            return f"{name} (ingress call, key {describe_key(call.key)})"
        spec = service.rpc_methods().get(msg.method_id)
        return spec.name if spec else f"#{msg.method_id}"
    if isinstance(msg, IncomingReturnValue):
        return f"(reply to call {msg.call_seq})"
    return type(msg).__name__


def _diff_states(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    diffs = []
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            diffs.append(f"attribute {key!r} only in one run")
        elif cloudpickle.dumps(a[key]) != cloudpickle.dumps(b[key]):
            diffs.append(f"attribute {key!r}: {_short(a[key])} vs {_short(b[key])}")
    return "; ".join(diffs) or None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _restored(service: type[Immortal], instance: str, blob: wire.Payload) -> Dispatcher:
    d = Dispatcher(service, instance)
    d.restore(blob)
    return d


def replay_instance(
    service: type[Immortal],
    data_dir: Path,
    instance: str,
    *,
    verify: bool = False,
    to_seq: int | None = None,
) -> ReplayResult:
    """Replay an instance's history with ``service``'s code (see the module docstring).

    Sealed state files (``files.py``) are read from the data dir, never written.
    """
    with use_state_files(StateFiles(state_files_dir(data_dir, instance), writable=False)):
        return _replay(service, data_dir, instance, verify, to_seq)


def _replay(
    service: type[Immortal], data_dir: Path, instance: str, verify: bool, to_seq: int | None
) -> ReplayResult:
    files = _instance_files(data_dir, instance)
    checkpoints = files.checkpoint_numbers()
    if not checkpoints:
        raise BindingError(f"instance {instance!r} has no checkpoint in {files.path}")
    first = checkpoints[0]
    state = IcState.decode(files.read_checkpoint(first), str(files.checkpoint_path(first)))
    run = _restored(service, instance, state.blob)
    twin = _restored(service, instance, state.blob) if verify else None
    starts = {}  # first seq of each later checkpoint's log -> its number
    for n in checkpoints[1:]:
        later = IcState.decode(files.read_checkpoint(n), str(files.checkpoint_path(n)))
        starts[later.next_seq] = (n, later)
    records = messages = 0
    last_seq: int | None = None
    for record in _records(files, first, state, to_seq):
        if verify and record.seq != last_seq and record.seq in starts:
            n, later = starts[record.seq]
            divergence = _check_against(later, run, record.seq, n)
            if divergence is not None:
                return ReplayResult(first, records, messages, last_seq, run.state(), divergence)
        if record.seq != last_seq:
            records += 1
            last_seq = record.seq
        messages += 1
        out = run.handle(record)
        if twin is not None:
            twin_out = twin.handle(record)
            what, details = None, None
            state_diff = _diff_states(run.state(), twin.state())
            if state_diff is not None:
                what, details = "state", state_diff
            elif [wire.encode_message(m) for m in out] != [
                wire.encode_message(m) for m in twin_out
            ]:
                what, details = "outputs", f"{_short(out)} vs {_short(twin_out)}"
            if what is not None:
                divergence = Divergence(record.seq, _method(service, record), what, details or "")
                return ReplayResult(first, records, messages, last_seq, run.state(), divergence)
        run.take_effects()
    return ReplayResult(first, records, messages, last_seq, run.state())


def _check_against(later: IcState, run: Dispatcher, seq: int, n: int) -> Divergence | None:
    """Compare the replayed state with recorded checkpoint ``n`` (taken before ``seq``)."""
    snap = decode_snapshot(later.blob)
    if snap.tail:
        return None  # taken with handlers in flight: its state is an older one
    diff = _diff_states(run.state(), snap.state)
    if diff is None:
        return None
    return Divergence(seq - 1, f"(the records before checkpoint {n})", "checkpoint", diff)
