"""``Immortal.local``: this incarnation's things (servers, connections), never state.

A real coordinator process: what a background task keeps in ``self.local`` is not in
the state handlers build, nor in a checkpoint, and a recovered incarnation starts with
it empty while its state comes back."""

from __future__ import annotations

import asyncio
import os

from ambrosia_py import Immortal, background, rpc
from ambrosia_py.testing import ImmortalRunner


class Keeper(Immortal):
    def __init__(self) -> None:
        self.seen: list[int] = []

    @rpc
    def saw(self, n: int) -> None:
        self.seen.append(n)
        self.effect(self.record, n)

    def record(self, n: int) -> None:  # an effect: it may use the incarnation's things
        self.local.effects.append(n)

    @background
    async def serve(self) -> None:
        self.local.pid = os.getpid()
        self.local.effects = []
        self.local.loop = asyncio.get_running_loop()  # not picklable: never checkpointed
        self.impulse.saw(len(self.seen))


def test_local_is_never_state_and_empty_after_a_restart(ambrosia: ImmortalRunner) -> None:
    keeper = ambrosia.start(Keeper, "keeper")
    keeper.wait_until(lambda s: s["seen"] == [0])
    local = keeper.dispatcher.immortal.local
    assert local.effects == [0] and local.pid == os.getpid()
    assert set(keeper.state) == {"seen"}
    keeper.kill()
    again = ambrosia.start(Keeper, "keeper")
    again.wait_until(lambda s: s["seen"] == [0, 1])  # the state came back, then one more
    fresh = again.dispatcher.immortal.local
    assert fresh is not local
    assert fresh.effects == [1]  # the replayed handler's effect did not run again
