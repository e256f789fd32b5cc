"""Every crash point walked: a real process SIGKILLs itself exactly there, recovers, and
every call is applied exactly once (``ambrosia_py/crashpoints.py``).

The workload: instance ``a`` takes ``transfer(token)`` calls through its ingress, from
callers that retry each with its own key until answered (docs/ingress.md). A transfer
debits ``a`` once and awaits ``b.credit(token)`` across the link between their
coordinators, so every call crosses both coordinators' logs, a link each way, both
bindings and a checkpoint's tail while it waits. Logs roll every few kilobytes
(``AMBROSIA_LOG_TRIGGER_MB``), so checkpoints are taken all along.

For each point, ``a`` runs with the point armed: ``ic.*`` points kill its coordinator,
``binding.*`` points its service process, at a count that lands mid-workload. The test
sees the death (the marker line naming the point and the dead pid, and the exit signal
as the parent saw it), starts ``a`` again without the point, lets the callers finish, and
checks against its own record of the answers: every token answered was debited exactly
once and credited exactly once, nothing else was applied, each answer is the one its
single application produced, and both services' own counters agree.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import crashpoints
from ambrosia_py.binding.run_cli import load_service
from ambrosia_py.client import Client
from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing.processes import wait_for

SERVICE = """
from ambrosia_py import Immortal, rpc


class Ledger(Immortal):
    class Options:
        peer: str = ""  # where transfers are credited (first start; logged by setup)

    def __init__(self) -> None:
        self.peer = ""
        self.order = 0  # transfers debited here
        self.debited: dict[str, int] = {}  # token -> times debited
        self.answers: dict[str, list[int]] = {}  # token -> [its order, b's credit count]
        self.credits = 0  # credits applied here
        self.credited: dict[str, int] = {}  # token -> times credited

    def on_first_start(self) -> None:
        self.me.setup.fork(self.options.peer)

    @rpc
    def setup(self, peer: str) -> None:
        self.peer = peer

    @rpc
    async def transfer(self, token: str) -> list[int]:
        self.order += 1
        order = self.order
        self.debited[token] = self.debited.get(token, 0) + 1
        credit: int = await self.proxy(self.peer, Ledger).credit(token)
        self.answers[token] = [order, credit]
        return [order, credit]

    @rpc
    def credit(self, token: str) -> int:
        self.credits += 1
        self.credited[token] = self.credited.get(token, 0) + 1
        return self.credits

    @rpc
    def report(self) -> dict[str, object]:
        return {
            "order": self.order,
            "debited": dict(self.debited),
            "answers": dict(self.answers),
            "credits": self.credits,
            "credited": dict(self.credited),
        }
"""

# (point, the time it is reached when the process kills itself, the instance armed):
# past start-up, with transfers in flight. Checkpoint points count the first start's
# checkpoint as 1, and the log rolls every ~1 KB, about every ten transfers. Every
# point is walked on ``a`` (which takes ingress calls, sends calls over its link and
# receives their replies); the receiving side of a link is walked on ``b`` too.
WALKS: list[tuple[str, int, str]] = [
    ("ic.log.before_write", 20, "a"),
    ("ic.log.mid_write", 20, "a"),
    ("ic.log.before_sync", 20, "a"),
    ("ic.log.after_sync", 20, "a"),
    ("ic.log.roll", 2, "a"),
    ("ic.checkpoint.mid_write", 3, "a"),
    ("ic.checkpoint.before_commit", 3, "a"),
    ("ic.forward.mid_send", 20, "a"),
    ("ic.link.mid_send", 15, "a"),
    ("binding.checkpoint", 3, "a"),
    ("binding.before_effects", 20, "a"),
    ("binding.mid_send", 20, "a"),
    ("ic.log.after_sync", 10, "b"),
    ("ic.link.mid_send", 10, "b"),
    ("binding.mid_send", 10, "b"),
    # In the first start: checkpoint 1 written but never committed (the next start is a
    # first start again), and the binding's first checkpoint never handed over.
    ("ic.checkpoint.before_commit", 1, "a"),
    ("binding.checkpoint", 1, "a"),
]
CALLERS = 3
AFTER_RESTART = 8  # transfers answered after the restart before the callers stop
DEADLINE = 60.0
TRIGGER_MB = "0.001"


def test_every_point_is_walked() -> None:
    """A point added without a walk here fails (and a walk of a point that is gone)."""
    assert {point for point, _, _ in WALKS} == set(crashpoints.POINTS)


def test_an_unknown_point_stops_the_process_at_import() -> None:
    env = dict(os.environ, **{crashpoints.ENV: "ic.log.no_such_point"})
    done = subprocess.run(
        [sys.executable, "-c", "import ambrosia_py.crashpoints"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 1
    assert "there is no crash point 'ic.log.no_such_point'; the points are" in done.stderr


def test_a_point_kills_at_its_count_and_leaves_a_marker(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = "\n".join(
        [
            "import sys",
            "from ambrosia_py import crashpoints",
            "for i in range(5):",
            "    print(i, flush=True)",
            "    crashpoints.reach('ic.log.before_sync')",
            "    crashpoints.reach('ic.log.after_sync')",
        ]
    )
    env = dict(
        os.environ,
        **{crashpoints.ENV: "ic.log.after_sync:3", crashpoints.MARKER_ENV: str(marker)},
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=DEADLINE
    )
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split() == ["0", "1", "2"]
    line = marker.read_text()
    assert re.fullmatch(
        r"ambrosia crash point ic\.log\.after_sync reached \(time 3\) in pid \d+: SIGKILL\n", line
    )
    assert line in done.stderr


class _Callers:
    """Threads calling ``a.transfer`` with a key per token, each retried until answered;
    what they were answered is the test's own record."""

    def __init__(self, client: Client, transfer: Any) -> None:
        self.answered: dict[str, list[int]] = {}
        self.errors: list[BaseException] = []
        self._client = client
        self._transfer = transfer
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(t,), daemon=True) for t in range(CALLERS)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def _run(self, t: int) -> None:
        i = 0
        try:
            while not self._stop.is_set():
                token = f"{t}-{i}"
                answer = self._client.call(self._transfer, token, key=token)
                with self._lock:
                    self.answered[token] = answer
                i += 1
        except BaseException as exc:  # reported by the test's thread
            self.errors.append(exc)

    def count(self) -> int:
        assert not self.errors, self.errors
        return len(self.answered)

    def halt(self) -> None:
        """No new calls; each caller finishes the one it is in."""
        self._stop.set()

    def join(self) -> None:
        """Wait until every caller has its last call answered (retried, however long)."""
        self.halt()
        for thread in self._threads:
            thread.join(DEADLINE)
            assert not thread.is_alive(), "a caller never got its answer"
        assert not self.errors, self.errors


def _pids(svc: ServiceProcess) -> tuple[int, int]:
    """(service pid, coordinator pid) from this start's ready line."""
    m = re.search(r"coordinator_pid=(\d+) service_pid=(\d+)", svc.output())
    assert m is not None, svc.tail()
    return int(m.group(2)), int(m.group(1))


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


@pytest.fixture(scope="module")
def service_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("crash_points") / "crash_ledger.py"
    path.write_text(SERVICE)
    return path


@pytest.fixture
def pair(service_file: Path, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """Instances ``a`` and ``b``, not started (the test arms one); always stopped."""
    data = tmp_path / "data"
    base = dict(os.environ, AMBROSIA_LOG_TRIGGER_MB=TRIGGER_MB)
    base.pop(crashpoints.ENV, None)
    ports = {"a": free_port(), "b": free_port()}
    peers = {"a": ["--peer", "b"], "b": []}
    svcs = {
        name: ServiceProcess(
            str(service_file),
            name,
            data,
            ["--ingress", f"127.0.0.1:{ports[name]}", *peers[name]],
            env=base,
        )
        for name in ("a", "b")
    }
    clients: list[Client] = []
    try:
        yield {"svcs": svcs, "data": data, "ports": ports, "base": base, "clients": clients}
    finally:
        for client in clients:
            client.close()
        for svc in svcs.values():
            svc.stop()


@pytest.mark.parametrize(("point", "at", "victim"), WALKS, ids=[f"{v}-{p}" for p, _, v in WALKS])
def test_crash_point(
    point: str, at: int, victim: str, pair: dict[str, Any], service_file: Path, tmp_path: Path
) -> None:
    ledger: Any = load_service(str(service_file))
    svcs: dict[str, ServiceProcess] = pair["svcs"]
    armed = svcs[victim]
    marker = tmp_path / "crash.marker"
    armed.env = dict(
        pair["base"], **{crashpoints.ENV: f"{point}:{at}", crashpoints.MARKER_ENV: str(marker)}
    )
    for svc in svcs.values():  # side by side: start-up is most of a walk's time
        svc.start()
    for svc in svcs.values():
        if svc is not armed:
            svc.wait_for_log("ingress listening on", DEADLINE)
    # The armed one serves, or (a point in its first start) dies before it does.
    wait_for(
        f"{victim} to serve",
        lambda: "ingress listening on" in armed.output() or not armed.alive(),
        DEADLINE,
        armed.tail,
    )
    service_pid, coordinator_pid = _pids(armed)

    def client(name: str) -> Client:
        c = Client(
            f"127.0.0.1:{pair['ports'][name]}",
            data_dir=pair["data"],
            timeout=4 * DEADLINE,
            max_backoff=0.2,
        )
        pair["clients"].append(c)
        return c

    callers = _Callers(client("a"), ledger.transfer)
    callers.start()
    try:
        # The armed process dies by its own hand at the point; nothing else kills it.
        wait_for(f"crash point {point}:{at}", lambda: not armed.alive(), DEADLINE, armed.tail)
        killed = coordinator_pid if point.startswith("ic.") else service_pid
        assert marker.read_text() == (
            f"{crashpoints.MARKER_TEXT} {point} reached (time {at}) in pid {killed}: SIGKILL\n"
        )
        assert armed.proc is not None
        if point.startswith("binding."):
            assert armed.proc.returncode == -signal.SIGKILL
        else:  # its parent, the service process, saw how it died
            said = f"the coordinator (pid {coordinator_pid}) was killed by SIGKILL"
            assert said in armed.output()
        wait_for("the old coordinator to exit", lambda: _gone(coordinator_pid), DEADLINE)
        before = callers.count()

        armed.env = pair["base"]
        armed.start()
        armed.wait_for_log("ingress listening on", DEADLINE)
        wait_for(
            "transfers after the restart",
            lambda: callers.count() >= before + AFTER_RESTART,
            DEADLINE,
            armed.tail,
        )
        callers.join()
    finally:
        callers.halt()  # on a failure the clients' close ends the calls in flight
    got_a = client("a").call(ledger.report)
    got_b = client("b").call(ledger.report)
    answered = callers.answered
    n = len(answered)
    # Every answered transfer debited once and credited once; nothing else applied.
    assert got_a["debited"] == dict.fromkeys(answered, 1)
    assert got_b["credited"] == dict.fromkeys(answered, 1)
    # Each answer is its single application's; the counters agree with the record.
    assert got_a["answers"] == answered
    assert got_a["order"] == n and got_b["credits"] == n
    assert sorted(order for order, _ in answered.values()) == list(range(1, n + 1))
    assert sorted(credit for _, credit in answered.values()) == list(range(1, n + 1))
    print(f"{victim}: {point}:{at} walked: {n} transfers, {before} answered before the kill")
