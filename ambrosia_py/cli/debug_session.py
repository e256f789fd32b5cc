"""``ambrosia-py debug SERVICE``: the debug coordinator and the binding, in one command.

The coordinator's debug mode (``core.debug.run_debug``) serves a checkpoint and every
logged record after it to a binding, exactly as recovery does, and writes nothing. Here
both run on one event loop: the binding restores the checkpoint, handles the records
up to the chosen one (``to_seq``, else the log's last), and stops there, where the
caller looks at the immortal (prints its state, or opens pdb). What the binding sends
back is never written: there is nothing to send it to.

Where the replay ends is found first by reading the logs, the same way the coordinator
will send them (to stop at ``--to-seq``, and to say where the log ends); the coordinator's
TakeBecomingPrimaryCheckpoint after the last record (seed 002: a repro test becomes
primary then) ends it too, and is not handled: this binding never becomes primary.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

from .. import eventloop
from ..binding.client import connect, record_failure
from ..binding.dispatcher import Dispatcher
from ..binding.errors import BindingError
from ..binding.immortal import Immortal
from ..binding.loading import load_service
from ..binding.socket_io import SocketStream
from ..coordinator.core.binding_auth import BindingAuth, token_for_ready_line
from ..coordinator.core.checkpoint import IcState, StateFormatError
from ..coordinator.core.config import CoordinatorConfig, CoordinatorError
from ..coordinator.core.debug import run_debug
from ..coordinator.registry.interface import DEFAULT_CLUSTER
from ..coordinator.storage.errors import StorageError
from ..coordinator.storage.files import InstanceFiles
from ..hashseed import instance_seed, run_under_seed
from ..oneline import OneLineError
from ..wire import CONTROL_SEQ, RecordReader

__all__ = ["DebugPoint", "debug_command", "debug_service", "pdb_point", "print_point"]


@attrs.frozen
class DebugPoint:
    """Where the replay stopped."""

    checkpoint: int
    first_seq: int  # the first record after the checkpoint
    last_seq: int | None  # the last record handled; None: only the checkpoint
    records: int  # records handled after the checkpoint
    log_end: int | None  # the last record in the logs


def _replay_range(files: InstanceFiles, checkpoint: int) -> tuple[int, int | None]:
    """The first seq after ``checkpoint`` and the last seq in the logs (None: none)."""
    if checkpoint not in files.checkpoint_numbers():
        raise BindingError(
            f"no checkpoint {checkpoint} in {files.path} (it has {files.checkpoint_numbers()})"
        )
    state = IcState.decode(
        files.read_checkpoint(checkpoint), str(files.checkpoint_path(checkpoint))
    )
    logs = [n for n in files.log_numbers() if n >= checkpoint]
    next_seq = state.next_seq
    for n in logs:
        scan = files.scan_log(
            n,
            committer_id=state.committer_id,
            next_seq=next_seq,
            last=n == logs[-1],
            repair=False,
        )
        for _ in scan:
            pass
        if scan.next_seq is not None:
            next_seq = scan.next_seq
    return state.next_seq, (next_seq - 1 if next_seq > state.next_seq else None)


async def debug_service(
    service: type[Immortal],
    data_dir: Path,
    instance: str,
    version: int,
    checkpoint: int,
    at_point: Callable[[Dispatcher, DebugPoint], None],
    *,
    to_seq: int | None = None,
    test_upgrade: bool = False,
    upgrade_to: type[Immortal] | None = None,
    receive_port: int | None = None,
    send_port: int | None = None,
    registry: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> DebugPoint:
    """Replay ``instance`` from ``checkpoint`` through ``to_seq`` and call ``at_point``."""
    first, log_end = _replay_range(InstanceFiles(data_dir, instance, version), checkpoint)
    if to_seq is not None and to_seq < first:
        raise BindingError(
            f"--to-seq {to_seq} comes before checkpoint {checkpoint}, whose first record is "
            f"seq {first}: start from an earlier checkpoint"
        )
    end = log_end if to_seq is None or log_end is None else min(to_seq, log_end)
    ready: asyncio.Future[dict[str, str]] = asyncio.get_running_loop().create_future()

    def on_ready(line: str) -> None:
        ready.set_result(dict(kv.split("=", 1) for kv in line.split() if "=" in kv))

    config = CoordinatorConfig(
        data_dir=data_dir,
        instance=instance,
        receive_port=receive_port,
        send_port=send_port,
        binding_auth=BindingAuth.TOKEN,
        registry=registry,
        cluster=cluster,
    )
    coordinator = asyncio.create_task(
        run_debug(config, checkpoint, test_upgrade=test_upgrade, ready=on_ready)
    )
    either: set[asyncio.Future[Any]] = {coordinator, ready}
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not ready.done():
        await coordinator  # it stopped before listening: raises why
        raise BindingError("the debug coordinator stopped before it was ready")
    fields = ready.result()
    conn = await connect(
        int(fields["receive_port"]),
        int(fields["send_port"]),
        token=token_for_ready_line(fields, data_dir, instance, debug=True),
    )
    d = Dispatcher(service, instance, upgrade_to=upgrade_to, options=service.make_options())
    point = DebugPoint(checkpoint, first, None, 0, log_end)
    try:
        point = await _replay(conn.reader, d, point, end)
    finally:
        conn.close()  # the coordinator sees the binding go and stops
        await coordinator
    at_point(d, point)
    return point


async def _replay(
    reader: SocketStream, d: Dispatcher, point: DebugPoint, end: int | None
) -> DebugPoint:
    """Handle records (checkpoint first) until the one with seq ``end`` is handled."""
    records = RecordReader()
    restored = False
    while not (restored and (end is None or point.last_seq == end)):
        data = await reader.read()
        if not data:
            raise BindingError(
                f"the debug coordinator closed the connection after seq {point.last_seq} "
                "(its log above says why)"
            )
        records.feed(data)
        for record in records:
            if restored and record.seq == CONTROL_SEQ:
                return point  # TakeBecomingPrimaryCheckpoint: all the records came
            try:
                d.handle(record)  # the outputs go nowhere: nothing is written
            except Exception as exc:
                raise record_failure(d, record.seq, exc) from exc
            restored = True
            if record.seq >= 0:
                point = attrs.evolve(point, last_seq=record.seq, records=point.records + 1)
            if restored and end is not None and point.last_seq == end:
                break
    return point


def print_point(d: Dispatcher, point: DebugPoint) -> None:
    """Say where the replay stopped, and the immortal's state there."""
    for line in _point_lines(d, point):
        print(line)
    for key, value in sorted(d.state().items()):
        text = repr(value)
        print(f"  {key} = {text if len(text) <= 100 else text[:97] + '...'}")


def pdb_point(d: Dispatcher, point: DebugPoint) -> None:
    """Open pdb where the replay stopped, the immortal at hand as ``immortal``."""
    import pdb

    for line in _point_lines(d, point):
        print(line)
    print("pdb: `immortal` is the service at this point (`vars(immortal)` its state); c ends")
    immortal = d.immortal  # noqa: F841 - for the pdb session
    pdb.Pdb().set_trace()


def _point_lines(d: Dispatcher, point: DebugPoint) -> list[str]:
    name = type(d.immortal).__name__
    if point.last_seq is None:
        at = f"{name} as checkpoint {point.checkpoint} left it (no record replayed)"
    else:
        at = (
            f"{name} after record {point.last_seq}: replayed {point.records} records "
            f"(seqs {point.first_seq}..{point.last_seq}) from checkpoint {point.checkpoint}"
        )
    end = (
        "the log has no records after it"
        if point.log_end is None
        else (f"the log ends at seq {point.log_end}")
    )
    return [f"{at}; {end}"]


def debug_command(
    service_spec: str,
    data_dir: Path,
    instance: str,
    version: int,
    checkpoint: int,
    *,
    to_seq: int | None,
    use_pdb: bool,
    receive_port: int | None,
    send_port: int | None,
    registry: str | None = None,
    cluster: str = DEFAULT_CLUSTER,
) -> int:
    """``ambrosia-py debug SERVICE ...``; its exit status (errors are one line)."""
    try:  # the run's set order, not this process's (hashseed.py); before the service loads
        run_under_seed(instance_seed(data_dir, instance, create=False))
    except ValueError as exc:
        raise OneLineError(str(exc)) from None
    service = load_service(service_spec)
    # Warnings only (a torn tail found, a dropped reply): the rest is recovery's chatter.
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.WARNING,
        format=f"%(asctime)s debug[{instance}] %(levelname)s %(message)s",
    )
    try:
        eventloop.run(
            debug_service(
                service,
                data_dir,
                instance,
                version,
                checkpoint,
                pdb_point if use_pdb else print_point,
                to_seq=to_seq,
                receive_port=receive_port,
                send_port=send_port,
                registry=registry,
                cluster=cluster,
            )
        )
    except (BindingError, CoordinatorError, StorageError, StateFormatError) as exc:
        click.echo(f"ambrosia-py: {exc}", err=True)
        return 2
    except OSError as exc:  # a port another process holds
        click.echo(f"ambrosia-py: {exc.strerror or exc}", err=True)
        return 2
    return 0
