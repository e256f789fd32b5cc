"""The data dir must not be a trap, and an unusable one is one line.

``run`` says which data dir it uses and where that came from (the default, ``--data-dir``,
``$AMBROSIA_DATA_DIR``) on every start, and says loudly when an instance starts for the
first time; ``instances`` and ``debug`` on a data dir that does not exist say so and
create nothing; a data dir that cannot be written, or a damaged registry, is one line.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ambrosia_py.cli import main
from ambrosia_py.cli.exits import ExitStatus
from tests.test_run_errors import EXAMPLES, free_port, running

COUNTER = EXAMPLES / "counter.py"


def cli(*args: str | Path, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args], env=env)


def started(
    *args: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None
) -> list[str]:
    """The lines ``run COUNTER ARGS`` prints about its data dir; then it is stopped (Ctrl-C)."""
    with running(COUNTER, "--ingress", free_port(), *args, cwd=cwd, env=env) as run:
        run.wait_for(lambda line: line.startswith("ingress listening on"))
        run.proc.send_signal(signal.SIGINT)
        assert run.finish() == ExitStatus.OK
    return [
        line.rstrip("\n")
        for line in run.lines
        if line.startswith(("data dir", "first", "instance"))
    ]


def test_the_default_data_dir_is_said_and_a_first_start_is_loud(tmp_path: Path) -> None:
    data = tmp_path / "ambrosia-data"
    assert started(cwd=tmp_path) == [
        f"data dir {data} (the default; --data-dir or $AMBROSIA_DATA_DIR to change)",
        f"first start of instance counter in {data} (no earlier log found)",
    ]
    assert started(cwd=tmp_path) == [
        f"data dir {data} (the default; --data-dir or $AMBROSIA_DATA_DIR to change)",
        f"instance counter recovers from checkpoint 1 (version 0) in {data}",
    ]


def test_the_environment_names_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "from-env"
    lines = started(cwd=tmp_path, env={"AMBROSIA_DATA_DIR": str(data)})
    assert lines[0] == f"data dir {data} (from $AMBROSIA_DATA_DIR)"
    assert (data / "registry.sqlite3").exists()
    assert not (tmp_path / "ambrosia-data").exists()
    # ...and the other commands find it there too.
    result = cli("instances", env={"AMBROSIA_DATA_DIR": str(data)})
    assert result.exit_code == 0 and "counter" in result.output


def test_a_misspelled_data_dir_is_a_loud_first_start(tmp_path: Path) -> None:
    started("--data-dir", tmp_path / "data")
    lines = started("--data-dir", tmp_path / "dta")
    assert lines[0] == f"data dir {tmp_path / 'dta'} (from --data-dir)"
    assert (
        lines[1] == f"first start of instance counter in {tmp_path / 'dta'} (no earlier log found)"
    )


def test_help_shows_the_default_and_the_variable() -> None:
    for command in (["run", str(COUNTER)], ["instances"], ["replay"], ["log", "prune"]):
        result = cli(*command, "--help")
        assert result.exit_code == 0, result.output
        flat = " ".join(result.output.split())
        assert "[env var: AMBROSIA_DATA_DIR; default: ambrosia-data]" in flat, command


# --- commands that read refuse a missing data dir, creating nothing ----------------------


def test_instances_on_a_missing_data_dir_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = cli("instances", "--data-dir", missing)
    assert result.exit_code == 1
    assert f"no data dir {missing}" in result.output and "nothing has run with it" in result.output
    assert not missing.exists()


def test_debug_on_a_missing_data_dir_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = cli("debug", "--instance", "counter", "--data-dir", missing, "--checkpoint", "1")
    assert result.exit_code == 2
    assert f"no data dir {missing}" in result.output and "Traceback" not in result.output
    assert not missing.exists()


def test_debug_of_an_unknown_instance_registers_nothing(tmp_path: Path) -> None:
    started("--data-dir", tmp_path / "data")
    result = cli(
        "debug", "--instance", "nope", "--data-dir", tmp_path / "data", "--checkpoint", "1"
    )
    assert result.exit_code == 2
    assert f"no instance 'nope' in {tmp_path / 'data'} (it has counter)" in result.output
    listed = cli("instances", "--data-dir", tmp_path / "data").output
    assert "nope" not in listed


# --- a data dir that cannot be used: one line ---------------------------------------------


@contextlib.contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """``path`` made unwritable, even for root (chattr +i); skipped where that is refused."""
    path.mkdir()
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)]).returncode != 0:
        pytest.skip("cannot make a directory unwritable here (chattr +i)")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)


def test_an_unwritable_data_dir_is_one_line(tmp_path: Path) -> None:
    data = tmp_path / "read-only"
    with unwritable(data):
        result = cli("run", COUNTER, "--data-dir", data, "--ingress", "0")
    assert result.exit_code == ExitStatus.ERROR
    (line,) = result.output.splitlines()
    assert line.startswith(f"Error: cannot write to the data dir {data}: Operation not permitted")
    assert "--data-dir or $AMBROSIA_DATA_DIR" in line


def test_a_file_in_the_way_of_the_data_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    result = cli("run", COUNTER, "--data-dir", tmp_path / "file" / "data")
    assert result.exit_code == ExitStatus.ERROR
    (line,) = result.output.splitlines()
    assert f"cannot write to the data dir {tmp_path / 'file' / 'data'}: Not a directory" in line


def damaged_registry(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    data.mkdir()
    (data / "registry.sqlite3").write_bytes(b"\x5a" * 4096)
    return data


def test_a_damaged_registry_is_one_line_for_run(tmp_path: Path) -> None:
    data = damaged_registry(tmp_path)
    with running(COUNTER, "--data-dir", data) as run:
        assert run.finish() == ExitStatus.USAGE  # the coordinator refused, saying why
    refusals = [line for line in run.lines if "registry.sqlite3" in line]
    assert len(refusals) == 1 and "registry rebuild" in refusals[0]
    assert "Traceback" not in run.text


def test_a_damaged_registry_is_one_line_for_debug_and_prune(tmp_path: Path) -> None:
    data = damaged_registry(tmp_path)
    result = cli("debug", "--instance", "counter", "--data-dir", data, "--checkpoint", "1")
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.output.splitlines()
    assert "cannot open the registry" in line and "registry rebuild" in line
    result = cli("log", "prune", "--data-dir", data, "--instance", "counter", "--keep", "1")
    assert result.exit_code == 1
    (line,) = result.output.splitlines()
    assert "cannot open the registry" in line and "refusing to prune" in line
