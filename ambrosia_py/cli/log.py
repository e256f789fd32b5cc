"""``ambrosia-py log show|verify|prune``: coordinator log files, read and maintained.

They work on the files a coordinator leaves in its data directory (see
``coordinator/storage/files.py``); none of them needs a running coordinator, and ``prune``
refuses to run beside one. ``show`` and ``verify`` never modify a log.
"""

from __future__ import annotations

import datetime
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import click

from .. import wire
from ..coordinator.registry.backends import open_registry, registry_file
from ..coordinator.registry.interface import InstanceInfo, RegistryError
from ..coordinator.storage.files import (
    CorruptLogError,
    InstanceFiles,
    InstanceLockedError,
    LogScan,
    StorageError,
    log_number,
    log_numbers_in,
)
from ..coordinator.storage.replica_state import load_replica_state
from ..helpformat import Group
from ..ingress.envelope import (
    INGRESS_METHOD_ID,
    EnvelopeKind,
    RetentionEnvelope,
    decode_impulse,
)
from ..ingress.errors import IngressProtocolError
from ..ingress.keys import describe_key
from .exits import verbose_option
from .options import coordinators_data_dir, or_dash, registry_options

__all__ = ["log"]

_PREVIEW = 16


@click.group(cls=Group)
def log() -> None:
    """Inspect and maintain coordinator log files."""


def _preview(data: wire.Payload) -> str:
    raw = bytes(data[:_PREVIEW])
    more = "..." if len(data) > _PREVIEW else ""
    text = f"{len(data)} bytes"
    if raw:
        text += f": {raw.hex()}{more}"
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            decoded = ""
        if decoded and decoded.isprintable():
            text += f" {decoded!r}{more}"
    return text


class CallDecoder(Protocol):
    """Reads logged calls in the service's terms (``binding/log_decode.py``)."""

    def call(self, method_id: int, data: wire.Payload) -> str | None: ...

    def value(self, data: wire.Payload) -> str: ...


def _call(method_id: int, data: wire.Payload, decoder: CallDecoder | None) -> tuple[str, str]:
    """The method, and what follows the call's other fields: its arguments."""
    decoded = decoder.call(method_id, data) if decoder is not None else None
    if decoded is not None:
        return f"method {method_id} {decoded}", ""
    unknown = " (not a method of the service)" if decoder is not None else ""
    return f"method {method_id}{unknown}", f", args {_preview(data)}"


def _time(time_ms: int) -> str:
    """A logged arrival time, in UTC to the millisecond."""
    at = datetime.datetime.fromtimestamp(time_ms / 1000, datetime.UTC)
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _ingress(msg: wire.IncomingRpc, decoder: CallDecoder | None) -> list[str]:
    """An ingress impulse (``ingress/envelope.py``): a call from outside, a batch of such
    calls (a head line, then a line per call, in the order the table takes them), or
    retention. One that does not decode is shown with the reason and the offset within
    its arguments where it went wrong, never skipped."""
    try:
        impulse = decode_impulse(msg.args)
    except IngressProtocolError as exc:
        return [f"ingress impulse that does not decode ({exc}), args {_preview(msg.args)}"]
    if isinstance(impulse, RetentionEnvelope):
        count = impulse.keep_count or "any number of"
        age = f"none older than {impulse.keep_ms / 1000:g} s" if impulse.keep_ms else "any age"
        return [f"ingress retention: keep the outcomes of the last {count} calls, {age}"]
    calls = impulse.calls
    if msg.args[0] == EnvelopeKind.CALL:  # a lone call, not a batch of one
        (one,) = calls
        method, args = _call(one.method_id, one.args, decoder)
        return [f"ingress call key {describe_key(one.key)} at {_time(one.time_ms)}, {method}{args}"]
    if not calls:
        return ["ingress batch of 0 calls"]
    lines = [f"ingress batch of {len(calls)} calls at {_time(calls[0].time_ms)}"]
    for index, one in enumerate(calls):
        method, args = _call(one.method_id, one.args, decoder)
        lines.append(f"  call {index} of {len(calls)}: key {describe_key(one.key)}, {method}{args}")
    return lines


def describe(msg: wire.Message, decoder: CallDecoder | None = None) -> list[str]:
    """Readable lines for one message a coordinator logged (batches indent their RPCs).

    With ``decoder``, method ids read as the service's method names and arguments and
    values as Python values; ingress impulses are always taken apart.
    """
    if isinstance(msg, wire.IncomingRpc):
        if msg.method_id == INGRESS_METHOD_ID and msg.rpc_type is wire.RpcType.IMPULSE:
            return _ingress(msg, decoder)
        method, args = _call(msg.method_id, msg.args, decoder)
        line = f"RPC {msg.rpc_type.name.lower()} {method}"
        if msg.rpc_type is wire.RpcType.ASYNC_AWAIT:
            line += f" from {msg.sender!r} call {msg.call_seq}"
        return [line + args]
    if isinstance(msg, wire.IncomingReturnValue):
        value = decoder.value(msg.value) if decoder is not None else _preview(msg.value)
        return [
            f"return {msg.return_type.name.lower()} from {msg.sender!r} call {msg.call_seq}, "
            f"value {value}"
        ]
    if isinstance(msg, wire.RpcBatch | wire.CountReplayableRpcBatch):
        head = f"RPC batch of {len(msg.messages)}"
        if isinstance(msg, wire.CountReplayableRpcBatch):
            head += f" ({msg.replayable_count} replayable)"
        return [head] + ["  " + line for inner in msg.messages for line in describe(inner, decoder)]
    if isinstance(msg, wire.InitialMessage):
        return [f"InitialMessage {_preview(msg.data)}"]
    if isinstance(msg, wire.CheckpointHeader):
        return [f"Checkpoint, blob of {msg.length} bytes"]
    return [repr(msg)]


def _count(messages: list[wire.Message]) -> int:
    """Messages, counting each RPC of a batch."""
    return sum(
        len(m.messages) if isinstance(m, wire.RpcBatch | wire.CountReplayableRpcBatch) else 1
        for m in messages
    )


def _decode(record: wire.RawRecord, path: Path) -> list[wire.Message]:
    try:
        return wire.decode_messages(
            record.raw, wire.HEADER_SIZE, record.header.length, wire.Direction.TO_BINDING
        )
    except wire.ProtocolError as exc:
        raise CorruptLogError(
            path,
            record.offset,
            record.seq,
            f"record verifies but its messages do not decode: {exc.reason}"
            + ("" if exc.offset is None else f" (at offset {record.offset + exc.offset})"),
        ) from None


def _is_last(path: Path) -> bool:
    """Whether no higher-numbered log sits beside ``path`` (it is where a crash tears)."""
    n = log_number(path)
    return n is None or all(m <= n for m in log_numbers_in(path.parent))


def _scan(path: Path, committer: int | None, next_seq: int | None, last: bool) -> LogScan:
    return LogScan(path, committer_id=committer, next_seq=next_seq, last=last, repair=False)


@log.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--from-seq", type=int, default=None, help="Skip records before this seq.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show at most N.")
@click.option(
    "--service",
    "service_spec",
    metavar="FILE|MODULE[:CLASS]",
    help="Show method names and decoded arguments and values, with this service's code "
    "(as `run` takes it). Unpickles what the log holds: only for logs you trust.",
)
@verbose_option
def show(path: Path, from_seq: int | None, limit: int | None, service_spec: str | None) -> None:
    """Print the records of log file PATH and their messages."""
    decoder: CallDecoder | None = None
    if service_spec is not None:
        # The service's code only when asked for: it is the binding's, not the log's.
        from ..binding.loading import load_service
        from ..binding.log_decode import TRUST_WARNING, ServiceDecoder

        decoder = ServiceDecoder(load_service(service_spec))
        click.echo(f"warning: {TRUST_WARNING}", err=True)
    scan = _scan(path, None, None, _is_last(path))
    shown = 0
    try:
        for record in scan:
            if from_seq is not None and record.seq < from_seq:
                continue
            if limit is not None and shown >= limit:
                return
            shown += 1
            messages = _decode(record, path)
            h = record.header
            click.echo(
                f"record seq {h.seq}  offset {record.offset}  committer {h.committer_id}  "
                f"length {h.length}  messages {len(messages)}"
            )
            tail = record.tail or wire.DiskRecordTail()
            if tail.watermarks:
                marks = "; ".join(
                    f"{w.name!r} seq {w.last_seq} replayable {w.last_replayable_seq}"
                    for w in tail.watermarks
                )
                click.echo(f"  watermarks: {marks}")
            if tail.trims:
                trims = "; ".join(f"{t.name!r} seq {t.seq}" for t in tail.trims)
                click.echo(f"  trims: {trims}")
            for msg in messages:
                for line in describe(msg, decoder):
                    click.echo(f"  {line}")
    except CorruptLogError as exc:
        raise click.ClickException(str(exc)) from None
    if scan.damage is not None:
        d = scan.damage
        raise click.ClickException(
            f"{d.path}: {d.reason}; {d.dropped_bytes} bytes from offset {d.offset} "
            "would be cut at recovery"
        )
    if shown == 0:
        click.echo("no records")


def _log_files(path: Path) -> Iterator[Path]:
    if path.is_file():
        yield path
        return
    numbers = log_numbers_in(path)
    for prev, n in itertools.pairwise(numbers):
        if n != prev + 1:
            raise CorruptLogError(
                path / f"serverlog{prev + 1}", 0, None, "log file missing between two others"
            )
    for n in numbers:
        yield path / f"serverlog{n}"


@log.command()
@click.argument("path", type=click.Path(exists=True, path_type=Path))
def verify(path: Path) -> None:
    """Verify log file PATH, or every log of the instance-version directory PATH.

    Exit 0 if every record verifies (sequence ids consecutive across files), 1 naming the
    first bad record or the torn tail a recovery would cut.
    """
    files = records = messages = size = 0
    committer: int | None = None
    next_seq: int | None = None
    first_seq: int | None = None
    try:
        paths = list(_log_files(path))
        for i, log_path in enumerate(paths):
            last = i == len(paths) - 1 and _is_last(log_path)
            scan = _scan(log_path, committer, next_seq, last)
            for record in scan:
                messages += _count(_decode(record, log_path))
                first_seq = record.seq if first_seq is None else first_seq
            files += 1
            records += scan.records
            size += scan.end_offset
            committer, next_seq = scan.committer_id, scan.next_seq
            if scan.damage is not None:
                d = scan.damage
                raise click.ClickException(
                    f"{d.reason} in {d.path} at offset {d.offset}: {d.dropped_bytes} bytes after "
                    f"the last good record (next seq {or_dash(next_seq)}) would be cut at recovery"
                )
    except CorruptLogError as exc:
        raise click.ClickException(
            f"bad record in {exc.path} at offset {exc.offset}, seq {or_dash(exc.seq)}: {exc.reason}"
        ) from None
    if files == 0:
        raise click.ClickException(f"no log files in {path}")
    seqs = ""
    if first_seq is not None and next_seq is not None:
        seqs = f", seqs {first_seq}..{next_seq - 1}"
    click.echo(
        f"OK: {files} file{'s' * (files != 1)}, {records} records, {messages} messages, "
        f"{size} bytes{seqs}"
    )


@log.command()
@coordinators_data_dir
@click.option("--instance", required=True, help="The instance name.")
@click.option("--version", "version", type=int, help="Instance version (default: current).")
@click.option("--keep", type=click.IntRange(min=1), required=True, help="Checkpoints to keep.")
@registry_options
def prune(
    data_dir: Path,
    instance: str,
    version: int | None,
    keep: int,
    registry: str | None,
    cluster: str,
) -> None:
    """Remove the oldest checkpoints and the logs only they need.

    Refuses while a running coordinator holds the instance's lock.
    """
    info: InstanceInfo | None = None
    path = None
    try:
        path = registry_file(registry, data_dir)
        if path is None or path.exists():
            with open_registry(registry, data_dir, cluster) as reg:
                info = reg.get(instance)
    except RegistryError as exc:
        why = f"{exc}; refusing to prune without it (it names the committed checkpoint)"
        if path is not None:
            why += f": rebuild it with `ambrosia-py registry rebuild --data-dir {data_dir}`"
        raise click.ClickException(why) from None
    if version is None:
        if info is None:
            raise click.ClickException(
                f"instance {instance!r} is not registered in {data_dir}; give --version"
            )
        version = info.current_version
    committed = info.last_checkpoint if info and info.current_version == version else None
    files = InstanceFiles(data_dir, instance, version)
    if not files.path.is_dir():
        raise click.ClickException(f"no directory {files.path}")
    try:
        files.acquire_lock()
    except InstanceLockedError as exc:
        raise click.ClickException(f"refusing to prune: {exc}") from None
    try:
        # A replica's committed checkpoint is its own, in its data dir: the registry's
        # is the instance's, numbered in another replica's files (docs/replication.md).
        state = load_replica_state(files)
        if state is not None:
            committed = state.checkpoint
        removed = files.prune(keep, committed=committed)
    except StorageError as exc:
        raise click.ClickException(str(exc)) from None
    finally:
        files.release_lock()
    for p in removed:
        click.echo(f"removed {p.name}")
    if not removed:
        click.echo("nothing to remove")
    kept_chk = ", ".join(map(str, files.checkpoint_numbers())) or "none"
    kept_log = ", ".join(map(str, files.log_numbers())) or "none"
    click.echo(f"kept checkpoints {kept_chk}; logs {kept_log}")
