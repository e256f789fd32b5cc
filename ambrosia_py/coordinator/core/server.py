"""The Immortal Coordinator process: the two binding sockets, start-up, and the wiring.

This is the thin asyncio adapter around :mod:`.intake` (bytes in, records and control
events out), :mod:`.committer` (the log: group commit, rolls, checkpoints),
:mod:`..storage.files` (files) and :mod:`..registry.interface` (metadata). The rules it keeps
(seed 002, *Communication Protocols*; reference ambrosia.md, *Start-up* and *The two local
sockets*):

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
* Normal processing: each read from the binding goes into the intake as it arrives (a
  callback on the binding's socket); the control events it yields are dispatched here,
  and the committer is woken for the input, which it logs, and forwards only once it is
  durable. The binding only ever sees durable input. Link input reaches the intake
  through :class:`~..links.peers.PeerLinks`, which tells the committer after each read.
* When the binding disconnects, pending input is made durable and the coordinator exits.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import wire
from ...eventloop import running_loop_name
from ...wire import (
    CHECKPOINT_SEQ,
    Checkpoint,
    TakeBecomingPrimaryCheckpoint,
    UpgradeTakeCheckpoint,
)
from ...wire.records import encode_record_parts
from ..links.peers import PeerLinks
from ..links.protocol import Inbox
from ..registry.interface import InstanceRegistry, RegistryError
from ..registry.publish import advertised_host
from ..replicas.follow import Follower
from ..storage.files import InstanceFiles
from ..storage.replay import replay_log
from .binding_auth import open_gate
from .binding_link import BindingLink, connect_binding
from .checkpoint import IcState
from .committer import Committer
from .config import BindingLeftError, CoordinatorConfig, CoordinatorError, resolve_start
from .events import CheckpointArrived, CheckpointRequested, InitialArrived
from .forwarding import Forwarder, OutboxGate
from .intake import Intake

if TYPE_CHECKING:
    from ..registry.primary import Term
    from ..replicas.node import ReplicaNode

__all__ = ["Coordinator"]

log = logging.getLogger("ambrosia_py.coordinator")


class Coordinator:
    def __init__(self, config: CoordinatorConfig, registry: InstanceRegistry, files: InstanceFiles):
        self.config = config
        self.registry = registry
        self.intake = Intake(config.instance, config.link_settings.max_outbox_bytes)
        self.committer = Committer(config, registry, files, self.intake)
        self._outbox_gate = OutboxGate(self.intake.outbox_budget, self.intake.outboxes)
        self.binding: BindingLink | None = None
        self._startup_checkpoint: asyncio.Future[CheckpointArrived] | None = None
        self._initial: asyncio.Future[None] | None = None
        self._failure: BaseException | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self.links: PeerLinks | None = None
        self.replicas: ReplicaNode | None = None  # with --replica: this replica's side
        self._follower: Follower | None = None  # while its binding follows as a secondary's

    @property
    def files(self) -> InstanceFiles:
        """The instance's files (of the version it upgraded to, once it did)."""
        return self.committer.files

    # -- reading the binding -------------------------------------------------------------

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
            if self.links is not None and (
                self._outbox_gate.paused or not self.committer.has_room()
            ):
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
            self.committer.end_input()
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
        intake = self.intake
        intake.receive_data(data)
        if not data:
            return False
        event = intake.next_event()
        woken = event is not None
        while event is not None:
            if isinstance(event, CheckpointRequested):
                self.committer.request_roll()
            elif isinstance(event, CheckpointArrived):
                self._checkpoint_arrived(event)
            elif isinstance(event, InitialArrived):
                if self._initial is None or self._initial.done():
                    raise wire.MalformedMessageError("InitialMessage outside a first start")
                self._initial.set_result(None)
            event = intake.next_event()
        if self.links is not None:
            self.links.output_ready()
        if woken or intake.pending:  # not for output alone: it goes by link
            self.committer.wake()
        return True

    def _checkpoint_arrived(self, event: CheckpointArrived) -> None:
        if self._startup_checkpoint is not None and not self._startup_checkpoint.done():
            self._startup_checkpoint.set_result(event)
        elif self._follower is not None and self._follower.checkpoint_arrived(event):
            pass
        elif not self.committer.checkpoint_arrived(event):
            raise wire.MalformedMessageError("a checkpoint nobody asked for")

    async def _room_for_binding(self) -> None:
        await self._outbox_gate.wait()
        await self.committer.room_for_input()

    # -- start-up ------------------------------------------------------------------------

    async def first_start(self) -> None:
        assert self.binding is not None
        # run_coordinator cleared what an interrupted first start left, or refused.
        committer_id = secrets.randbelow(2**31 - 1) + 1
        self.intake.committer_id = committer_id
        self.registry.set_committer_id(self.config.instance, committer_id)
        log.info("first start, committer id %d", committer_id)
        loop = asyncio.get_running_loop()
        self._initial = loop.create_future()
        self._startup_checkpoint = loop.create_future()
        await self.binding.control(committer_id, TakeBecomingPrimaryCheckpoint())
        self._reader_task = asyncio.create_task(self.read_binding())
        await self._initial
        arrived = await self._startup_checkpoint
        self.committer.open_log(1)
        # Record 0 (the initial message) is durable before checkpoint 1 is committed, and
        # so is whatever the binding sent before its checkpoint; all are forwarded after.
        self.committer.hold_forwarding()
        await self.committer.commit_checkpoint(1, arrived)
        self.committer.release_forwarding()

    async def recover(self, checkpoint: int) -> None:
        assert self.binding is not None
        started = time.perf_counter()
        files = self.committer.files
        data = files.read_checkpoint(checkpoint)
        state = IcState.decode(data, str(files.checkpoint_path(checkpoint)))
        intake = self.intake
        intake.committer_id = state.committer_id
        log.info("recovering from checkpoint %d (next seq %d)", checkpoint, state.next_seq)
        await self.binding.send(
            encode_record_parts(state.committer_id, CHECKPOINT_SEQ, [Checkpoint(state.blob)])
        )
        # Replay makes the binding regenerate its outputs; those already logged are dropped.
        intake.received_outputs = state.binding_outputs
        self.binding.read_ahead()  # its regenerated outputs must not block the replay
        replayed = await replay_log(files, self.binding, state, checkpoint, repair=True)
        self.binding.stop_reading_ahead()
        intake.next_seq = replayed.next_seq
        intake.logged_outputs = state.logged_outputs + replayed.outputs
        intake.skip_below = intake.logged_outputs
        intake.inbox = Inbox(replayed.inbox, state.senders)
        intake.restore_outboxes(state.outboxes)
        intake.restore_attached(state.attached)
        if state.attached is None:
            log.info(
                "checkpoint %d does not record the binding's AttachTo messages (an older "
                "format): its calls to other instances are not checked for them",
                checkpoint,
            )
        self._reader_task = asyncio.create_task(self.read_binding())
        await self._become_primary(replayed.last_log, started)

    async def _become_primary(self, last_log: int, started: float) -> None:
        """The binding has been sent every logged record: tell it it is primary (or to
        upgrade), and write its answer as the checkpoint of the next log."""
        assert self.binding is not None
        intake = self.intake
        self._startup_checkpoint = asyncio.get_running_loop().create_future()
        node = self.replicas
        # A replica's binding may have upgraded already, following (replicas/follow.py).
        upgrade = self.config.upgrade_version
        if node is not None and not node.upgrade_pending:
            upgrade = None
        if upgrade is not None:
            await self.binding.control(intake.committer_id, UpgradeTakeCheckpoint())
        else:
            await self.binding.control(intake.committer_id, TakeBecomingPrimaryCheckpoint())
        arrived = await self._startup_checkpoint
        # Its checkpoint follows every replayed record: the binding has handled them all.
        log.info(
            "the binding handled the replay %.3f s after recovery began",
            time.perf_counter() - started,
        )
        if upgrade is not None:
            self.committer.move_to_version(upgrade)
            if node is not None:
                node.moved_to(self.committer.files, intake.committer_id, intake.next_seq)
            self.committer.open_log(1)
        else:
            if node is not None:  # in the files it follows in (a version's it moved to)
                self.committer.adopt_files(node.disk.files)
            self.committer.open_log(last_log + 1)
        await self.committer.commit_checkpoint(self.committer.log_number, arrived)
        if upgrade is not None:
            self.registry.set_current_version(self.config.instance, upgrade)
            log.info("upgraded to version %d", upgrade)
        if intake.dropped:
            log.info("dropped %d regenerated outputs already in the log", intake.dropped)

    async def _start_replica(self, node: ReplicaNode, never_started: bool) -> None:
        """With replicas: follow as a secondary until this replica takes a term (replica 0
        founds an instance never started), its binding replaying the log as it is
        committed (``replicas/follow.py``); once the log before the term's start is
        committed, finish that replay and go on as primary (``coordinator/replicas``)."""
        self.committer.on_checkpoint = node.checkpoint_written
        node.on_taken = self.committer.checkpoint_taken
        node.outbox_trims = self.intake.outbox_trims
        if node.replica == 0 and never_started and node.disk.state.checkpoint is None:
            term = await node.found()
            # Numbered from 1: the founding checkpoint stands past every empty log, so a
            # new replica is always sent a checkpoint before any record.
            self.intake.next_seq = 1
            await self.first_start()
            node.serving = True  # its binding has the first start's record
            node.founded(term, 1)
            self.committer.replication = node
            await node.until_committed()
            return
        assert self.binding is not None
        follower = Follower(self.binding, self.intake, node.disk, node.commit_checkpoint)
        self._follower = follower
        node.attach(follower)
        node.trigger_bytes = self.committer.trigger_bytes
        self._reader_task = asyncio.create_task(self.read_binding())
        if node.disk.state.checkpoint is not None:
            follower.start()  # else once a checkpoint is installed
        while True:
            term = await self._until_primary(node, follower)
            node.lead(term)
            if await node.until_committed():
                break
        started = time.perf_counter()
        await follower.finish(node.term_start)
        node.follower = self._follower = None
        state = follower.state
        assert state is not None and node.disk.log is not None
        self.intake.inbox = Inbox(follower.inbox, state.senders)
        self.committer.replication = node
        # Each replica numbers its own files; the registry's checkpoint number is the
        # instance's and never goes back: the new log comes after both.
        info = await asyncio.to_thread(self.registry.get, self.config.instance)
        recorded = 0 if info is None or info.last_checkpoint is None else info.last_checkpoint
        await self._become_primary(max(node.disk.log.log_number, recorded), started)

    async def _until_primary(self, node: ReplicaNode, follower: Follower) -> Term:
        """:meth:`ReplicaNode.until_primary`, unless the binding goes first (then this
        coordinator stops, as it does when its binding leaves at any other time) or the
        replay fails."""
        waiting = asyncio.ensure_future(node.until_primary())
        reader = self._reader_task
        assert reader is not None
        try:
            # The replay's end, also of one started after this began (a new replica's,
            # once a checkpoint is installed).
            watched: list[asyncio.Future[Any]] = [waiting, reader, follower.ended]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            if waiting.done():
                return waiting.result()
            if reader.done():
                if self._failure is not None:
                    raise self._failure
                raise BindingLeftError(
                    f"the binding left while replica {node.replica} was a secondary"
                )
            follower.ended.result()  # raises what stopped it
            raise CoordinatorError("the binding's replay stopped")
        finally:
            waiting.cancel()

    # -- normal processing ---------------------------------------------------------------

    def stop(self) -> bool:
        """Stop reading the binding; the commit loop then logs what is pending and ends.

        Returns False before normal processing (nothing to flush yet: cancel instead).
        """
        reader = self._reader_task
        if (
            reader is None
            or self._follower is not None
            or (self._startup_checkpoint is not None and not self._startup_checkpoint.done())
        ):
            return False
        reader.cancel()
        self.committer.end_input()
        return True

    async def _open_links(self) -> None:
        """Accept links from other coordinators and dial those this instance sends to.

        Only after recovery: the inbox (where each sender must resume) and the outboxes
        (what replay regenerated) are known only then.
        """
        registry = self.registry
        given = {name: (host, port) for name, host, port in self.config.link_to}

        said: dict[str, str] = {}  # per peer, the last lookup error logged

        async def lookup(name: str) -> tuple[str, int] | None:
            # None (nothing to dial now) also when the registry cannot answer, so the
            # link's send loop backs off and asks again instead of ending for good.
            if name in given:
                return given[name]
            try:
                found = await asyncio.to_thread(registry.link_address, name)
            except RegistryError as exc:
                if said.get(name) != str(exc):
                    said[name] = str(exc)
                    log.warning("looking up %r's link address: %s", name, exc)
                return None
            said.pop(name, None)
            return found

        committer = self.committer
        self.links = committer.links = PeerLinks(
            self.config.instance,
            self.intake,
            lookup,
            committer.input_read,
            committer.room_for_input,
            committer.has_room,
            self.intake.committer_id,
            settings=self.config.link_settings,
            data_dir=self.config.data_dir,
        )
        host = self.config.link_host
        port = await self.links.listen(host, self.config.link_port)
        # Published for coordinators sharing this registry (registry/publish.py: a
        # wildcard listener under the machine's name, or --advertise-host).
        published = advertised_host(host, self.config.advertise_host)
        await asyncio.to_thread(registry.set_link_address, self.config.instance, published, port)
        log.info("accepting links from other coordinators on %s:%d", host, port)
        self.links.output_ready()

    async def run(self, ready: Callable[[str], None]) -> int:
        version = self.files.version
        _, receive_port, send_port = resolve_start(self.config, self.registry)
        # Whatever address an earlier incarnation published is dead; publish anew once
        # recovered (senders look it up again and wait meanwhile).
        if self.replicas is None:  # a replica's primary may be live elsewhere
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
        forwarder = Forwarder(self.binding, self.stop)
        self.committer.start(self.binding, forwarder)
        try:
            info = self.registry.get(self.config.instance)
            assert info is not None
            if self.replicas is not None:
                await self._start_replica(self.replicas, info.last_checkpoint is None)
            elif info.last_checkpoint is None:
                await self.first_start()
            else:
                await self.recover(info.last_checkpoint)
            await self._open_links()
            if self.replicas is not None:
                await self.replicas.guard(self.committer.run())
            else:
                await self.committer.run()
        finally:
            await self.committer.close()  # first: its sync stage forwards
            await forwarder.close()
            if self.links is not None:
                await self.links.close()
            self.binding.close()
            for listener in listeners:
                listener.close()
        if self._failure is not None or forwarder.error is not None:
            return 1
        log.info(
            "binding disconnected; log %d ends at seq %d",
            self.committer.log_number,
            self.intake.next_seq - 1,
        )
        return 0
