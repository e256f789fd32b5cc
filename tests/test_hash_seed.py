"""A handler that iterates a set of strings does the same in every incarnation: the
instance's hash seed (``ambrosia_py/hashseed.py``) is drawn at its first start, kept in the
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

from ambrosia_py import hashseed
from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client
from ambrosia_py.coordinator.storage.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR
from ambrosia_py.hashseed import SEED_SUFFIX, instance_seed
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


# A service file that says, each time it is loaded, under which seed (and whether the
# mark run_under_seed leaves for the process it starts was still in its environment).
MARKED = """
import os
from pathlib import Path

from ambrosia_py import Immortal, rpc

with Path(__file__).with_name("loaded").open("a") as f:
    env = os.environ
    f.write(f"{env.get('PYTHONHASHSEED')} {env.get('AMBROSIA_PY_UNDER_INSTANCE_SEED')}\\n")


class Marked(Immortal):
    @rpc
    def ping(self) -> int:
        return 1
"""


def _program(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``ambrosia-py`` as a process started with seed 7 (``-m``, as ServiceProcess runs it)."""
    (tmp_path / "marked.py").write_text(MARKED)
    (tmp_path / "data").mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        cwd=tmp_path,
        env={**os.environ, "PYTHONHASHSEED": "7"},
    )


def _loaded(tmp_path: Path) -> list[str]:
    path = tmp_path / "loaded"
    return path.read_text().splitlines() if path.exists() else []


def test_a_restart_named_on_its_command_line_takes_its_seed_before_loading_anything(
    tmp_path: Path,
) -> None:
    """The program executes itself again before it loads the service file (the first
    process would load it for nothing): it is loaded once, under the instance's seed.
    The bad --ingress stops ``run`` after it loaded the service, before it would switch."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"x{SEED_SUFFIX}").write_text("12345\n")
    bad = ["--data-dir", "data", "--ingress", "nonsense:port"]
    done = _program(tmp_path, "run", "marked.py", "--instance", "x", *bad)
    assert done.returncode == 2, done.stderr
    assert "Invalid value for --ingress" in done.stderr
    assert _loaded(tmp_path) == ["12345 None"]  # once; the mark is not inherited
    (tmp_path / "loaded").unlink()
    # Without --instance only the command knows the instance (the class's name): nothing
    # happens early, and the service is loaded under the process's seed.
    (tmp_path / "data" / f"marked{SEED_SUFFIX}").write_text("12345\n")
    done = _program(tmp_path, "run", "marked.py", *bad)
    assert done.returncode == 2, done.stderr
    assert _loaded(tmp_path) == ["7 None"]


def test_the_early_step_makes_no_seed_file_and_leaves_a_bad_one_to_the_command(
    tmp_path: Path,
) -> None:
    # A first start checks its command line before the instance has a seed.
    done = _program(tmp_path, "run", "marked.py", "--instance", "x", "--ingress", "nonsense:port")
    assert done.returncode == 2, done.stderr
    assert not list(tmp_path.glob(f"**/*{SEED_SUFFIX}"))
    seed_file = tmp_path / "ambrosia-data" / f"x{SEED_SUFFIX}"  # the default data dir
    seed_file.parent.mkdir(exist_ok=True)
    seed_file.write_text("banana\n")
    done = _program(tmp_path, "run", "marked.py", "--instance", "x")
    assert done.returncode == 1, done.stderr
    assert "x.hash-seed holds 'banana', not a hash seed" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_command_decides_when_the_early_step_reads_its_line_otherwise(
    tmp_path: Path,
) -> None:
    """``--link-host --instance``: the early step, which knows only --instance and
    --data-dir, takes the value for the option. The command's instance wins, once: the
    process it starts does not take the early step again (it would, in turn, for ever)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / f"--instance{SEED_SUFFIX}").write_text("111\n")
    (tmp_path / "data" / f"a{SEED_SUFFIX}").write_text("222\n")
    args = ["--link-host", "--instance", "--instance", "a", "--data-dir", "data"]
    # --separated without ports stops run after it switched seeds, before it starts.
    done = _program(tmp_path, "run", "marked.py", *args, "--separated")
    assert done.returncode == 2, done.stderr
    assert "--separated needs --receive-port and --send-port" in done.stderr
    assert _loaded(tmp_path) == ["111 None", "222 None"]


def test_the_early_step_imports_neither_the_binding_nor_click() -> None:
    code = (
        "import sys, ambrosia_py.cli\n"
        "print(sorted(m for m in sys.modules if m.startswith(('ambrosia_py', 'click'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == [
        "['ambrosia_py',",
        "'ambrosia_py.cli',",
        "'ambrosia_py.hashseed']",
    ]


def test_the_early_step_reads_the_instance_and_data_dir_as_click_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    read = hashseed._seeded_instance
    assert read(["run", "s.py", "--instance", "a"]) == (DEFAULT_DATA_DIR, "a")
    assert read(["replay", "s.py", "--instance=a", "--data-dir=d", "--instance", "b"]) == (
        Path("d"),
        "b",
    )
    assert read(["debug", "--data-dir", "d", "--instance", "a", "--checkpoint", "1"]) == (
        Path("d"),
        "a",
    )
    monkeypatch.setenv(DATA_DIR_ENV, "from-env")
    assert read(["run", "s.py", "--instance", "a"]) == (Path("from-env"), "a")
    for unsure in (
        ["run", "s.py"],  # the class's name
        ["run", "s.py", "--instance", ""],  # likewise
        ["run", "s.py", "--instance"],
        ["run", "s.py", "--instance", "a", "--help"],
        ["run", "--", "--instance", "a"],
        ["run", "s.py", "--instance", "a", "--data-dir", ""],
        ["coordinator", "--instance", "a", "--data-dir", "d"],
        ["log", "show", "--instance", "a"],
        [],
    ):
        assert read(unsure) is None, unsure
