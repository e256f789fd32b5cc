"""The commit gate: what a replicated primary's durable records release only once
committed, in log order (coordinator/replicas/gate.py)."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.replicas.gate import CommitGate


def make() -> tuple[CommitGate, list[str], list[int]]:
    done: list[str] = []
    durable: list[int] = []
    return CommitGate(durable.append), done, durable


def test_nothing_runs_before_its_record_is_committed() -> None:
    gate, done, durable = make()
    for seq in (1, 2, 3):
        gate.durable(seq, lambda seq=seq: done.append(f"confirm {seq}"))
        gate.forward(lambda seq=seq: done.append(f"forward {seq}"))
    assert durable == [2, 3, 4]  # each local durable end, told to the core
    assert done == []
    gate.commit(3)  # records 1 and 2 committed
    assert done == ["confirm 1", "forward 1", "confirm 2", "forward 2"]
    gate.commit(2)  # a commit point never goes back: nothing happens
    assert len(done) == 4
    gate.commit(4)
    assert done[4:] == ["confirm 3", "forward 3"]
    assert gate.held == 0


def test_a_control_message_keeps_its_place_behind_held_records() -> None:
    gate, done, _ = make()
    gate.durable(5, None)
    gate.forward(lambda: done.append("forward 5"))
    gate.control(lambda: done.append("take checkpoint"))
    gate.durable(6, None)
    gate.forward(lambda: done.append("forward 6"))
    gate.commit(6)
    assert done == ["forward 5", "take checkpoint"]
    gate.commit(7)
    assert done == ["forward 5", "take checkpoint", "forward 6"]


def test_with_nothing_held_a_control_message_goes_at_once() -> None:
    gate, done, _ = make()
    gate.control(lambda: done.append("take checkpoint"))
    assert done == ["take checkpoint"]


def test_records_made_durable_out_of_order_are_refused() -> None:
    gate, _, _ = make()
    gate.durable(4, None)
    with pytest.raises(ValueError, match="record 3 made durable after record 4"):
        gate.durable(3, None)


def test_a_record_already_committed_runs_at_once() -> None:
    gate, done, _ = make()
    gate.commit(10)  # the core counted other replicas first (k reached before here)
    gate.durable(8, lambda: done.append("confirm 8"))
    gate.forward(lambda: done.append("forward 8"))
    assert done == ["confirm 8", "forward 8"]
