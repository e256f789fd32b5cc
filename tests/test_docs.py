"""Every command and code sample in the docs is run, so the docs cannot rot.

The pages are README.md and every ``docs/*.md``, found afresh on each run: a page added
later is covered without touching this file. Each page runs as its own test, in a fresh
temporary directory (holding a link to the repository's ``examples/``, so commands are
written as if typed at the repository's root), with ``AMBROSIA_DATA_DIR`` pointing into
it and this virtualenv's ``bin`` first on ``PATH``: nothing touches the repository.

Conventions every page follows:

- **Shell commands** are in fenced blocks tagged ``console``. A line starting with ``$ ``
  is a command (a line ending in ``\\`` goes on to the next); any other line is output.
  Each command runs with ``bash -c`` in the page's directory and must exit 0 (or as a
  directive says). Blocks tagged ``sh``, ``bash``, ``shell`` or ``shell-session`` are
  refused: one convention, so no command can hide in another tag.
- **Python** blocks (``python``) are compiled, with top-level ``await`` allowed (for
  fragments of async code); under the directives below they are written to a file and
  run.
- ``text`` blocks are output, file layouts, byte layouts or usage synopses (placeholders
  in capitals, options in brackets): never run. Other tags (``toml``, ...) are left alone.
  A fence without a tag is an error: the author must say which of these it is.

A block may carry directives: an HTML comment on the line(s) right before its fence,
``<!-- docs-test: DIRECTIVE ... -->`` (words split as a shell would, so quote spaces):

- ``background until=TEXT``: each command runs in the background, as in a second
  terminal, and the test waits until its output holds TEXT (failing at once if it
  exits first). Everything started is stopped when the page ends, pass or fail:
  SIGINT to its process group (Ctrl-C), then SIGKILL for whatever is left.
- ``wait-exit`` or ``wait-exit=N``: after the block, wait until the last background
  command (and every process it started) has exited; with ``=N``, with status N.
- ``status=N``: the block's commands are expected to exit with status N.
- ``ready NUMBER=FIELD``: in this block, NUMBER stands for FIELD of the last ``ready``
  line a background command printed (``ready 16480=coordinator_pid`` for
  ``kill -9 16480``: the pid a reader takes from their own ready line).
- ``check-output``: the output lines shown must appear in the command's output, in
  order; ``...`` in a line matches anything.
- ``retry``: for a command whose outcome waits on background work (a stream still
  flowing): run it again until it passes, within a deadline, as a reader would.
- ``file=NAME`` (python and text blocks): write the block to NAME in the page's
  directory, for later commands.
- ``run`` (python): run the block as a program, from the page's directory.
- ``needs=java``: not run where no ``java`` is found (a warning names each such
  command). Commands
  and code naming Spark (``JAVA_MARKERS``) need it without saying so.

Page directive: ``<!-- docs-test: port=7000 -->`` anywhere on a page replaces the port
7000 in every command and program run from that page with a port free right now, so
pages do not collide with each other or with other work on the machine.

Commands that take minutes, or that would change the environment this test runs in,
are not run: they are listed in ``NOT_RUN`` with what runs instead and why. Any other
command a page shows is run; there is no other way out.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from ambrosia_py.testing import free_port
from ambrosia_py.testing.processes import process_gone

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent

# (what a command starts with, what the test runs instead or None, why). Keep it short.
NOT_RUN: tuple[tuple[str, str | None, str], ...] = (
    (
        "make demo",
        "ambrosia-py demo --help",
        "installs, then runs the full demo (minutes); tests/test_demo.py runs "
        "`ambrosia-py demo --quick`",
    ),
    (
        "ambrosia-py demo",
        "{command} --help",
        "the pipeline with its kills and Spark takes minutes; tests/test_demo.py runs --quick",
    ),
    ("make test", None, "the whole suite (about 10 minutes): what CI runs"),
    ("make bench", "ambrosia-py bench compare --help", "a measurement, not a check"),
    (
        "ambrosia-py bench",
        "{command} --help",
        "measurements take minutes; tests/test_bench*.py run small versions of each",
    ),
    ("python3 -m venv", None, "set-up: this test runs in the installed .venv"),
    (". .venv/bin/activate", None, "set-up: this test runs in the installed .venv"),
    (".venv/bin/pip install", None, "set-up: this test runs in the installed .venv"),
    ("pip install", None, "set-up: this test runs in the installed .venv"),
    ("apt-get install", None, "changes the system"),
)

# Commands or code that start Spark, which needs a Java runtime.
JAVA_MARKERS = ("ambrosia-py analyze", "bench spark", "pyspark", "ambrosia_py.spark")

DIRECTIVES = frozenset(
    {"background", "until", "wait-exit", "status", "ready", "check-output", "retry"}
    | {"file", "run", "needs", "port"}
)
REFUSED_TAGS = frozenset({"sh", "bash", "shell", "shell-session", "zsh"})
COMMAND_TIMEOUT = 90.0
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0


@dataclass
class Block:
    """One fenced block of a page: its tag, text, line and directives."""

    page: Path
    line: int  # of the opening fence, 1-based
    tag: str
    text: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.name}:{self.line}"


@dataclass
class Command:
    """One ``$ `` command of a console block and the output shown under it."""

    text: str
    shown: list[str]


def pages() -> list[Path]:
    """Found afresh on each run, so a page someone adds is checked from its first day."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


_FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([^\s`]*)")
_DIRECTIVE = re.compile(r"^\s*<!--\s*docs-test:(.*?)-->\s*$")


def parse_directives(text: str) -> dict[str, str]:
    """``background until="a b" status=4`` -> {"background": "", "until": "a b", ...}."""
    out: dict[str, str] = {}
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        out[key] = value
    return out


def blocks(page: Path) -> list[Block]:
    """The page's fenced blocks, with the directives in comments right before each."""
    lines = page.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, tag = len(m.group(1)), m.group(2), m.group(3).lower()
        directives: dict[str, str] = {}
        j = i - 1
        while j >= 0 and (d := _DIRECTIVE.match(lines[j])):
            directives = {**parse_directives(d.group(1)), **directives}
            j -= 1
        body: list[str] = []
        k = i + 1
        while k < len(lines) and not (
            lines[k].strip().startswith(fence[0] * len(fence))
            and set(lines[k].strip()) == {fence[0]}
        ):
            line = lines[k]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            k += 1
        found.append(Block(page, i + 1, tag, "\n".join(body) + "\n", directives))
        i = k + 1
    return found


def page_ports(page: Path) -> list[str]:
    """Every ``port=N`` of the page's directives (a comment may name several)."""
    return [
        word.partition("=")[2]
        for d in map(_DIRECTIVE.match, page.read_text().splitlines())
        if d
        for word in shlex.split(d.group(1))
        if word.startswith("port=")
    ]


def commands(block: Block) -> list[Command]:
    """The ``$ `` commands of a console block, each with the output shown under it."""
    out: list[Command] = []
    lines = block.text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            text = line[2:]
            while text.endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text[:-1] + " " + lines[i].strip()
            out.append(Command(text.strip(), []))
        elif out:
            out[-1].shown.append(line)
        i += 1
    return out


def not_run(command: str) -> tuple[str | None, str] | None:
    """What runs instead of ``command`` and why, if NOT_RUN lists it."""
    bare = command.split(" # ", 1)[0].strip()
    for prefix, instead, why in NOT_RUN:
        if bare == prefix or bare.startswith(prefix + " "):
            return (instead.format(command=bare) if instead else None), why
    return None


def needs_java(block: Block, text: str) -> bool:
    return "needs" in block.directives or any(m in text for m in JAVA_MARKERS)


def have_java() -> bool:
    home = os.environ.get("JAVA_HOME")
    return shutil.which("java") is not None or bool(home and Path(home, "bin", "java").exists())


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (a coordinator is the service process's child)."""
    found: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            for child in map(int, children.read_text().split()):
                found += [child, *_descendants(child)]
    return found


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def matches_in_order(shown: list[str], actual: str) -> str | None:
    """None if every shown line (``...`` matching anything) appears in order."""
    lines = actual.splitlines()
    at = 0
    for want in (s.strip() for s in shown):
        if not want:
            continue
        pattern = re.compile(".*".join(map(re.escape, want.split("..."))))
        while at < len(lines) and not pattern.fullmatch(lines[at].strip()):
            at += 1
        if at == len(lines):
            return f"shown line {want!r} not in the output"
        at += 1
    return None


class PageRun:
    """The page's directory, its environment, and what it started in the background."""

    def __init__(self, page: Path, workdir: Path) -> None:
        self.page = page
        self.dir = workdir
        (workdir / "examples").symlink_to(REPO / "examples")
        self.env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "AMBROSIA_DATA_DIR": str(workdir / "ambrosia-data"),
            "PYTHONDONTWRITEBYTECODE": "1",  # nothing written under the linked examples/
        }
        for var in ("AMBROSIA_SECRET_FILE", "AMBROSIA_VERBOSE", "VIRTUAL_ENV"):
            self.env.pop(var, None)
        self.ports = {port: str(free_port()) for port in page_ports(page)}
        self.background: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.failures: list[str] = []
        self.skipped: list[str] = []
        self.ran = 0

    def substitute(self, text: str, block: Block) -> str:
        for port, free in self.ports.items():
            text = re.sub(rf"(?<![\d.]){port}(?!\d)", free, text)
        for key, value in block.directives.items():  # ready NUMBER=FIELD
            if "ready" in block.directives and key.isdigit():
                text = re.sub(rf"\b{key}\b", self.ready_field(value), text)
        return text

    def ready_field(self, name: str) -> str:
        for _, log in reversed(self.background):
            for line in reversed(log.read_text(errors="replace").splitlines()):
                if line.startswith("ready "):
                    fields = dict(kv.split("=", 1) for kv in line.split()[1:] if "=" in kv)
                    if name in fields:
                        return fields[name]
        raise AssertionError(f"no ready line with {name}= from a background command yet")

    def fail(self, block: Block, what: str, output: str = "") -> None:
        tail = "\n".join(output.splitlines()[-25:])
        self.failures.append(f"{block.where}: {what}" + (f"\n{tail}" if tail else ""))

    # -- blocks ---------------------------------------------------------------------------

    def run_block(self, block: Block) -> None:
        unknown = [
            key
            for key in block.directives
            if key not in DIRECTIVES and not ("ready" in block.directives and key.isdigit())
        ]
        if unknown:  # a misspelt directive would otherwise be ignored in silence
            self.fail(block, f"unknown docs-test directive(s) {unknown}")
        if block.tag == "":
            self.fail(block, "a fence without a tag: say console, python, text, ...")
        elif block.tag in REFUSED_TAGS:
            self.fail(block, f"tagged {block.tag!r}: shell commands go in console blocks")
        elif block.tag == "console":
            self.run_console(block)
        elif block.tag in ("python", "py"):
            self.run_python(block)
        elif "file" in block.directives:
            (self.dir / block.directives["file"]).write_text(block.text)

    def run_python(self, block: Block) -> None:
        flags = 0x2000  # ast.PyCF_ALLOW_TOP_LEVEL_AWAIT: fragments of async code compile
        try:
            compile(block.text, block.where, "exec", flags=flags)
        except SyntaxError as exc:
            self.fail(block, f"does not compile: {exc}")
            return
        text = self.substitute(block.text, block)
        if "file" in block.directives:
            (self.dir / block.directives["file"]).write_text(text)
        if "run" not in block.directives:
            return
        if needs_java(block, text) and not have_java():
            self.skipped.append(f"{block.where}: the program (no java)")
            return
        self.ran += 1
        script = self.dir / f"_block_{block.line}.py"
        script.write_text(text)
        self.run_foreground(block, f"python {script.name}", [])

    def run_console(self, block: Block) -> None:
        cmds = commands(block)
        if not cmds:
            self.fail(block, "a console block without a `$ ` command")
        for cmd in cmds:
            command = self.substitute(cmd.text, block)
            if (listed := not_run(command)) is not None:
                instead, _why = listed
                if instead is not None:
                    self.ran += 1
                    self.run_foreground(block, instead, [])
                continue
            if needs_java(block, command) and not have_java():
                self.skipped.append(f"{block.where}: `{command}` (no java)")
                continue
            self.ran += 1
            if "background" in block.directives:
                self.start_background(block, command)
            else:
                self.run_foreground(block, command, cmd.shown)
        if "wait-exit" in block.directives:
            self.wait_exit(block)

    def run_foreground(self, block: Block, command: str, shown: list[str]) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            failure = self.try_foreground(block, command, shown)
            if failure is None:
                return
            if "retry" not in block.directives or time.monotonic() > deadline:
                self.fail(block, *failure)
                return
            time.sleep(0.1)  # retrying a command until it passes, bounded by the deadline

    def try_foreground(
        self, block: Block, command: str, shown: list[str]
    ) -> tuple[str, str] | None:
        """None if the command passed, else what went wrong and its output.

        It runs in a process group of its own, killed once the command is done (or
        past its time), so nothing it left behind outlives it."""
        proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=self.dir,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            stdout, _ = proc.communicate(timeout=COMMAND_TIMEOUT)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            stdout, _ = proc.communicate()
            out = stdout.decode(errors="replace")
            return f"`{command}` did not finish within {COMMAND_TIMEOUT:g} s", out
        finally:
            _kill_group(proc.pid)
        output = stdout.decode(errors="replace")
        want = int(block.directives.get("status", "0"))
        if proc.returncode != want:
            return f"`{command}` exited {proc.returncode}, not {want}", output
        if "check-output" in block.directives and (miss := matches_in_order(shown, output)):
            return f"`{command}`: {miss}", output
        return None

    def start_background(self, block: Block, command: str) -> None:
        log = self.dir / f"_background_{len(self.background)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", command],
                cwd=self.dir,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: Ctrl-C for it alone
            )
        self.background.append((proc, log))
        until = block.directives.get("until")
        if not until:
            return
        deadline = time.monotonic() + START_TIMEOUT
        while until not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                self.fail(
                    block, f"`{command}` exited {proc.returncode} before {until!r}", log.read_text()
                )
                return
            if time.monotonic() > deadline:
                self.fail(block, f"`{command}` did not print {until!r} in time", log.read_text())
                return
            time.sleep(0.02)  # polling its output for a condition, bounded by the deadline

    def wait_exit(self, block: Block) -> None:
        if not self.background:
            self.fail(block, "wait-exit: no background command started")
            return
        proc, log = self.background[-1]
        children = _descendants(proc.pid)
        try:
            status = proc.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.fail(block, "wait-exit: the background command is still running", log.read_text())
            return
        deadline = time.monotonic() + STOP_TIMEOUT
        while not all(map(process_gone, children)) and time.monotonic() < deadline:
            time.sleep(0.02)  # its coordinator going too, bounded by the deadline
        want = block.directives["wait-exit"]
        if want and status != int(want):
            self.fail(block, f"the background command exited {status}, not {want}", log.read_text())

    def stop_all(self) -> None:
        """Ctrl-C for everything still running in the background, then SIGKILL."""
        for proc, _ in self.background:
            if proc.poll() is not None:
                _kill_group(proc.pid)  # anything it left behind
                continue
            family = [proc.pid, *_descendants(proc.pid)]
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_TIMEOUT)
            for pid in family:
                if not process_gone(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def page_run(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[PageRun]:
    run = PageRun(request.param, tmp_path)
    try:
        yield run
    finally:
        run.stop_all()


@pytest.mark.parametrize("page_run", pages(), ids=lambda p: str(p.relative_to(REPO)), indirect=True)
def test_page(page_run: PageRun) -> None:
    """Every block of the page, in order; all failures reported together, each with its
    page and line, the command and the end of its output."""
    for block in blocks(page_run.page):
        page_run.run_block(block)
    for skipped in page_run.skipped:  # shown in pytest's warnings summary
        warnings.warn(f"not run: {skipped}", stacklevel=1)
    assert not page_run.failures, "\n\n".join(
        [f"{len(page_run.failures)} failing block(s) in {page_run.page.name}:", *page_run.failures]
    )


def test_fences_parse(tmp_path: Path) -> None:
    """The parser itself: tags, directives, continuation lines and output."""
    page = tmp_path / "x.md"
    page.write_text(
        "<!-- docs-test: background until='ready now' -->\n"
        "```console\n$ ambrosia-py run a.py \\\n    --ingress 7000\nready now\n```\n"
    )
    (found,) = blocks(page)
    assert found.tag == "console" and found.directives == {"background": "", "until": "ready now"}
    (cmd,) = commands(found)
    assert cmd.text == "ambrosia-py run a.py  --ingress 7000" and cmd.shown == ["ready now"]
    assert not_run("make demo") is not None and not_run("make demonstrate") is None
    assert matches_in_order(["a ... c", "d"], "x\na b c\nd\n") is None
    assert matches_in_order(["d", "a"], "a\nd\n") is not None
