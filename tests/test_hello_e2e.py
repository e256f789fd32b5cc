"""examples/hello end to end: two immortals, two real coordinators linked over TCP, awaited
calls with return values and exceptions, and SIGKILLs of either side at random points.

Exactly once means: the server ran ``hello`` once per name (its call counter equals the
number of names), and the client saw every reply, in order, with the greeting number the
server's single run of that call produced.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.errors import BindingError
from ambrosia_py.testing import ImmortalRunner, ServiceProcess, free_port, replay_instance, wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "hello"))

from client import HelloClient
from server import HelloServer

COUNT = 150
DEADLINE = 60.0


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


HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello"


def _run(data_dir: Path, script: str, instance: str, *options: str) -> ServiceProcess:
    """``ambrosia-py run`` of one hello instance as real processes, ready."""
    svc = ServiceProcess(str(HELLO / script), instance, data_dir, options)
    svc.start()
    svc.wait_for_log("ready ", DEADLINE)
    return svc


def _logged(service: type[Any], data_dir: Path, instance: str) -> dict[str, Any]:
    """An instance's state as its durable log has it now (an offline replay, read only)."""
    try:
        return replay_instance(service, data_dir, instance).state
    except BindingError:  # not registered yet
        return {}


def _check_every_call(data_dir: Path, count: int) -> None:
    """Per call, from both logs: the client kept each reply in order with the greeting
    number of the server's single run of that call, and the server ran each call once."""
    expected = [f"Hello, friend-{i}! (greeting #{i + 1})" for i in range(count) if i % 10 != 9]
    client = _logged(HelloClient, data_dir, "client")
    assert client["done"] and client["replies"] == expected
    assert client["refusals"] == ["no greeting for 'nobody'"] * (count // 10)
    server = _logged(HelloServer, data_dir, "server")
    assert server["calls"] == count
    assert server["greeted"] == {f"friend-{i}": 1 for i in range(count) if i % 10 != 9}


def test_hello_under_run_survives_sigkills_at_chosen_progress(tmp_path: Path) -> None:
    """Real processes throughout: once the server's log holds 300 calls its service
    process is SIGKILLed, at 700 its coordinator, at 1,100 both; each time the same
    command runs again. Then every call is checked, from both logs."""
    count = 1501
    server = _run(tmp_path, "server.py", "server")
    client = _run(tmp_path, "client.py", "client", "--count", str(count))
    try:
        for threshold, victim in ((300, "service"), (700, "coordinator"), (1100, "both")):
            wait_for(
                f"the server's log to hold {threshold} calls",
                lambda t=threshold: _logged(HelloServer, tmp_path, "server").get("calls", 0) >= t,
                DEADLINE,
                client.tail,
            )
            assert "done:" not in client.output(), "the client finished before the crash"
            server.kill(victim)  # type: ignore[arg-type]
            server = _run(tmp_path, "server.py", "server")
        client.wait_for_log("done:", DEADLINE)
        (done,) = [line for line in client.output().splitlines() if line.startswith("done:")]
        assert done.endswith(f"(greeting #{count})")
    finally:
        client.stop()
        server.stop()
    _check_every_call(tmp_path, count)


def test_hello_across_data_directories_with_link_addresses_given(tmp_path: Path) -> None:
    """As on two machines: each instance has its own data directory (and registry), so
    each coordinator is told where the other accepts links (``--link-to``), on a fixed
    ``--link-port`` that survives a restart, and both are given the cluster's secret."""
    count = 501
    server_port, client_port = free_port(), free_port()
    # The cluster's secret, shared by copying one file (each data directory would
    # otherwise make its own, and the links would not authenticate).
    secret = tmp_path / "cluster-secret"
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    server_args = ("--link-port", str(server_port), "--link-to", f"client=127.0.0.1:{client_port}")
    client_args = ("--link-port", str(client_port), "--link-to", f"server=127.0.0.1:{server_port}")
    server_args += ("--secret-file", str(secret))
    client_args += ("--secret-file", str(secret))
    server = _run(tmp_path / "a", "server.py", "server", *server_args)
    client = _run(tmp_path / "b", "client.py", "client", "--count", str(count), *client_args)
    try:
        wait_for(
            "the server's log to hold 100 calls",
            lambda: _logged(HelloServer, tmp_path / "a", "server").get("calls", 0) >= 100,
            DEADLINE,
            client.tail,
        )
        server.kill("coordinator")
        server = _run(tmp_path / "a", "server.py", "server", *server_args)
        client.wait_for_log("done:", DEADLINE)
        assert f"(greeting #{count})" in client.output()
        assert not (tmp_path / "a" / "client_0").exists()  # nothing shared but the links
    finally:
        client.stop()
        server.stop()
    client_state = _logged(HelloClient, tmp_path / "b", "client")
    assert len(client_state["replies"]) == count - count // 10
    assert client_state["replies"][-1].endswith(f"(greeting #{count})")
    assert _logged(HelloServer, tmp_path / "a", "server")["calls"] == count
