"""The dispatcher's state across crashes: checkpoints, their restore, and upgrades.

:class:`DispatcherState` is the base of :class:`~.dispatcher.Dispatcher` and holds its
methods for these; the dispatcher holds the state they read and write, declared here.
A checkpoint is the state taken the last time nothing was in flight (its *base*) and the
incoming messages handled since (its *tail*): see :mod:`checkpoint`.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Coroutine
from typing import Any

import attrs
import cloudpickle

from .. import wire
from ..ingress.keys import IngressCall, KeyTable
from ..wire import IncomingReturnValue, IncomingRpc, Message
from .checkpoint import Snapshot, decode_snapshot, encode_snapshot
from .errors import BindingError, CheckpointFormatError
from .files import sync_written
from .immortal import CallFuture, Immortal, MethodSpec

__all__ = ["DispatcherState", "Mode", "ReplyTo", "Task"]

log = logging.getLogger("ambrosia_py.binding")
_PRIVATE = "_ambrosia_"
ReplyTo = tuple[str, int] | IngressCall | None  # an async/await caller, an ingress call, none


class Mode(enum.Enum):
    STARTING = "starting"
    RECOVERING = "recovering"
    PRIMARY = "primary"


class Task:
    """A suspended ``async def`` handler."""

    __slots__ = ("coro", "issued", "reply_to", "spec", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, Any], spec: MethodSpec, reply_to: ReplyTo) -> None:
        self.coro = coro
        self.spec = spec
        self.reply_to = reply_to
        self.waiting_on: CallFuture | None = None
        self.issued: set[int] = set()  # calls it made and has not awaited yet


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


class DispatcherState:
    """Checkpoints, restore and upgrade, for :class:`~.dispatcher.Dispatcher`."""

    cls: type[Immortal]
    upgrade_to: type[Immortal] | None
    immortal: Immortal
    mode: Mode
    keys: KeyTable
    _call_seq: int
    _attached: set[str]
    _waiting: dict[int, Task]
    _issued: dict[int, tuple[Task, CallFuture]]
    _early: dict[int, IncomingReturnValue]
    _suppress: bool
    _base: Snapshot | None
    _tail: list[Message]

    def _attach(self, immortal: Immortal) -> Immortal:
        immortal.__dict__[_PRIVATE + "dispatcher"] = self
        return immortal

    def _incoming(self, msg: IncomingRpc | IncomingReturnValue, seq: int | None) -> None:
        raise NotImplementedError  # the dispatcher's: a call or a reply, handled

    def state(self) -> dict[str, Any]:
        """The immortal's state: its attributes, but for the framework's own."""
        return {k: v for k, v in self.immortal.__dict__.items() if not k.startswith(_PRIVATE)}

    def _snapshot_now(self) -> Snapshot:
        return Snapshot(
            _class_name(type(self.immortal)),
            type(self.immortal).version,
            cloudpickle.loads(cloudpickle.dumps(self.state())),  # a copy, not a reference
            self._call_seq,
            frozenset(self._attached),
            ingress=self.keys.copy(),
        )

    def checkpoint(self) -> bytes:
        """The checkpoint blob for the state right now (see :mod:`checkpoint`).

        Sealed state files written while pickling it (``files.py``) are made durable
        (their directory fsynced, once) before the blob leaves.
        """
        blob = self._checkpoint_blob()
        sync_written()
        return blob

    def _checkpoint_blob(self) -> bytes:
        if not self._waiting:
            self._base = self._snapshot_now()
            self._tail = []
            return encode_snapshot(self._base)
        assert self._base is not None, "a suspended handler implies an earlier checkpoint"
        tail = tuple(wire.encode_message(m) for m in self._tail)
        return encode_snapshot(
            Snapshot(
                self._base.class_name,
                self._base.class_version,
                self._base.state,
                self._base.call_seq,
                self._base.attached,
                tail,
                ingress=self._base.ingress,
            )
        )

    def restore(self, blob: bytes | bytearray | memoryview) -> None:
        """Load a checkpoint: its state, then its tail replayed with outputs suppressed."""
        snap = decode_snapshot(blob)
        cls = type(self.immortal)
        if snap.class_name != _class_name(cls) and snap.class_version == cls.version:
            log.warning("checkpoint of %s restored into %s", snap.class_name, _class_name(cls))
        if snap.class_version != cls.version:
            raise CheckpointFormatError(
                f"checkpoint of {snap.class_name} version {snap.class_version}, but the service "
                f"is version {cls.version}: run the old code and upgrade with --upgrade-version"
            )
        immortal = cls.__new__(cls)
        immortal.__dict__.update(cloudpickle.loads(cloudpickle.dumps(snap.state)))
        self.immortal = self._attach(immortal)
        self._call_seq = snap.call_seq
        self._attached = set(snap.attached)
        self._waiting = {}
        self._issued = {}
        self._early = {}
        self.keys = snap.ingress.copy() if snap.ingress is not None else KeyTable()
        self._base = attrs.evolve(snap, tail=())
        self._tail = []
        self.mode = Mode.RECOVERING
        self._suppress = True
        try:
            for raw in snap.tail:
                msg, _ = wire.decode_message(raw)
                if not isinstance(msg, IncomingRpc | IncomingReturnValue):
                    raise CheckpointFormatError(
                        f"checkpoint tail holds a {type(msg).__name__}, not an incoming message"
                    )
                self._incoming(msg, None)
        finally:
            self._suppress = False

    def _upgrade(self) -> None:
        new = self.upgrade_to
        if new is None:
            raise BindingError("the coordinator asked for an upgrade, but no new code was given")
        if self._waiting:
            raise BindingError(
                f"cannot upgrade with {len(self._waiting)} handlers awaiting replies: their "
                "coroutines belong to the old code"
            )
        old = type(self.immortal)
        state = new.upgrade_state(self.state(), old.version)
        immortal = new.__new__(new)
        immortal.__dict__.update(state)
        self.immortal = self._attach(immortal)
        self.cls = new
        self.upgrade_to = None
        self._base = self._snapshot_now()
        self._tail = []
        log.info("upgraded %s v%d -> %s v%d", old.__name__, old.version, new.__name__, new.version)
