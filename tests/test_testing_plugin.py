"""The pytest plugin's fixtures, used as a service author would use them.

These also exercise async/await self-calls end to end through a real coordinator:
return values, a crash with calls in flight, and recovery's de-duplication of the
outputs that replay regenerates.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.testing import ImmortalRunner, ReplayResult


class Tally(Immortal):
    def __init__(self) -> None:
        self.started: list[int] = []
        self.items: list[int] = []
        self.answers: list[int] = []

    @rpc
    def add(self, n: int) -> int:
        self.items.append(n)
        return len(self.items)

    @rpc
    async def add_via_self(self, n: int) -> None:
        self.started.append(n)
        position: int = await self.me.add(n)  # an async/await self-call through the IC
        self.answers.append(position)


def test_impulses_survive_a_sigkill(ambrosia: ImmortalRunner) -> None:
    svc = ambrosia.start(Tally)
    for i in range(1, 21):
        svc.impulse.add(i)
    svc.wait_until(lambda s: len(s["items"]) == 20)
    svc.kill()
    again = ambrosia.start(Tally)
    assert again.state["items"] == list(range(1, 21))


def test_impulses_waited_for_until_logged_survive_a_sigkill(ambrosia: ImmortalRunner) -> None:
    """Sent, then killed at once: only the logged ones are kept, so wait for those."""
    svc = ambrosia.start(Tally)
    for i in range(100):
        svc.impulse.add(i)
    assert svc.wait_logged() == 100
    svc.kill()  # SIGKILL the coordinator (a real process); the binding goes with it
    assert svc.unlogged_at_kill == 0
    again = ambrosia.start(Tally)
    assert again.state["items"] == list(range(100))  # every one, once, in order


def test_timeouts_say_what_was_waited_for_and_what_a_kill_lost(ambrosia: ImmortalRunner) -> None:
    """Impulses sent while the coordinator cannot log them (stopped), then a kill: the
    waits that time out name their condition and the impulses, not the whole state."""
    svc = ambrosia.start(Tally)
    for i in range(1000):  # a state whose repr is kilobytes long
        svc.impulse.add(i)
    svc.wait_logged()
    os.kill(svc.ic.pid, signal.SIGSTOP)  # nothing more is logged
    for i in range(3):
        svc.impulse.add(i)
    with pytest.raises(TimeoutError) as waited:
        svc.wait_logged(timeout=0.2)
    assert "tally's 1003 impulses to be logged" in str(waited.value)
    assert "1000 logged so far" in str(waited.value)
    svc.kill()  # a stopped process dies of SIGKILL too
    assert svc.unlogged_at_kill == 3

    again = ambrosia.start(Tally)
    with pytest.raises(TimeoutError) as waited:
        again.wait_until(lambda s: len(s["items"]) == 1003, timeout=0.2)
    message = str(waited.value)
    assert message.startswith("tally: timed out after 0.2 s waiting for the condition at ")
    assert 'again.wait_until(lambda s: len(s["items"]) == 1003, timeout=0.2)' in message
    assert "items=[0, 1, 2, 3, 4, 5, ...] (1000 items)" in message
    assert "killed with 3 impulses not yet seen logged" in message
    assert "wait_logged() before kill()" in message
    assert len(message) < 2000, message  # not a dump of the state


def test_awaited_self_calls_are_exactly_once_across_a_crash(
    ambrosia: ImmortalRunner, ambrosia_replay: Callable[..., ReplayResult]
) -> None:
    svc = ambrosia.start(Tally)
    for i in range(1, 201):
        svc.impulse.add_via_self(i)
    svc.wait_until(lambda s: len(s["answers"]) >= 20)  # crash with calls still in flight
    svc.kill()

    again = ambrosia.start(Tally)

    def settled(s: dict[str, Any]) -> bool:
        return bool(s["started"]) and len(s["answers"]) == len(s["started"])

    state = again.wait_until(settled)
    n = len(state["started"])
    assert state["started"] == list(range(1, n + 1))  # a prefix of the impulses, in order
    assert state["items"] == state["started"]  # every awaited call ran exactly once
    assert state["answers"] == list(range(1, n + 1))  # and its return value came back
    again.stop()
    result = ambrosia_replay(Tally, "tally", verify=True)
    assert result.divergence is None
    assert result.state["items"] == state["items"]
