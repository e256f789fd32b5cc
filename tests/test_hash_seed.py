"""A handler that iterates a set of strings does the same in every incarnation: the
instance's hash seed (``binding/hashseed.py``) is drawn at its first start, kept in the
data dir, and every process that runs its handlers (``run`` again after a SIGKILL,
``replay``) runs under it, whatever seed it was started with."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.hashseed import SEED_SUFFIX, instance_seed
from ambrosia_py.binding.run_cli import load_service
from ambrosia_py.client import Client
from ambrosia_py.testing import ServiceProcess, free_port

DEADLINE = 60.0

SETS = """
from ambrosia_py import Immortal, rpc


class Sets(Immortal):
    def __init__(self) -> None:
        self.names: set[str] = set()
        self.seen: list[str] = []
        self.last = ""

    @rpc
    def add(self, name: str) -> str:
        self.names.add(name)
        order = ",".join(self.names)  # the order of a set of str: by their salted hashes
        self.seen.append(order)
        self.last = order
        return order

    @rpc
    def history(self) -> list[str]:
        return self.seen
"""


def _start(svc: ServiceProcess) -> None:
    svc.start()
    svc.wait_for_log("ingress listening on", DEADLINE)


def test_set_order_survives_a_sigkill_and_replay(tmp_path: Path) -> None:
    path = tmp_path / "sets_service.py"
    path.write_text(SETS)
    sets: Any = load_service(str(path))
    data, port = tmp_path / "data", free_port()
    # Each start is given another seed, as a process manager's would differ.
    env = {**os.environ, "PYTHONHASHSEED": "11"}
    svc = ServiceProcess(str(path), "sets", data, ["--ingress", f"127.0.0.1:{port}"], env=env)
    _start(svc)
    try:
        with Client(f"127.0.0.1:{port}", data_dir=data, timeout=DEADLINE) as client:
            answers = [client.call(sets.add, f"name-{n}", key=f"k{n}") for n in range(40)]
        seed_file = data / f"sets{SEED_SUFFIX}"
        assert stat.S_IMODE(seed_file.stat().st_mode) == 0o600
        seed = instance_seed(data, "sets", create=False)
        assert seed is not None and str(seed) != "11"  # its own, not the process's
        svc.kill("both")  # recovery replays the 40 calls from the log
        svc.env = {**os.environ, "PYTHONHASHSEED": "22"}
        _start(svc)
        with Client(f"127.0.0.1:{port}", data_dir=data, timeout=DEADLINE) as client:
            assert client.call(sets.history) == answers
    finally:
        svc.stop()
    replay = [sys.executable, "-m", "ambrosia_py.cli", "replay", str(path), "--instance", "sets"]
    replayed = subprocess.run(
        [*replay, "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        env={**os.environ, "PYTHONHASHSEED": "33"},
    )
    assert replayed.returncode == 0, replayed.stderr
    last = repr(answers[-1])  # 40 names: replay prints the first 97 characters of it
    assert f"  last = {last[:97]}..." in replayed.stdout, replayed.stdout


def test_a_seed_file_that_is_not_a_seed_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / f"x{SEED_SUFFIX}").write_text("banana\n")
    with pytest.raises(ValueError, match=r"x\.hash-seed holds 'banana', not a hash seed"):
        instance_seed(tmp_path, "x", create=False)
    assert instance_seed(tmp_path, "y", create=False) is None
    made = instance_seed(tmp_path, "y", create=True)
    assert made is not None and instance_seed(tmp_path, "y", create=False) == made
