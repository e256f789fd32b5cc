"""Replaying recorded history offline, and finding where it stops being deterministic.

``ambrosia-py replay`` restores a checkpoint of an instance and runs its logged records
through the service's code, exactly as recovery would, writing nothing. With
``verify=True`` it runs *two* replays in lockstep and compares them after each message:
the state, by value (``state_compare.py``), and the outputs (calls, forks, return
values). A handler that reads the clock, draws a random number or depends on anything
but its logged input makes the two runs differ at that very message, and the report
names the record, its method and what differed.

The two runs differ in one way on purpose: at every recorded checkpoint the second is
restored from it, as a recovery there would be, while the first runs on. So each
recorded checkpoint is compared by value with the state the first run recomputed (a
divergence between the live run and the replay), and a handler whose behaviour depends
on how its state was built (the iteration order of a set rebuilt by unpickling) makes
the runs differ after that checkpoint, reported with the set or dict to blame. Sets and
dicts whose order differs after a recovery while nothing depended on it are reported as
notes, not divergences.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import cloudpickle

from .. import wire
from ..coordinator.core.checkpoint import IcState
from ..coordinator.registry.backends import registry_file
from ..coordinator.registry.files import instance_directories, open_registry_for_start
from ..coordinator.registry.interface import DEFAULT_CLUSTER, RegistryError
from ..coordinator.storage.files import InstanceFiles
from ..wire import IncomingReturnValue, IncomingRpc, LogRecord
from .checkpoint import decode_snapshot
from .dispatcher import Dispatcher
from .errors import BindingError
from .files import StateFiles, state_files_dir, use_state_files
from .hooks import IngressFactory, IngressHook
from .immortal import Immortal
from .state_compare import OrderHazard, compare_states, short_repr

__all__ = ["Divergence", "ReplayResult", "replay_instance"]


@attrs.frozen
class Divergence:
    """The first message at which replay was not deterministic."""

    seq: int
    method: str
    what: str  # "state" or "outputs" or "checkpoint"
    details: str
    checkpoint: int | None = None  # "checkpoint": the recorded one that differs
    hint: str = ""  # what the state's order had to do with it, where it did

    def __str__(self) -> str:
        if self.what == "checkpoint":
            text = (
                f"checkpoint {self.checkpoint} (taken after record {self.seq}): the replayed "
                f"state differs from the recorded one: {self.details}"
            )
        else:
            text = f"record {self.seq}, method {self.method}: {self.what} differs: {self.details}"
        return f"{text}. {self.hint}" if self.hint else text


@attrs.frozen
class ReplayResult:
    checkpoint: int
    records: int
    messages: int
    last_seq: int | None
    state: dict[str, Any]
    divergence: Divergence | None = None
    # Sets and dicts that iterate in another order after a recovery, while nothing in
    # this history depended on it (the first checkpoint each was seen at).
    hazards: tuple[tuple[int, OrderHazard], ...] = ()


def _instance_files(data_dir: Path, instance: str, spec: str | None, cluster: str) -> InstanceFiles:
    """The instance's files, by its entry in the registry ``spec`` names (``None``: the
    data dir's own); a missing or damaged registry is a clear error (the same refusal as
    ``run``'s), and replay never creates one."""
    try:
        path = registry_file(spec, data_dir)
        if path is not None and not path.exists() and not instance_directories(data_dir):
            raise BindingError(f"no instance {instance!r} in {data_dir}: it has no registry")
        registry = open_registry_for_start(data_dir, instance, spec, cluster)
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


def _method(service: type[Immortal], record: LogRecord, ingress: IngressHook[Any] | None) -> str:
    (msg,) = record.messages
    if isinstance(msg, IncomingRpc):
        method_id, what = msg.method_id, ""
        if ingress is not None and method_id == ingress.method_id:  # the hook's envelope
            try:
                called, what = ingress.describe(msg.args)
            except ValueError:
                return "(a malformed ingress call)"
            if called is None:
                return f"({what})"
            method_id, what = called, f" ({what})"
        spec = service.rpc_methods().get(method_id)
        return f"{spec.name if spec else f'#{method_id}'}{what}"
    if isinstance(msg, IncomingReturnValue):
        return f"(reply to call {msg.call_seq})"
    return type(msg).__name__


def _restored(
    service: type[Immortal], instance: str, blob: wire.Payload, ingress: IngressFactory | None
) -> Dispatcher:
    d = Dispatcher(service, instance, ingress=ingress)
    d.restore(blob)  # a checkpoint that holds an ingress hook brings it back
    return d


def replay_instance(
    service: type[Immortal],
    data_dir: Path,
    instance: str,
    *,
    verify: bool = False,
    to_seq: int | None = None,
    ingress: IngressFactory | None = None,
    registry: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> ReplayResult:
    """Replay an instance's history with ``service``'s code (see the module docstring).

    Its files are in ``data_dir``; its current version is the registry's (``registry``
    the spec, ``None``: the data dir's own; ``cluster`` its etcd prefix). Sealed state
    files (``files.py``) are read from the data dir, never written. The ingress hook
    comes back with the checkpoints that hold it; ``ingress`` registers one for those
    that do not (``hooks.py``).
    """
    files = _instance_files(data_dir, instance, registry, cluster)
    with use_state_files(StateFiles(state_files_dir(data_dir, instance), writable=False)):
        return _replay(service, files, instance, verify, to_seq, ingress)


def _replay(
    service: type[Immortal],
    files: InstanceFiles,
    instance: str,
    verify: bool,
    to_seq: int | None,
    ingress: IngressFactory | None,
) -> ReplayResult:
    checkpoints = files.checkpoint_numbers()
    if not checkpoints:
        raise BindingError(f"instance {instance!r} has no checkpoint in {files.path}")
    first = checkpoints[0]
    state = IcState.decode(files.read_checkpoint(first), str(files.checkpoint_path(first)))
    run = _restored(service, instance, state.blob, ingress)
    twin = _restored(service, instance, state.blob, ingress) if verify else None
    starts = {}  # first seq of each later checkpoint's log -> its number
    for n in checkpoints[1:]:
        later = IcState.decode(files.read_checkpoint(n), str(files.checkpoint_path(n)))
        starts[later.next_seq] = (n, later)
    hazards: dict[str, tuple[int, OrderHazard]] = {}
    recovered: tuple[int, list[OrderHazard]] | None = None  # the twin's latest restore
    records = messages = 0
    last_seq: int | None = None

    def result(divergence: Divergence | None = None) -> ReplayResult:
        return ReplayResult(
            first, records, messages, last_seq, run.state(), divergence, tuple(hazards.values())
        )

    for record in _records(files, first, state, to_seq):
        if twin is not None and record.seq != last_seq and record.seq in starts:
            n, later = starts[record.seq]
            divergence = _check_against(later, run, record.seq, n)
            if divergence is not None:
                return result(divergence)
            twin = _restored(service, instance, later.blob, ingress)  # as a recovery there would
            after = compare_states(run.state(), twin.state())
            if not after.equal:  # a checkpoint taken with handlers in flight, replayed
                return result(Divergence(record.seq - 1, "", "checkpoint", after.describe(), n))
            recovered = (n, list(after.hazards))
            for hazard in after.hazards:
                hazards.setdefault(hazard.path, (n, hazard))
        if record.seq != last_seq:
            records += 1
            last_seq = record.seq
        messages += 1
        out = run.handle(record)
        if twin is not None:
            twin_out = twin.handle(record)
            what, details = None, ""
            compared = _compare(run.state(), twin.state())
            if compared is not None:
                what, details = "state", compared
            elif [wire.encode_message(m) for m in out] != [
                wire.encode_message(m) for m in twin_out
            ]:
                what, details = "outputs", f"{short_repr(out)} vs {short_repr(twin_out)}"
            if what is not None:
                hint = ""
                if recovered is not None and recovered[1]:
                    blamed = "; ".join(f"{h} ({h.fix})" for h in recovered[1])
                    hint = f"After a recovery at checkpoint {recovered[0]}, {blamed}"
                method = _method(service, record, run.ingress)
                return result(Divergence(record.seq, method, what, details, hint=hint))
            twin.take_effects()
        run.take_effects()
    return result()


def _compare(a: dict[str, Any], b: dict[str, Any]) -> str | None:
    """What differs between two states by value, or None. Equal pickles are equal values,
    and pickling runs in C: only states whose bytes differ are walked."""
    if cloudpickle.dumps(a) == cloudpickle.dumps(b):
        return None
    compared = compare_states(a, b)
    return None if compared.equal else compared.describe()


def _check_against(later: IcState, run: Dispatcher, seq: int, n: int) -> Divergence | None:
    """Compare the replayed state with recorded checkpoint ``n`` (taken before ``seq``)."""
    snap = decode_snapshot(later.blob)
    if snap.tail:
        return None  # taken with handlers in flight: its state is an older one
    compared = compare_states(run.state(), snap.state)
    if compared.equal:
        return None
    return Divergence(seq - 1, "", "checkpoint", compared.describe(), n)
