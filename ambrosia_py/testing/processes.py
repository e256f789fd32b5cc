"""An immortal as real processes: ``ambrosia-py run`` and the coordinator it starts.

For crash tests, benches and demos that kill the real thing. :class:`ServiceProcess`
starts ``ambrosia-py run SERVICE --instance NAME --data-dir DIR [ARGS]`` with its output
in a log file (a pipe nobody reads would fill and stall it), finds the coordinator child,
SIGKILLs the service process, the coordinator or both and waits until both are gone, and
stops them cleanly. Every wait has a deadline.

    svc = ServiceProcess("examples/counter.py", "counter", tmp_path, ["--ingress", ":0"])
    svc.start()
    svc.wait_for_log("ingress listening on")
    svc.kill("both")
    svc.start()  # the same command again: it recovers
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Literal

__all__ = [
    "ServiceProcess",
    "Victim",
    "interruptible",
    "process_gone",
    "readline_within",
    "wait_for",
]

Victim = Literal["service", "coordinator", "both"]
DEADLINE = 30.0


def wait_for(
    what: str,
    condition: Callable[[], bool],
    timeout: float = DEADLINE,
    context: Callable[[], str] = lambda: "",
) -> None:
    """Poll ``condition`` until it holds; past ``timeout`` raise TimeoutError naming
    ``what`` (and ``context()``, e.g. the end of a log)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            extra = context()
            raise TimeoutError(
                f"timed out after {timeout:g} s waiting for {what}"
                + (f"\n{extra}" if extra else "")
            )
        time.sleep(0.01)  # polling a condition, bounded by the deadline


def readline_within(stream: IO[str], timeout: float = DEADLINE) -> str:
    """A line from a child's ``stream``, or ``""`` at its end or if none comes within
    ``timeout``: a child that hangs before its line must not hang the caller. (A line
    that comes later is lost to the thread left reading: give up on the stream then.)"""
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: lines.put(stream.readline()), daemon=True).start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        return ""


def process_gone(pid: int) -> bool:
    """Exited: no such process, or a zombie nobody has reaped yet (an orphaned
    coordinator's parent may be a PID 1 that never reaps)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def interruptible() -> None:
    """In the child before exec: SIGINT stops it (the binding's KeyboardInterrupt), even
    when the parent runs in the background, where the shell ignores SIGINT for it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ServiceProcess:
    """One ``ambrosia-py run SERVICE`` and the coordinator it starts (``instance`` None:
    the name ``run`` gives by default)."""

    def __init__(
        self,
        service: str,
        instance: str | None,
        data_dir: Path,
        args: Sequence[str] = (),
        *,
        log: Path | None = None,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.service = service
        self.instance = instance or Path(service).stem  # None: run's default name
        self._instance_args = ["--instance", instance] if instance else []
        self.data_dir = Path(data_dir)
        self.args = list(args)
        self.log = log or self.data_dir / f"{self.instance}.run.log"
        self.cwd = cwd
        self.env = dict(env) if env is not None else None
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._log_start = 0  # where this start's output begins in the log

    @property
    def argv(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "run",
            self.service,
            *self._instance_args,
            "--data-dir",
            str(self.data_dir),
            *self.args,
        ]

    def start(self) -> None:
        """Run the command (again: it recovers); :meth:`wait_for_log` says when it serves."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self._log_start = log.tell()
            self.proc = subprocess.Popen(
                self.argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env,
                preexec_fn=interruptible,
                close_fds=True,
            )
        self.starts += 1

    def output(self) -> str:
        """What this start has printed so far."""
        with self.log.open("rb") as f:
            f.seek(self._log_start)
            return f.read().decode(errors="replace")

    def tail(self, n: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        """Raise naming the instance, with its log's end, if the service process exited."""
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"{self.instance} exited ({self.proc.returncode}):\n{self.tail()}")

    def wait_for_log(self, text: str, timeout: float = 60.0) -> None:
        """Wait until this start's output contains ``text``; fail at once if it exits."""

        def seen() -> bool:
            if text in self.output():
                return True
            self.check_alive()
            return False

        def last_lines() -> str:
            return f"{self.log} ends:\n" + "\n".join(self.tail().splitlines()[-20:])

        wait_for(f"{self.instance} to print {text!r}", seen, timeout, last_lines)

    def coordinator_pid(self) -> int | None:
        """The coordinator child, whichever of the service's threads started it."""
        if self.proc is None:
            return None
        for children in Path(f"/proc/{self.proc.pid}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                if pids := children.read_text().split():
                    return int(pids[0])
        return None

    def kill(self, which: Victim = "both", timeout: float = DEADLINE) -> None:
        """SIGKILL the service process, its coordinator or both; return once both are
        gone (either way both end: a coordinator stops when its binding goes, and a
        binding when its coordinator goes)."""
        assert self.proc is not None, "not started"
        ic = self.coordinator_pid()
        victims: dict[str, list[int | None]] = {
            "service": [self.proc.pid],
            "coordinator": [ic],
            "both": [ic, self.proc.pid],
        }
        for pid in victims[which]:
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._reap(ic, timeout)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGINT (the binding stops its coordinator); whatever is left is killed."""
        if self.proc is None or self.proc.poll() is not None:
            return
        ic = self.coordinator_pid()
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._reap(ic, timeout)

    def _reap(self, ic: int | None, timeout: float) -> None:
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if ic is None:
            return
        try:
            wait_for(
                f"{self.instance}'s coordinator (pid {ic}) to exit",
                lambda: process_gone(ic),
                timeout,
            )
        except TimeoutError:  # a coordinator that outlived its binding
            with contextlib.suppress(ProcessLookupError):
                os.kill(ic, signal.SIGKILL)
            wait_for(
                f"{self.instance}'s coordinator (pid {ic}) to die",
                lambda: process_gone(ic),
                timeout,
            )

    @contextlib.contextmanager
    def running(self) -> Iterator[ServiceProcess]:
        """Started for the ``with`` block, stopped after it."""
        self.start()
        try:
            yield self
        finally:
            self.stop()
