"""examples/hello end to end: two immortals, two real coordinators linked over TCP, awaited
calls with return values and exceptions, and SIGKILLs of either side at random points.

Exactly once means: the server ran ``hello`` once per name (its call counter equals the
number of names), and the client saw every reply, in order, with the greeting number the
server's single run of that call produced.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.testing import ImmortalRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "hello"))

from client import HelloClient
from server import HelloServer

COUNT = 150


def _expected() -> tuple[list[str], list[str]]:
    replies, refusals = [], []
    for i in range(COUNT):
        if i % 10 == 9:
            refusals.append("no greeting for 'nobody'")
        else:
            replies.append(f"Hello, friend-{i}! (greeting #{i + 1})")
    return replies, refusals


def _progress(state: dict[str, Any]) -> int:
    return len(state["replies"]) + len(state["refusals"])


def test_hello_without_crashes(tmp_path: Path) -> None:
    runner = ImmortalRunner(tmp_path)
    try:
        server = runner.start(HelloServer, "server")
        client = runner.start(HelloClient, "client", count=COUNT)
        state = client.wait_until(lambda s: s["done"])
        assert (state["replies"], state["refusals"]) == _expected()
        assert server.state["calls"] == COUNT
    finally:
        runner.close()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_hello_is_exactly_once_across_sigkills_of_either_side(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    runner = ImmortalRunner(tmp_path)
    try:
        running = {
            "server": runner.start(HelloServer, "server"),
            "client": runner.start(HelloClient, "client", count=COUNT),
        }
        starts = {
            "server": lambda: runner.start(HelloServer, "server"),
            "client": lambda: runner.start(HelloClient, "client", count=COUNT),
        }
        for threshold in sorted(rng.sample(range(3, COUNT - 5), 6)):
            victim = rng.choice(["server", "client"])
            # Progress is only visible through the client; a server restarting or a client
            # recovering shows the state it recovered, which only moves forward.
            running["client"].wait_until(lambda s, t=threshold: _progress(s) >= t)
            running[victim].kill()
            running[victim] = starts[victim]()
        state = running["client"].wait_until(lambda s: s["done"])
        assert (state["replies"], state["refusals"]) == _expected()
        server_state = running["server"].wait_until(lambda s: s["calls"] >= COUNT)
        assert server_state["calls"] == COUNT
        assert server_state["greeted"] == {f"friend-{i}": 1 for i in range(COUNT) if i % 10 != 9}
    finally:
        runner.close()
