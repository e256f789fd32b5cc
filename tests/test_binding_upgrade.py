"""Upgrading a service: replay with the old code, convert the state, go on with the new."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import BindingError
from ambrosia_py.binding.dispatcher import Dispatcher, Mode
from ambrosia_py.wire import (
    Checkpoint,
    IncomingRpc,
    LogRecord,
    Message,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    UpgradeService,
    UpgradeTakeCheckpoint,
)


class CounterV0(Immortal):
    def __init__(self) -> None:
        self.count = 0

    @rpc(id=1)
    def add(self, n: int) -> None:
        self.count += n


class CounterV1(Immortal):
    version = 1

    def __init__(self) -> None:
        self.total = 0
        self.adds = 0

    @classmethod
    def upgrade_state(cls, state: dict[str, Any], from_version: int) -> dict[str, Any]:
        assert from_version == 0
        return {"total": state["count"], "adds": 0}

    @rpc(id=1)
    def add(self, n: int) -> None:
        self.total += n
        self.adds += 1


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def add(n: int) -> IncomingRpc:
    return IncomingRpc(1, RpcType.FORK, pickle.dumps(((n,), {})))


def history() -> bytes:
    """A V0 checkpoint after adding 5."""
    d = Dispatcher(CounterV0, "c")
    d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    d.handle(rec(1, add(5)))
    return d.checkpoint()


def test_upgrade_take_checkpoint_replays_old_code_then_converts() -> None:
    d = Dispatcher(CounterV0, "c", upgrade_to=CounterV1)
    d.handle(rec(-2, Checkpoint(history())))
    d.handle(rec(2, add(2)))  # replayed with the old code: count 7
    (cp,) = d.handle(rec(-1, UpgradeTakeCheckpoint()))
    assert isinstance(cp, Checkpoint) and d.mode is Mode.PRIMARY
    assert isinstance(d.immortal, CounterV1)
    assert (d.immortal.total, d.immortal.adds) == (7, 0)
    d.handle(rec(3, add(1)))
    assert (d.immortal.total, d.immortal.adds) == (8, 1)
    # The new checkpoint is a V1 checkpoint: V1 code restores it directly.
    again = Dispatcher(CounterV1, "c")
    again.handle(rec(-2, Checkpoint(cp.blob)))
    assert isinstance(again.immortal, CounterV1) and again.immortal.total == 7


def test_what_if_upgrade_service_replays_history_against_the_new_code() -> None:
    d = Dispatcher(CounterV0, "c", upgrade_to=CounterV1)
    d.handle(rec(-2, Checkpoint(history())))
    assert d.handle(rec(-1, UpgradeService())) == []
    d.handle(rec(2, add(2)))
    assert isinstance(d.immortal, CounterV1)
    assert (d.immortal.total, d.immortal.adds) == (7, 1)
    assert d.mode is Mode.RECOVERING  # what-if never becomes primary


def test_an_old_checkpoint_is_refused_by_new_code_without_an_upgrade() -> None:
    with pytest.raises(Exception, match="version 0, but the service is version 1"):
        Dispatcher(CounterV1, "c").handle(rec(-2, Checkpoint(history())))


def test_an_upgrade_without_new_code_is_an_error() -> None:
    d = Dispatcher(CounterV0, "c")
    d.handle(rec(-2, Checkpoint(history())))
    with pytest.raises(BindingError, match="no new code was given"):
        d.handle(rec(-1, UpgradeTakeCheckpoint()))
