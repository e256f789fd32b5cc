"""Failures a service author can see: real ``ambrosia-py run`` processes.

A failing ``@background`` task stops the service with its own exit status (or is
restarted with backoff); a state attribute or an argument that cannot be pickled is
named; a service file that does not load is one line; a coordinator killed under the
service is said once, without tracebacks, with its own exit status; the ready line names
both pids.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py import background
from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli import main
from ambrosia_py.cli.exits import ExitStatus
from ambrosia_py.client import Client
from ambrosia_py.testing import free_port

DEADLINE = 60.0
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
# Loaded as run loads it, so run finds it loaded already under its own name.
Counter: Any = load_service(str(EXAMPLES / "counter.py"))

FAILING = """
import asyncio
from ambrosia_py import Immortal, background, rpc

class Failing(Immortal):
    def __init__(self) -> None:
        self.n = 0

    @rpc
    def add(self, n: int) -> None:
        self.n += n

    @background
    async def feed(self) -> None:
        self.impulse.add(1)
        await asyncio.sleep(0)
        raise ValueError("the feed broke")
"""

FLAKY = """
import asyncio, sys
from ambrosia_py import Immortal, background, rpc

starts = 0

class Flaky(Immortal):
    @rpc
    def nothing(self) -> None:
        pass

    @background
    async def feed(self) -> None:
        global starts
        starts += 1
        if starts <= 2:
            raise ConnectionError(f"start {starts} failed")
        print(f"feed is up after {starts} starts", file=sys.stderr, flush=True)
        await asyncio.Event().wait()
"""

UNPICKLABLE_ARGUMENT = """
import threading
from ambrosia_py import Immortal, background, rpc

class Sender(Immortal):
    @rpc
    def take(self, count: int, lock: object) -> None:
        pass

    @background
    async def feed(self) -> None:
        self.impulse.take(1, {"held": [threading.Lock()]})
"""

UNPICKLABLE_STATE = """
import threading
from ambrosia_py import Immortal, rpc

class Locked(Immortal):
    def __init__(self) -> None:
        self.count = 0
        self.guard = threading.Lock()

    @rpc
    def add(self, n: int) -> None:
        self.count += n
"""


class Run:
    """``ambrosia-py run ARGS`` as a child process; its stderr collected line by line."""

    def __init__(
        self, *args: str | Path | int, cwd: Path | None = None, env: dict[str, str] | None = None
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ambrosia_py.cli", "run", *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=None if env is None else {**os.environ, **env},
        )
        self.lines: list[str] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # the end
            self._changed.notify_all()

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, what: Callable[[str], bool]) -> str:
        """The first line for which ``what`` holds; fails at the deadline or the end."""
        deadline = time.monotonic() + DEADLINE
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if line == "":
                        raise AssertionError("run ended first:\n" + self.text)
                    if what(line):
                        return line
                seen = len(self.lines)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError("no such line by the deadline:\n" + self.text)
                self._changed.wait(left)

    def finish(self) -> int:
        """Its exit status, once it and its stderr have ended."""
        status = self.proc.wait(timeout=DEADLINE)
        with self._changed:
            self._changed.wait_for(lambda: self.lines[-1:] == [""], DEADLINE)
        return status

    def field(self, name: str) -> int:
        line = self.wait_for(lambda line: line.startswith("ready "))
        return int(dict(kv.split("=", 1) for kv in line.split() if "=" in kv)[name])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE)


def gone(pid: int) -> bool:
    """Whether ``pid`` has exited, waiting for it up to the deadline."""
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)  # polling a process that is not ours to wait for, with a deadline
    return False


@contextlib.contextmanager
def running(
    *args: str | Path | int, cwd: Path | None = None, env: dict[str, str] | None = None
) -> Iterator[Run]:
    """``ambrosia-py run ARGS``, killed (with its coordinator) at the end, pass or fail."""
    run = Run(*args, cwd=cwd, env=env)
    try:
        yield run
    finally:
        run.stop()
        with contextlib.suppress(AssertionError, ValueError, KeyError):
            ready = [line for line in run.lines if line.startswith("ready ")]
            if ready:
                pid = int(
                    dict(kv.split("=", 1) for kv in ready[0].split() if "=" in kv)[
                        "coordinator_pid"
                    ]
                )
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def service(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    return path


def error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("Error:")]


# --- @background tasks --------------------------------------------------------------------


def test_a_failing_background_task_stops_the_service(tmp_path: Path) -> None:
    path = service(tmp_path, "failing_feed", FAILING)
    with running(path, "--data-dir", tmp_path / "data") as run:
        coordinator = run.field("coordinator_pid")
        assert run.finish() == ExitStatus.BACKGROUND_TASK_FAILED
    text = run.text
    # Logged with its name and traceback...
    assert "background task feed failed" in text
    assert "Traceback" in text and 'raise ValueError("the feed broke")' in text
    # ...and said once, last, in one line.
    (error,) = error_lines(text)
    assert error == text.splitlines()[-1]
    assert "background task 'feed' failed: ValueError: the feed broke" in error
    # The coordinator made what it held durable and stopped too.
    assert gone(coordinator)
    assert "binding disconnected" in text


@pytest.mark.parametrize("where", ["run's option", "the task's own policy"])
def test_a_background_task_can_be_restarted_with_backoff(tmp_path: Path, where: str) -> None:
    if where == "run's option":
        path = service(tmp_path, "flaky_feed", FLAKY)
        args: tuple[Any, ...] = ("--background-failure", "restart")
    else:  # run's policy is stop, the task's restart
        code = FLAKY.replace("@background\n", '@background(on_failure="restart")\n')
        path, args = service(tmp_path, "flaky_own_feed", code), ()
    with running(path, "--data-dir", tmp_path / "data", *args) as run:
        run.wait_for(lambda line: "feed is up after 3 starts" in line)
        restarts = [line for line in run.lines if "restarting it in" in line]
        assert len(restarts) == 2
        assert "failed 1 time in a row; restarting it in 0.1 s" in restarts[0]
        assert "failed 2 times in a row; restarting it in 0.2 s" in restarts[1]
        assert run.text.count("ConnectionError: start ") == 2  # both tracebacks logged
        assert run.proc.poll() is None  # the service ran on meanwhile
        run.proc.send_signal(signal.SIGINT)
        assert run.finish() == ExitStatus.OK


def test_a_task_that_must_stop_the_service_does_so_whatever_run_says(tmp_path: Path) -> None:
    code = FAILING.replace("@background\n", '@background(on_failure="stop")\n')
    path = service(tmp_path, "failing_own_feed", code)
    args = (path, "--data-dir", tmp_path / "data", "--background-failure", "restart")
    with running(*args) as run:
        assert run.finish() == ExitStatus.BACKGROUND_TASK_FAILED
    assert "background task 'feed' failed: ValueError: the feed broke" in error_lines(run.text)[0]
    assert "restarting it" not in run.text


def test_a_background_policy_must_be_stop_or_restart() -> None:
    with pytest.raises(ValueError, match=r"on_failure='retry'.*one of \('stop', 'restart'\)"):
        background(on_failure="retry")


def test_an_unpicklable_impulse_argument_names_method_argument_and_task(tmp_path: Path) -> None:
    path = service(tmp_path, "sender", UNPICKLABLE_ARGUMENT)
    with running(path, "--data-dir", tmp_path / "data") as run:
        assert run.finish() == ExitStatus.BACKGROUND_TASK_FAILED
    (error,) = error_lines(run.text)
    assert "background task 'feed' failed" in error
    assert "Sender.take: argument 'lock' cannot be pickled: its part lock['held'][0]" in error
    assert "cannot pickle '_thread.lock' object" in error


# --- one line instead of a traceback ------------------------------------------------------


def test_a_state_attribute_that_cannot_be_pickled_is_named(tmp_path: Path) -> None:
    path = service(tmp_path, "locked", UNPICKLABLE_STATE)
    with running(path, "--data-dir", tmp_path / "data") as run:
        assert run.finish() == ExitStatus.SERVICE_FAILED
    assert "Traceback" not in run.text
    (error,) = error_lines(run.text)
    assert "Locked: state attribute 'guard' (of type lock) cannot be pickled" in error
    assert "--verbose shows the traceback" in error
    # The coordinator saw the binding go first; it says so as a log line, not as an
    # error of its own that would read as the cause.
    assert not [line for line in run.text.splitlines() if line.startswith("ambrosia-py:")]
    assert "disconnected" not in run.text
    assert "the binding went away during start-up" in run.text
    with running(path, "--data-dir", tmp_path / "data", "--verbose") as run:
        assert run.finish() == ExitStatus.SERVICE_FAILED
    assert "Traceback" in run.text and "state attribute 'guard'" in run.text


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *map(str, args)])
    return result.exit_code, result.output


def test_a_syntax_error_in_the_service_file_is_one_line(tmp_path: Path) -> None:
    path = service(
        tmp_path, "broken_syntax", "from ambrosia_py import Immortal\nclass X(Immortal)\n"
    )
    code, out = invoke(path, "--data-dir", tmp_path / "data")
    assert code == ExitStatus.ERROR
    assert out.splitlines() == [
        f"Error: the service file {path} does not load: SyntaxError at {path} line 2: "
        "expected ':' (--verbose shows the traceback)"
    ]
    assert not (tmp_path / "data").exists()  # nothing started
    code, out = invoke(path, "--verbose")
    assert code == ExitStatus.ERROR and "Traceback" in out and "SyntaxError" in out


@pytest.mark.parametrize(
    "command",
    [
        ["replay", "{path}", "--instance", "x"],
        ["log", "show", "{log}", "--service", "{path}"],
    ],
    ids=["replay", "log show"],
)
def test_every_command_that_loads_a_service_has_the_verbose_its_error_names(
    tmp_path: Path, command: list[str]
) -> None:
    path = service(tmp_path, "broken_import", "import no_such_module_here\n")
    log = tmp_path / "serverlog1"
    log.write_bytes(b"")
    argv = [a.format(path=path, log=log) for a in command] + ["--data-dir", str(tmp_path)]
    if command[0] == "log":
        argv = argv[:-2]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == ExitStatus.ERROR, result.output
    assert (
        "ModuleNotFoundError" in result.output and "--verbose shows the traceback" in result.output
    )
    assert "Traceback" not in result.output
    verbose = CliRunner().invoke(main, [*argv, "--verbose"])
    assert verbose.exit_code == ExitStatus.ERROR, verbose.output
    assert "Traceback" in verbose.output and "no_such_module_here" in verbose.output


def test_debug_takes_verbose_too() -> None:
    # debug loads the service after it found the instance's checkpoint (a real run).
    result = CliRunner().invoke(main, ["debug", "--help"])
    assert result.exit_code == 0 and "--verbose" in result.output


def test_an_exception_while_loading_names_its_line(tmp_path: Path) -> None:
    path = service(tmp_path, "broken_body", "import os\n\nvalue = undefined_name\n")
    code, out = invoke(path)
    assert code == ExitStatus.ERROR and "Traceback" not in out
    assert f"NameError at {path} line 3: name 'undefined_name' is not defined" in out


def test_the_service_options_of_a_file_that_does_not_load(tmp_path: Path) -> None:
    # run loads the file once for its options, then again to run it: the second load
    # says the same, rather than finding half a module.
    path = service(tmp_path, "broken_twice", "raise RuntimeError('no')\n")
    code, out = invoke(path, "--instance", "x")
    assert (
        code == ExitStatus.ERROR and "RuntimeError at" in out and "Immortal subclasses" not in out
    )


# --- the coordinator dies -----------------------------------------------------------------


def test_a_killed_coordinator_is_said_once(tmp_path: Path) -> None:
    data = tmp_path / "data"
    port = free_port()
    with running(EXAMPLES / "counter.py", "--data-dir", data, "--ingress", port) as run:
        ready = run.wait_for(lambda line: line.startswith("ready "))
        coordinator = run.field("coordinator_pid")
        # The ready line names both processes.
        assert f"service_pid={run.proc.pid}" in ready and f"coordinator_pid={coordinator}" in ready
        run.wait_for(lambda line: line.startswith("ingress listening on"))
        clients = [Client(f"127.0.0.1:{port}", data_dir=data) for _ in range(3)]
        try:
            for i, client in enumerate(clients):
                assert client.call(Counter.add, 1) == i + 1  # three open connections
            os.kill(coordinator, signal.SIGKILL)
            assert run.finish() == ExitStatus.COORDINATOR_DIED
        finally:
            for client in clients:
                client.close()
    text = run.text
    assert "CancelledError" not in text and "Traceback" not in text
    (error,) = error_lines(text)
    assert error == (
        f"Error: the coordinator (pid {coordinator}) was killed by SIGKILL; "
        "run the same command again to recover"
    )
    # As it says: running again recovers.
    with running(EXAMPLES / "counter.py", "--data-dir", data, "--ingress", port) as again:
        again.wait_for(lambda line: line.startswith("ingress listening on"))
        with Client(f"127.0.0.1:{port}", data_dir=data) as client:
            assert client.call(Counter.get) == 3
        again.proc.send_signal(signal.SIGINT)
        assert again.finish() == ExitStatus.OK


def test_unencodable_arguments_name_method_and_argument() -> None:
    import threading

    from ambrosia_py.binding import codec

    add = Counter.rpc_methods_by_name()["add"]
    with pytest.raises(codec.ArgumentEncodingError) as caught:
        codec.encode_args("pickle", add.signature, (threading.Lock(),), {})
    assert str(caught.value).startswith(
        "Counter.add: argument 'n' (of type lock) cannot be pickled"
    )
    with pytest.raises(codec.ArgumentEncodingError) as caught:
        codec.encode_args("json", add.signature, (), {"n": object()})
    assert str(caught.value).startswith(
        "Counter.add: argument 'n' (of type object) cannot be encoded"
    )
