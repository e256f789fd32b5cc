"""The pytest plugin's fixtures, used as a service author would use them.

These also exercise async/await self-calls end to end through a real coordinator:
return values, a crash with calls in flight, and recovery's de-duplication of the
outputs that replay regenerates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
