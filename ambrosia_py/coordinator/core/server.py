"""The Immortal Coordinator process: the two binding sockets, start-up, group commit.

This is the thin asyncio adapter around :mod:`.intake` (routing), :mod:`..storage.files` (files)
and :mod:`..registry.store` (metadata). The rules it keeps (seed 002, *Communication Protocols*;
reference ambrosia.md, *Start-up* and *The two local sockets*):

* Listen on the receive port (where the binding writes) first, accept one binding, then
  listen on the send port (where the binding reads) and accept it. Later connections on
  either port are refused with a log line; the first binding is unaffected.
* First start: TakeBecomingPrimaryCheckpoint → the binding's InitialMessage and
  Checkpoint → the InitialMessage is logged durably as record 0 of log 1, *then*
  checkpoint 1 is written and committed, *then* record 0 is echoed. A crash before the
  commit leaves no committed checkpoint, and the next start is a first start again.
* Recovery from committed checkpoint N: the checkpoint as a seq -2 record, every record
  of logs N, N+1, ... (verified; a torn tail of the last log is cut and reported, damage
  before it stops recovery), then log M = last + 1, TakeBecomingPrimaryCheckpoint (or
  UpgradeTakeCheckpoint) and the binding's checkpoint written as checkpoint M.
* Normal processing, group commit: a reader (a callback on the binding's socket) sorts
  the binding's bytes into pending input; a committer task packs everything pending
  into one record and writes it in a worker thread — input keeps arriving meanwhile and
  forms the next record — while a second stage (:mod:`.commit`) ``fdatasync``s what was
  written and only then forwards the same bytes to the binding (:mod:`.forwarding`). The
  binding only ever sees durable input.
* Checkpoints: when the binding sends TakeCheckpoint or the log passes its size trigger,
  the committer moves to log N+1 and sends TakeCheckpoint (a seq -1 record) between the
  last record of log N and the first of log N+1, so the binding's answer is the state at
  the start of log N+1: it becomes ``serverchkpt<N+1>``, written atomically and only then
  committed in the registry. Until then recovery uses checkpoint N and replays both logs.
* When the binding disconnects, pending input is made durable and the coordinator exits.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import secrets
import time
from collections.abc import Callable

import attrs

from ... import crashpoints, wire
from ...eventloop import running_loop_name
from ...wire import (
    CHECKPOINT_SEQ,
    Checkpoint,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    UpgradeTakeCheckpoint,
)
from ..links.peers import PeerLinks
from ..links.protocol import Inbox
from ..registry.store import Registry
from ..storage.files import InstanceFiles, LogWriter
from ..storage.replay import replay_log
from .binding_auth import open_gate
from .binding_link import BindingLink, connect_binding
from .checkpoint import IcState
from .commit import CommitPipeline
from .config import BindingLeftError, CoordinatorConfig, resolve_start
from .forwarding import Forwarded, Forwarder, LogPlace, OutboxGate
from .intake import CheckpointArrived, CheckpointRequested, InitialArrived, Intake

__all__ = ["Coordinator"]

log = logging.getLogger("ambrosia_py.coordinator")

_EMPTY_TAIL = wire.encode_disk_tail()  # no watermarks, no trim watermarks
# Link input of at most this many bytes, alone, is logged from the read that brought it
# (_commit_alone): its record stays within the commit pipeline's latency path.
_ALONE_MAX_BYTES = 64 * 1024


@attrs.frozen
class _LogStart:
    """What the checkpoint that pairs with a log must record about its start."""

    next_seq: int
    logged_outputs: int
    inbox: dict[str, int]


class Coordinator:
    def __init__(self, config: CoordinatorConfig, registry: Registry, files: InstanceFiles):
        self.config = config
        self.registry = registry
        self.files = files
        self.intake = Intake(config.instance, config.link_settings.max_outbox_bytes)
        self._outbox_gate = OutboxGate(self.intake.outbox_budget, self.intake.outboxes)
        self.binding: BindingLink | None = None
        self.committer_id = 0
        self.next_seq = 0
        self.logged_outputs = 0  # replayable outputs of the binding made durable so far
        self.log_number = 0
        self.writer: LogWriter | None = None
        self.trigger_bytes = int(config.log_trigger_mb * 1024 * 1024)
        self._wake = asyncio.Event()
        self._eof = False
        self._roll_requested = False
        self._awaiting_checkpoint: int | None = None  # the log it will pair with
        self._arrived: CheckpointArrived | None = None  # answer not yet committed
        self._startup_checkpoint: asyncio.Future[CheckpointArrived] | None = None
        self._initial: asyncio.Future[bytes] | None = None
        self._failure: BaseException | None = None
        self._log_start: dict[int, _LogStart] = {}
        self.links: PeerLinks | None = None
        self._committing = False
        self._room = asyncio.Event()
        self._max_pending = 4 * config.max_record_bytes
        self._pipeline: CommitPipeline[Forwarded] | None = None  # while the loop runs
        self._parked = False  # the commit loop waits for input

    # -- reading the binding -------------------------------------------------------------

    async def room_for_input(self) -> None:
        """While the commit loop runs, the readers of the binding and of links wait while
        this much input is pending; TCP then slows their senders down."""
        while not self.has_room():
            self._room.clear()
            await self._room.wait()

    def has_room(self) -> bool:
        """Whether :meth:`room_for_input` would return at once."""
        return not (self._committing and self.intake.pending_bytes > self._max_pending)

    async def read_binding(self) -> None:
        """Take what the binding sends until it goes: first what recovery read ahead,
        then each read from the binding link's reader callback (a loop turn less than a
        task waiting for each read: this is on every awaited call's path)."""
        binding = self.binding
        assert binding is not None
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        resuming: asyncio.Task[None] | None = None

        def end(exc: BaseException | None) -> None:
            binding.pause_reading()
            if not ended.done():
                if exc is None:
                    ended.set_result(None)
                else:
                    ended.set_exception(exc)

        async def resume_when_room() -> None:
            await self._room_for_binding()
            binding.resume_reading()

        def take(data: bytes) -> None:
            nonlocal resuming
            try:
                if not self._binding_input(data):
                    return end(None)
            except Exception as exc:  # bad input or a bug: raised below, where it is told
                return end(exc)
            # Back-pressure once links are open (replay needs every output read): the
            # outbox limit, and room for pending input. Safe only as the commit loop
            # never waits for the binding (forwarding.py).
            if self.links is not None and (self._outbox_gate.paused or not self.has_room()):
                binding.pause_reading()
                resuming = asyncio.create_task(resume_when_room())

        try:
            while binding.read_ahead_left:
                if not self._binding_input(await binding.recv()):
                    return
                if self.links is not None:
                    await self._room_for_binding()
            binding.read_each(take, end)
            await ended
        except wire.ProtocolError as exc:
            log.error("bad input from the binding: %s", exc)
            self._failure = exc
        except (ConnectionError, OSError) as exc:
            log.info("binding connection lost: %s", exc)
        except Exception as exc:  # a bug: stop with it said, never as a clean exit
            log.exception("reading the binding failed")
            self._failure = exc
        finally:
            end(None)
            if resuming is not None:
                resuming.cancel()
            self._eof = True
            self._wake.set()
            for fut in (self._startup_checkpoint, self._initial):
                if fut is not None and not fut.done():
                    fut.set_exception(
                        BindingLeftError(
                            "the binding went away during start-up, before this start's "
                            "first checkpoint (the service's own output says why)"
                        )
                    )
                    # Only the first of the two is awaited; the other must not warn.
                    fut.add_done_callback(lambda f: f.exception())

    def _binding_input(self, data: bytes) -> bool:
        """Take one read from the binding; False once it has gone (``b""``)."""
        if not data:
            self.intake.close()
            return False
        events = self.intake.feed(data)
        for event in events:
            self._on_event(event)
        if self.links is not None:
            self.links.output_ready()
        if events or self.intake.pending:  # not for output alone: it goes by link
            self._wake.set()
        return True

    async def _room_for_binding(self) -> None:
        await self._outbox_gate.wait()
        await self.room_for_input()

    def _on_event(self, event: object) -> None:
        if isinstance(event, CheckpointRequested):
            self._roll_requested = True
        elif isinstance(event, CheckpointArrived):
            if self._startup_checkpoint is not None and not self._startup_checkpoint.done():
                self._startup_checkpoint.set_result(event)
            elif self._awaiting_checkpoint is not None and self._arrived is None:
                self._arrived = event  # committed by the commit loop, see _commit_ready
            else:
                raise wire.MalformedMessageError("a checkpoint nobody asked for")
        elif isinstance(event, InitialArrived):
            if self._initial is None or self._initial.done():
                raise wire.MalformedMessageError("InitialMessage outside a first start")
            self._initial.set_result(event.frame)

    # -- the log -------------------------------------------------------------------------

    def _open_log(self, n: int) -> None:
        if self.writer is not None:
            self.writer.close()
        self.log_number = n
        self._log_start[n] = _LogStart(
            self.next_seq, self.logged_outputs, dict(self.intake.inbox.durable)
        )
        self.writer = self.files.open_log(n)

    def _next_record(
        self, body: list[wire.Payload], outputs: int, marks: dict[str, int]
    ) -> tuple[bytes, list[wire.Payload]]:
        """Number the next record: its wire header and its disk form.

        The disk form's watermarks name, per link sender in the record, its last message
        (reference ambrosia.md, *Files on disk*); recovery rebuilds the inbox from them.
        """
        wire_header, disk_header = wire.record_headers(self.committer_id, self.next_seq, body)
        self.next_seq += 1
        self.logged_outputs += outputs
        tail = wire.encode_marks_tail(marks) if marks else _EMPTY_TAIL
        return wire_header, [disk_header, *body, tail]

    async def _write(
        self, body: list[wire.Payload], outputs: int, marks: dict[str, int] | None = None
    ) -> Forwarded:
        """Make one record durable (write + fdatasync in a worker); return it to forward."""
        assert self.writer is not None
        wire_header, disk_parts = self._next_record(body, outputs, marks or {})
        place = LogPlace.next_in(self.writer, disk_parts)
        await asyncio.to_thread(self.writer.append, disk_parts)
        if marks:
            self._made_durable(marks)
        return [wire_header, *body], place

    def _made_durable(self, marks: dict[str, int]) -> None:
        self.intake.inbox.made_durable(marks)
        if self.links is not None:
            self.links.durable(marks)

    async def _log_pending(self, limit: int | None = None) -> list[Forwarded]:
        """Make pending input durable, up to message number ``limit``; return the records."""
        records = []
        while self.intake.pending and (limit is None or self.intake.dequeued < limit):
            room = None if limit is None else limit - self.intake.dequeued
            body, outputs, marks = self.intake.take(self.config.max_record_bytes, room)
            records.append(await self._write(body, outputs, marks))
        return records

    async def _commit_checkpoint(self, n: int, arrived: CheckpointArrived) -> None:
        """Write checkpoint n once everything queued before it is durable, then commit it."""
        for item in await self._log_pending(arrived.enqueued):
            self.forwarder.put(*item)
        start = self._log_start[n]
        state = IcState(
            self.committer_id,
            start.next_seq,
            start.logged_outputs,
            arrived.binding_outputs,
            arrived.blob,
            start.inbox,
            arrived.outboxes,
            dict(self.intake.inbox.incarnations),
            arrived.attached,
        )
        await asyncio.to_thread(self.files.write_checkpoint, n, state.encode_parts())
        crashpoints.reach("ic.checkpoint.before_commit")
        await asyncio.to_thread(
            self.registry.commit_checkpoint, self.config.instance, self.files.version, n, n
        )
        log.info(
            "checkpoint %d committed (%d bytes, next seq %d)", n, len(arrived.blob), start.next_seq
        )

    # -- start-up ------------------------------------------------------------------------

    async def first_start(self) -> None:
        assert self.binding is not None
        # run_coordinator cleared what an interrupted first start left, or refused.
        self.committer_id = secrets.randbelow(2**31 - 1) + 1
        self.registry.set_committer_id(self.config.instance, self.committer_id)
        log.info("first start, committer id %d", self.committer_id)
        loop = asyncio.get_running_loop()
        self._initial = loop.create_future()
        self._startup_checkpoint = loop.create_future()
        await self.binding.control(self.committer_id, TakeBecomingPrimaryCheckpoint())
        self._reader_task = asyncio.create_task(self.read_binding())
        initial = await self._initial
        arrived = await self._startup_checkpoint
        self._open_log(1)
        # Record 0 (the initial message) is durable before checkpoint 1 is committed, and
        # so is whatever the binding sent before its checkpoint; all are forwarded after.
        records = [await self._write([initial], 0), *await self._log_pending(arrived.enqueued)]
        await self._commit_checkpoint(1, arrived)
        for item in records:
            self.forwarder.put(*item)

    async def recover(self, checkpoint: int) -> None:
        assert self.binding is not None
        started = time.perf_counter()
        data = self.files.read_checkpoint(checkpoint)
        state = IcState.decode(data, str(self.files.checkpoint_path(checkpoint)))
        self.committer_id = state.committer_id
        log.info("recovering from checkpoint %d (next seq %d)", checkpoint, state.next_seq)
        await self.binding.send(
            wire.encode_record_parts(self.committer_id, CHECKPOINT_SEQ, [Checkpoint(state.blob)])
        )
        # Replay makes the binding regenerate its outputs; those already logged are dropped.
        self.intake.received_outputs = state.binding_outputs
        self.binding.read_ahead()  # its regenerated outputs must not block the replay
        replayed = await replay_log(self.files, self.binding, state, checkpoint, repair=True)
        self.binding.stop_reading_ahead()
        self.next_seq = replayed.next_seq
        self.logged_outputs = state.logged_outputs + replayed.outputs
        self.intake.skip_below = self.logged_outputs
        self.intake.inbox = Inbox(replayed.inbox, state.senders)
        self.intake.restore_outboxes(state.outboxes)
        self.intake.restore_attached(state.attached)
        if state.attached is None:
            log.info(
                "checkpoint %d does not record the binding's AttachTo messages (an older "
                "format): its calls to other instances are not checked for them",
                checkpoint,
            )
        self._startup_checkpoint = asyncio.get_running_loop().create_future()
        self._reader_task = asyncio.create_task(self.read_binding())
        upgrade = self.config.upgrade_version
        if upgrade is not None:
            await self.binding.control(self.committer_id, UpgradeTakeCheckpoint())
        else:
            await self.binding.control(self.committer_id, TakeBecomingPrimaryCheckpoint())
        arrived = await self._startup_checkpoint
        # Its checkpoint follows every replayed record: the binding has handled them all.
        log.info(
            "the binding handled the replay %.3f s after recovery began",
            time.perf_counter() - started,
        )
        if upgrade is not None:
            await self._move_to_version(upgrade)
            self._open_log(1)
        else:
            self._open_log(replayed.last_log + 1)
        await self._commit_checkpoint(self.log_number, arrived)
        if upgrade is not None:
            self.registry.set_current_version(self.config.instance, upgrade)
            log.info("upgraded to version %d", upgrade)
        if self.intake.dropped:
            log.info("dropped %d regenerated outputs already in the log", self.intake.dropped)

    async def _move_to_version(self, version: int) -> None:
        new = InstanceFiles(self.config.data_dir, self.config.instance, version)
        new.create()
        new.acquire_lock()
        for n in new.log_numbers():  # an earlier upgrade attempt that never committed
            new.log_path(n).unlink()
        for n in new.checkpoint_numbers():
            new.checkpoint_path(n).unlink()
        self.files.release_lock()
        self.files = new

    # -- normal processing ---------------------------------------------------------------

    def stop(self) -> bool:
        """Stop reading the binding; the commit loop then logs what is pending and ends.

        Returns False before normal processing (nothing to flush yet: cancel instead).
        """
        reader = getattr(self, "_reader_task", None)
        if reader is None or (
            self._startup_checkpoint is not None and not self._startup_checkpoint.done()
        ):
            return False
        reader.cancel()
        self._eof = True
        self._wake.set()
        return True

    async def _roll(self) -> None:
        """Move to the next log and ask the binding for the checkpoint that pairs with it."""
        assert self.binding is not None
        self._open_log(self.log_number + 1)
        crashpoints.reach("ic.log.roll")  # the new log exists; no checkpoint registers it yet
        self._awaiting_checkpoint = self.log_number
        self._roll_requested = False
        log.info("rolled to log %d; asking for checkpoint %d", self.log_number, self.log_number)
        self.forwarder.control(self.committer_id, TakeCheckpoint())  # after the old log

    async def commit_loop(self) -> None:
        """Group commit: one record per round, durable before it is forwarded."""
        pipeline = CommitPipeline(self.forwarder, max_unsynced=2 * self.config.max_record_bytes)
        self._pipeline = pipeline
        self._committing = True
        try:
            await self._commit_rounds(pipeline)
            await pipeline.flush()
            await self.forwarder.flush()
        finally:
            self._committing = False
            self._pipeline = None
            self._room.set()
            await pipeline.close()

    def _input_read(self) -> None:
        """A read of link input was queued: logged and forwarded at once if it is a
        request alone (:meth:`_commit_alone`), else by the commit loop, woken for it."""
        if not self._commit_alone():
            self._wake.set()

    def _commit_alone(self) -> bool:
        """The commit loop's latency round, run from the read that brought the input (a
        loop turn and a task switch less on every awaited call's path): only while the
        loop waits with nothing else to do, nothing is in flight, and the input pending
        is small and all there is (nothing unread from the binding either). False, having
        done nothing, otherwise; a failure is left for the loop to raise."""
        pipeline = self._pipeline
        if (
            pipeline is None
            or not self._parked
            or self._wake.is_set()
            or not pipeline.idle
            or not self.intake.pending
            or self.intake.pending_bytes > _ALONE_MAX_BYTES
        ):
            return False
        assert self.writer is not None and self.binding is not None
        if self.binding.has_unread():
            return False
        body, outputs, marks = self.intake.take(self.config.max_record_bytes)
        self._room.set()
        wire_header, disk_parts = self._next_record(body, outputs, marks)
        try:
            pipeline.append_now(
                self.writer,
                disk_parts,
                ([wire_header, *body], LogPlace.next_in(self.writer, disk_parts)),
                functools.partial(self._made_durable, marks) if marks else None,
            )
        except Exception:
            self._wake.set()  # the loop raises it (pipeline.check)
            return True
        if self.writer.size >= self.trigger_bytes:
            self._roll_requested = True
        if self._roll_requested or self.intake.pending:
            self._wake.set()  # the loop rolls the log, or takes what a record left
        return True

    async def _commit_rounds(self, pipeline: CommitPipeline[Forwarded]) -> None:
        while True:
            pipeline.check()  # what a latency round from a read (_commit_alone) met
            if self._arrived is not None and self._awaiting_checkpoint is not None:
                arrived, self._arrived = self._arrived, None
                await pipeline.flush()  # input before the checkpoint must be durable
                await self._commit_checkpoint(self._awaiting_checkpoint, arrived)
                self._awaiting_checkpoint = None
            if self._roll_requested and self._awaiting_checkpoint is None:
                await pipeline.flush()  # the old log is complete before the new one starts
                await self._roll()
            if self.intake.pending:
                assert self.writer is not None and self.binding is not None
                body, outputs, marks = self.intake.take(self.config.max_record_bytes)
                self._room.set()
                wire_header, disk_parts = self._next_record(body, outputs, marks)
                # Written now, synced by the pipeline's second stage while the next record
                # is written, forwarded only once durable. A record with nothing behind it,
                # not even unread bytes on the binding's socket, is a request waiting for
                # its answer: it takes the latency path. Otherwise more input is on its
                # way, and blocking the loop on a sync would stop reading and batching it.
                alone = not self.intake.pending and not self.binding.has_unread()
                await pipeline.append(
                    self.writer,
                    disk_parts,
                    ([wire_header, *body], LogPlace.next_in(self.writer, disk_parts)),
                    functools.partial(self._made_durable, marks) if marks else None,
                    alone=alone,
                )
                if self.writer.size >= self.trigger_bytes:
                    self._roll_requested = True
                continue
            if self._eof:
                return
            self._wake.clear()
            self._parked = True
            try:
                await self._wake.wait()
            finally:
                self._parked = False

    async def _open_links(self) -> None:
        """Accept links from other coordinators and dial those this instance sends to.

        Only after recovery: the inbox (where each sender must resume) and the outboxes
        (what replay regenerated) are known only then.
        """
        registry = self.registry
        given = {name: (host, port) for name, host, port in self.config.link_to}

        async def lookup(name: str) -> tuple[str, int] | None:
            if name in given:
                return given[name]
            return await asyncio.to_thread(registry.link_address, name)

        self.links = PeerLinks(
            self.config.instance,
            self.intake,
            lookup,
            self._input_read,
            self.room_for_input,
            self.has_room,
            self.committer_id,
            settings=self.config.link_settings,
            data_dir=self.config.data_dir,
        )
        host = self.config.link_host
        port = await self.links.listen(host, self.config.link_port)
        # Published for coordinators sharing this registry, so on this machine: a wildcard
        # listener is reached at the loopback address.
        published = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        await asyncio.to_thread(registry.set_link_address, self.config.instance, published, port)
        log.info("accepting links from other coordinators on %s:%d", host, port)
        self.links.output_ready()

    async def run(self, ready: Callable[[str], None]) -> int:
        version = self.files.version
        _, receive_port, send_port = resolve_start(self.config, self.registry)
        # Whatever address an earlier incarnation published is dead; publish anew once
        # recovered (senders look it up again and wait meanwhile).
        self.registry.clear_link_address(self.config.instance)
        self.binding, listeners = await connect_binding(
            self.config.host,
            receive_port,
            send_port,
            lambda ports: ready(
                f"ready instance={self.config.instance} version={version} {ports} pid={os.getpid()}"
            ),
            open_gate(self.config.data_dir, self.config.instance, self.config.binding_auth),
        )
        log.info("binding connected; on the %s event loop", running_loop_name())
        # Every record after start-up's direct sends (checkpoint, replay) goes through it.
        self.forwarder = Forwarder(self.binding, self.stop)
        try:
            info = self.registry.get(self.config.instance)
            assert info is not None
            if info.last_checkpoint is None:
                await self.first_start()
            else:
                await self.recover(info.last_checkpoint)
            await self._open_links()
            await self.commit_loop()
        finally:
            await self.forwarder.close()
            if self.links is not None:
                await self.links.close()
            if self.writer is not None:
                self.writer.close()
            self.binding.close()
            for listener in listeners:
                listener.close()
        if self._failure is not None or self.forwarder.error is not None:
            return 1
        log.info("binding disconnected; log %d ends at seq %d", self.log_number, self.next_seq - 1)
        return 0
