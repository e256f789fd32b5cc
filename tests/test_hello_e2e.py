"""examples/hello end to end: two immortals, two real coordinators linked over TCP, awaited
calls with return values and exceptions, and SIGKILLs of either side at random points.

Exactly once means: the server ran ``hello`` once per name (its call counter equals the
number of names), and the client saw every reply, in order, with the greeting number the
server's single run of that call produced.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.testing import ImmortalRunner
from tests.fake_binding import free_port

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


class _Run:
    """``ambrosia-py run`` of one hello instance as real processes: service and coordinator."""

    def __init__(self, data_dir: Path, script: str, instance: str, *options: str) -> None:
        folder = Path(__file__).resolve().parents[1] / "examples" / "hello"
        self.proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "ambrosia_py.cli", "run", str(folder / script)),
                *("--instance", instance, "--data-dir", str(data_dir), *options),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self.ic_pid = 0
        self.ready = threading.Event()
        self.done = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        assert self.ready.wait(DEADLINE), "".join(self.lines)

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            if line.startswith("ready "):
                fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                self.ic_pid = int(fields["coordinator_pid"])
                self.ready.set()
            if line.startswith("done:"):
                self.done.set()
        self.ready.set()

    def kill(self, pid: int) -> None:
        os.kill(pid, signal.SIGKILL)
        # Either way both processes end: a coordinator stops when its binding goes, and a
        # binding when its coordinator goes.
        self.proc.wait(timeout=DEADLINE)
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            try:
                os.kill(self.ic_pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.01)  # polling for a process to end, with a deadline
        raise AssertionError(f"coordinator {self.ic_pid} did not stop")

    def stop(self) -> None:
        for pid in (self.proc.pid, self.ic_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)


def test_hello_under_run_survives_sigkill_of_the_server_service_and_coordinator(
    tmp_path: Path,
) -> None:
    """Real processes throughout: the server's service process is SIGKILLed, then its
    coordinator; each time the same command runs again; the client finishes with every
    call run once (the last reply's greeting number is the number of calls)."""
    count = 1501
    server = _Run(tmp_path, "server.py", "server")
    client = _Run(tmp_path, "client.py", "client", "--count", str(count))
    try:
        for victim in ("service", "coordinator"):
            assert not client.done.is_set(), "the client finished before the crash"
            server.kill(server.proc.pid if victim == "service" else server.ic_pid)
            server = _Run(tmp_path, "server.py", "server")
            time.sleep(0.3)  # let calls flow again before the next kill (pacing, not sync)
        assert client.done.wait(DEADLINE), "".join(client.lines[-20:])
        (done,) = [line for line in client.lines if line.startswith("done:")]
        assert done.startswith(f"done: {count - count // 10} replies, {count // 10} refusals")
        assert done.rstrip().endswith(f"(greeting #{count})")
    finally:
        client.stop()
        server.stop()


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
    server = _Run(tmp_path / "a", "server.py", "server", *server_args)
    client = _Run(tmp_path / "b", "client.py", "client", "--count", str(count), *client_args)
    try:
        server.kill(server.ic_pid)
        server = _Run(tmp_path / "a", "server.py", "server", *server_args)
        assert client.done.wait(DEADLINE), "".join(client.lines[-20:])
        (done,) = [line for line in client.lines if line.startswith("done:")]
        assert done.rstrip().endswith(f"(greeting #{count})")
        assert not (tmp_path / "a" / "client_0").exists()  # nothing shared but the links
    finally:
        client.stop()
        server.stop()
