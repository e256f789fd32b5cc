"""`ambrosia-py replay --verify` finds handlers that are not deterministic."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli import main
from ambrosia_py.client import Client
from ambrosia_py.testing import ServiceProcess, free_port

SERVICE = """
import sys
{imports}
from ambrosia_py import Immortal, background, rpc


def announce(n):
    print(f"handled {{n}}", file=sys.stderr, flush=True)


class Ticker(Immortal):
    def __init__(self):
        self.count = 0
        self.seen = []

    @rpc
    def tick(self, n: int) -> None:
        self.count += n
        self.seen.append({observed})
        self.effect(announce, self.count)

    @background
    async def feed(self):
        for n in (1, 2, 3):
            self.impulse.tick(n)
"""


def record_history(tmp_path: Path, name: str, imports: str, observed: str) -> Path:
    """Run the service until it has handled three impulses; return its file."""
    path = tmp_path / f"{name}.py"
    path.write_text(SERVICE.format(imports=imports, observed=observed))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "run",
            str(path),
            "--data-dir",
            str(tmp_path / "data"),
            "--instance",
            name,
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    done = threading.Event()
    lines: list[str] = []

    def drain() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "handled 6" in line:
                done.set()
        done.set()

    threading.Thread(target=drain, daemon=True).start()
    try:
        assert done.wait(60) and any("handled 6" in x for x in lines), "".join(lines)
    finally:
        proc.kill()  # the log is durable: no need to stop politely
        proc.wait()
    return path


def verify(tmp_path: Path, path: Path, name: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main,
        ["replay", str(path), "--instance", name, "--data-dir", str(tmp_path / "data"), "--verify"],
    )
    return result.exit_code, result.output


def test_a_deterministic_service_verifies(tmp_path: Path) -> None:
    path = record_history(tmp_path, "steady", "", "n * 10")
    code, out = verify(tmp_path, path, "steady")
    assert code == 0, out
    assert "deterministic" in out and "count = 6" in out and "seen = [10, 20, 30]" in out


@pytest.mark.parametrize(
    ("imports", "observed"),
    [("import time", "time.time()"), ("import random", "random.random()")],
)
def test_verify_names_the_record_method_and_attribute(
    tmp_path: Path, imports: str, observed: str
) -> None:
    path = record_history(tmp_path, "flaky", imports, observed)
    code, out = verify(tmp_path, path, "flaky")
    assert code == 1, out
    # Record 0 is the initial message; the first impulse is record 1.
    assert "NOT DETERMINISTIC at record 1, method tick: state differs" in out
    assert "state differs: seen[0]: " in out, out  # the path to the value that differs


STAMPS = """
import time
from ambrosia_py import Immortal, rpc


class Stamps(Immortal):
    def __init__(self):
        self.at = 0.0

    @rpc
    def stamp(self) -> None:
        self.at = time.time()
"""


def test_verify_names_the_method_an_ingress_call_ran(tmp_path: Path) -> None:
    path = tmp_path / "stamps.py"
    path.write_text(STAMPS)
    stamps: Any = load_service(str(path))
    port = free_port()
    svc = ServiceProcess(str(path), "stamps", tmp_path / "data", ["--ingress", f":{port}"])
    with svc.running():
        svc.wait_for_log("ingress listening on")
        with Client(f"127.0.0.1:{port}", data_dir=tmp_path / "data", timeout=60) as client:
            client.call(stamps.stamp, key="first")
    code, out = verify(tmp_path, path, "stamps")
    assert code == 1, out
    assert "method stamp (ingress call, key 'first'): state differs" in out, out


TAGS = """
import sys
import zlib

from ambrosia_py import Immortal, background, rpc


def announce(n):
    print(f"members {{n}}", file=sys.stderr, flush=True)


class Tags(Immortal):
    def __init__(self):
        self.seen = set()
        self.order = 0

    @rpc
    def tag(self, t: int) -> None:
        self.seen.add(t)
        {iterate}
        self.effect(announce, len(self.seen))

    @background
    async def feed(self):
        first = len(self.seen)  # new members at every start
        for i in range(first, first + {per_start}):
            # Multiples of 8 collide in a set's table, so a set rebuilt from a checkpoint
            # lays them out in another order than adds did; ints, whose hashes are not
            # salted, so on every run.
            self.impulse.tag(i * 8)
"""
PER_START = 700


def tags_across_a_kill(tmp_path: Path, iterate: str) -> Path:
    """History of a set grown by adds, with a SIGKILL and a recovery in the middle."""
    path = tmp_path / "tags.py"
    path.write_text(TAGS.format(iterate=iterate, per_start=PER_START))
    svc = ServiceProcess(str(path), "tags", tmp_path / "data")
    svc.start()
    try:
        svc.wait_for_log(f"members {PER_START}")
        svc.kill()  # both processes: the next start recovers from the log
        svc.start()
        svc.wait_for_log(f"members {2 * PER_START}")
    finally:
        svc.kill()
    return path


def verify_as_program(tmp_path: Path, path: Path, name: str) -> tuple[int, str]:
    """``replay --verify`` as a user runs it: a process of its own, which runs the
    handlers under the instance's hash seed (in-process, set order would be this one's)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "replay",
            str(path),
            "--instance",
            name,
            "--data-dir",
            str(tmp_path / "data"),
            "--verify",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, done.stdout + done.stderr


def test_a_set_rebuilt_by_a_recovery_is_not_a_divergence(tmp_path: Path) -> None:
    """A set restored from a checkpoint and then extended pickles in another order than
    one grown by adds; by value the two are equal, and no handler iterates it."""
    path = tags_across_a_kill(tmp_path, "")
    code, out = verify_as_program(tmp_path, path, "tags")
    assert code == 0, out
    assert "NOT DETERMINISTIC" not in out
    assert "deterministic: both replays (one recovered at each checkpoint)" in out, out
    # Its order did change, and nothing depended on it: a note, not an alarm.
    assert "note: after a recovery at checkpoint" in out, out


def test_a_handler_that_iterates_a_set_after_a_recovery_is_flagged(tmp_path: Path) -> None:
    iterate = "self.order = zlib.crc32(','.join(map(str, self.seen)).encode())"
    path = tags_across_a_kill(tmp_path, iterate)
    code, out = verify_as_program(tmp_path, path, "tags")
    assert code == 1, out
    assert "NOT DETERMINISTIC at record" in out and "method tag: state differs: order:" in out
    assert "After a recovery at checkpoint" in out, out
    assert (
        "seen (a set of 700 members) iterates in another order (iterate sorted(self.seen))" in out
    ), out
