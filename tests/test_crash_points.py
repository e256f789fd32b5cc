"""Every crash point walked: a real process SIGKILLs itself exactly there, recovers, and
every call is applied exactly once (``ambrosia_py/crashpoints.py``).

The workload: instance ``a`` takes ``transfer(token)`` calls through its ingress, from
callers that retry each with its own key until answered (docs/ingress.md). A transfer
debits ``a`` once and awaits ``b.credit(token)`` across the link between their
coordinators, so every call crosses both coordinators' logs, a link each way, both
bindings and a checkpoint's tail while it waits. Logs roll every few kilobytes
(``AMBROSIA_LOG_TRIGGER_MB``), so checkpoints are taken all along.

Each walk has a fresh ``a`` (``a1``, ``a2``, ...; ``b`` serves them all) and arms one
instance (every point on ``a``; the receiving side of the link on ``b`` too; two points
in ``a``'s first start): ``ic.*`` points kill its coordinator,
``binding.*`` points its service process, at a count that lands mid-workload. The test
sees the death (the marker line naming the point and the dead pid, and the exit signal
as the parent saw it), starts the instance again without the point, lets the callers
finish, and checks against its own record of the answers: every token answered was
debited exactly once and credited exactly once, nothing else was applied, each answer is
the one its single application produced, and both services' own counters agree. Last,
once stopped, ``log verify`` passes on each instance's logs.
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
from click.testing import CliRunner

from ambrosia_py import crashpoints
from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli.log import log as log_commands
from ambrosia_py.client import Client
from ambrosia_py.testing import ServiceProcess, free_port
from ambrosia_py.testing.processes import process_gone, wait_for

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


# Points of a replica, walked where replicas run (the file named).
WALKED_ELSEWHERE = {
    "ic.replica.checkpoint.before_commit": "test_replicas_checkpoints.py",
    "ic.replica.checkpoint.before_ship": "test_replicas_checkpoints.py",
}


def test_every_point_is_walked() -> None:
    """A point added without a walk here fails (and a walk of a point that is gone)."""
    walked = {point for point, _, _ in WALKS} | set(WALKED_ELSEWHERE)
    assert walked == set(crashpoints.POINTS)
    here = Path(__file__).resolve().parent
    for point, name in WALKED_ELSEWHERE.items():
        assert point in (here / name).read_text(), f"{name} does not walk {point}"


def test_every_point_is_documented() -> None:
    """docs/operations.md (*Crash points*) has a row for every point, and no other."""
    doc = (Path(__file__).resolve().parents[1] / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Crash points") :]
    rows = re.findall(r"^\| `([a-z_.]+)` \|", section, re.M)
    assert sorted(rows) == sorted(crashpoints.POINTS)


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

    def __init__(self, client: Client, transfer: Any, prefix: str) -> None:
        self._prefix = prefix  # tokens are PREFIX/CALLER-N: unique across the walks
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
                token = f"{self._prefix}/{t}-{i}"
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


class _Cluster:
    """``b``, shared by the walks (one start fewer per walk: start-up is most of a
    walk's time), and a fresh ``a<N>`` per walk, all in one data dir; every process and
    client is stopped at the end, pass or fail."""

    def __init__(self, service: Path, data: Path) -> None:
        self.service = service
        self.data = data
        self.base = dict(os.environ, AMBROSIA_LOG_TRIGGER_MB=TRIGGER_MB)
        self.base.pop(crashpoints.ENV, None)
        self.ledger: Any = load_service(str(service))
        self.ports: dict[str, int] = {}
        self.svcs: dict[str, ServiceProcess] = {}
        self.clients: list[Client] = []
        self.b = self.instance("b")

    def instance(self, name: str, *args: str) -> ServiceProcess:
        self.ports[name] = port = free_port()
        svc = ServiceProcess(
            str(self.service),
            name,
            self.data,
            ["--ingress", f"127.0.0.1:{port}", *args],
            env=self.base,
        )
        self.svcs[name] = svc
        return svc

    def client(self, name: str) -> Client:
        c = Client(
            f"127.0.0.1:{self.ports[name]}",
            data_dir=self.data,
            timeout=4 * DEADLINE,
            max_backoff=0.2,
        )
        self.clients.append(c)
        return c

    def report(self, name: str) -> dict[str, Any]:
        got: dict[str, Any] = self.client(name).call(self.ledger.report)
        return got

    def close(self) -> None:
        for client in self.clients:
            client.close()
        for svc in self.svcs.values():
            svc.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Cluster]:
    """``b`` serving; at the end, stopped, its whole history must verify."""
    where = tmp_path_factory.mktemp("crash_points")
    service = where / "crash_ledger.py"
    service.write_text(SERVICE)
    cluster = _Cluster(service, where / "data")
    try:
        cluster.b.start()
        cluster.b.wait_for_log("ingress listening on", DEADLINE)
        yield cluster
    finally:
        cluster.close()
    _verify(cluster.data / "b_0")


def _verify(instance_dir: Path) -> None:
    """``ambrosia-py log verify`` on what a crash and its recovery left: a clean history."""
    done = CliRunner().invoke(log_commands, ["verify", str(instance_dir)])
    assert done.exit_code == 0, done.output


@pytest.mark.parametrize(("point", "at", "victim"), WALKS, ids=[f"{v}-{p}" for p, _, v in WALKS])
def test_crash_point(point: str, at: int, victim: str, cluster: _Cluster, tmp_path: Path) -> None:
    marker = tmp_path / "crash.marker"
    armed_env = dict(
        cluster.base, **{crashpoints.ENV: f"{point}:{at}", crashpoints.MARKER_ENV: str(marker)}
    )
    b = cluster.b
    if not b.alive():  # a walk before failed with b down
        b.env = cluster.base
        b.start()
        b.wait_for_log("ingress listening on", DEADLINE)
    credits_before = cluster.report("b")["credits"]
    if victim == "b":
        b.stop()
        b.env = armed_env
        b.start()
    a = cluster.instance(f"a{len(cluster.svcs)}", "--peer", "b")
    if victim == "a":
        a.env = armed_env
    a.start()
    armed = a if victim == "a" else b
    for svc in (a, b):
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

    callers = _Callers(cluster.client(a.instance), cluster.ledger.transfer, a.instance)
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
        wait_for("the old coordinator to exit", lambda: process_gone(coordinator_pid), DEADLINE)
        before = callers.count()

        armed.env = cluster.base
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
    got_a, got_b = cluster.report(a.instance), cluster.report("b")
    answered = callers.answered
    n = len(answered)
    credited = {t: k for t, k in got_b["credited"].items() if t.startswith(f"{a.instance}/")}
    # Every answered transfer debited once and credited once; nothing else applied.
    assert got_a["debited"] == dict.fromkeys(answered, 1)
    assert credited == dict.fromkeys(answered, 1)
    # Each answer is its single application's; the counters agree with the record.
    assert got_a["answers"] == answered
    assert got_a["order"] == n and got_b["credits"] == credits_before + n
    assert sorted(order for order, _ in answered.values()) == list(range(1, n + 1))
    credits = range(credits_before + 1, credits_before + n + 1)
    assert sorted(credit for _, credit in answered.values()) == list(credits)
    a.stop()
    _verify(cluster.data / f"{a.instance}_0")
    print(f"{victim}: {point}:{at} walked: {n} transfers, {before} answered before the kill")
