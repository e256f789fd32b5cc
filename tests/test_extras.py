"""Installed without the extras (``pip install ambrosia-py``): every command starts, and
the ones that need an extra say in one line which (``ambrosia_py/extras.py``).

A real venv without them needs the network for the core dependencies, so instead each
check runs in a child interpreter in which the extras' packages are absent as Python sees
an absent package: a ``sitecustomize`` put first on ``PYTHONPATH`` makes the path finder
find nothing for them, so ``import numpy`` raises ModuleNotFoundError from the import
system itself and ``find_spec`` answers None. Every interpreter the child starts (the
demo's analytics, the bench's servers) inherits it through the environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ambrosia_py.extras import EXTRAS

DEADLINE = 120.0
ABSENT = sorted(module for modules in EXTRAS.values() for module in modules)

SITECUSTOMIZE = f"""
import importlib.machinery
import sys

ABSENT = {ABSENT!r}


class PathFinderWithoutExtras(importlib.machinery.PathFinder):
    # The extras' packages are not found on any path entry, as when not installed.
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        if fullname.partition(".")[0] in ABSENT:
            return None
        return super().find_spec(fullname, path, target)


sys.meta_path[:] = [
    PathFinderWithoutExtras if f is importlib.machinery.PathFinder else f
    for f in sys.meta_path
]
"""

COMMANDS = {
    "analyze",
    "bench",
    "coordinator",
    "debug",
    "demo",
    "group",
    "instances",
    "log",
    "register",
    "registry",
    "replay",
    "run",
}

# Every command and subcommand's --help, in the child: {"bench compare": [exit, output]}.
WALK = """
import json, click
from click.testing import CliRunner
from ambrosia_py.cli import main

def walk(command, path, out):
    result = CliRunner().invoke(main, [*path, "--help"])
    out[" ".join(path)] = [result.exit_code, result.output + repr(result.exception or "")]
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            walk(command.get_command(ctx, name), [*path, name], out)
    return out

print(json.dumps(walk(main, [], {})))
"""


@pytest.fixture(scope="module")
def without_extras(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The environment of an interpreter that has none of the extras' packages."""
    site = tmp_path_factory.mktemp("without-extras")
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _python(
    env: dict[str, str], *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=DEADLINE
    )


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _python(env, "-m", "ambrosia_py.cli", *args)


@pytest.mark.parametrize("module", ABSENT)
def test_the_extras_are_absent_in_the_child(without_extras: dict[str, str], module: str) -> None:
    """The control: in the child each of them is absent, as Python reports it."""
    code = textwrap.dedent(f"""
        import importlib.util
        assert importlib.util.find_spec({module!r}) is None
        try:
            import {module}
        except ModuleNotFoundError as exc:
            assert exc.name == {module!r}, exc.name
            print("absent")
    """)
    done = _python(without_extras, "-c", code)
    assert (done.returncode, done.stdout, done.stderr) == (0, "absent\n", "")


def test_the_program_s_help_lists_every_command(without_extras: dict[str, str]) -> None:
    done = _cli(without_extras, "--help")
    assert done.returncode == 0, done.stderr
    rows = done.stdout.split("Commands:")[1].splitlines()
    # A command's row starts two spaces in; a summary's wrapped lines further in.
    listed = {line.split()[0] for line in rows if line.startswith("  ") and line[2] != " "}
    assert listed == COMMANDS
    assert done.stderr == ""


def test_log_help_as_a_program(without_extras: dict[str, str]) -> None:
    done = _cli(without_extras, "log", "--help")
    assert done.returncode == 0, done.stderr
    assert {"show", "verify", "prune"} <= set(done.stdout.split())


def test_every_command_and_subcommand_s_help(without_extras: dict[str, str]) -> None:
    done = _python(without_extras, "-c", WALK)
    assert done.returncode == 0, done.stderr
    helps: dict[str, list[object]] = json.loads(done.stdout)
    assert {path.split()[0] for path in helps if path} == COMMANDS
    assert {"bench compare", "bench spark", "log show", "registry rebuild"} <= set(helps)
    failed = {path: output for path, (code, output) in helps.items() if code != 0}
    assert failed == {}


SPARK = "pip install 'ambrosia-py[spark]'"
BENCH = "pip install 'ambrosia-py[bench]'"


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["analyze", "{data}", "--out", "{out}"],
            "ambrosia-py analyze needs the spark extra "
            f"(no PySpark, PyArrow, pandas, matplotlib, NumPy here): {SPARK}",
        ),
        (
            ["bench", "compare", "--only", "grpc", "--only", "dbos", "--dir", "{out}"],
            f"ambrosia-py bench compare needs the bench extra (no grpcio, DBOS here): {BENCH}",
        ),
        (
            ["bench", "compare", "--charts", "{out}", "--dir", "{out}"],
            f"ambrosia-py bench compare needs the spark extra (no matplotlib here): {SPARK}",
        ),
        (
            ["bench", "spark", "--mb", "1"],
            "ambrosia-py bench spark needs the spark extra "
            f"(no PySpark, PyArrow, NumPy here): {SPARK}",
        ),
    ],
    ids=["analyze", "bench-compare-peers", "bench-compare-charts", "bench-spark"],
)
def test_a_command_that_needs_an_extra_says_which_in_one_line(
    without_extras: dict[str, str], tmp_path: Path, argv: list[str], line: str
) -> None:
    data, out = tmp_path / "data", tmp_path / "out"
    data.mkdir()
    done = _cli(without_extras, *(a.format(data=data, out=out) for a in argv))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [f"Error: {line}"]
    assert done.stdout == ""
    assert not out.exists()  # it stopped before doing anything


def test_the_library_imports_and_says_which_extra_reading_needs(
    without_extras: dict[str, str],
) -> None:
    code = textwrap.dedent("""
        import ambrosia_py, ambrosia_py.client, ambrosia_py.testing, ambrosia_py.testing.plugin
        import ambrosia_py.spark
        assert ambrosia_py.Immortal is not None
        try:
            ambrosia_py.spark.local_session()
        except ImportError as exc:
            print(exc)
    """)
    done = _python(without_extras, "-c", code)
    assert done.returncode == 0, done.stderr
    assert (
        done.stdout
        == f"the Spark reader needs the spark extra (no PySpark, PyArrow here): {SPARK}\n"
    )


def test_pytest_loads_the_plugin(without_extras: dict[str, str], tmp_path: Path) -> None:
    """The plugin is an entry point, loaded by every pytest run in the environment."""
    (tmp_path / "test_one.py").write_text(
        "def test_the_fixture_is_there(ambrosia):\n"
        "    assert type(ambrosia).__name__ == 'ImmortalRunner'\n"
    )
    done = _python(without_extras, "-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout
