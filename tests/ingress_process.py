"""``ambrosia-py run SERVICE --ingress`` as a child process, for the process tests of the
ingress (tests/test_counter_e2e.py, tests/test_ingress_crash.py): started, waited for,
SIGKILLed (the service or its coordinator), always stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

DEADLINE = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)  # polling for a process to end, bounded by the deadline
    raise AssertionError(f"process {pid} did not stop")


class RunProcess:
    """One ``ambrosia-py run`` (the service) and its coordinator (a child of it)."""

    def __init__(self, service: Path, data_dir: Path, port: int, *args: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambrosia_py.cli",
                "run",
                str(service),
                "--data-dir",
                str(data_dir),
                "--ingress",
                f"127.0.0.1:{port}",
                *args,
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self.ic_pid = 0
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(DEADLINE) or self.proc.poll() is not None:
            self.stop()
            raise AssertionError("the service did not start:\n" + "".join(self.lines))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("ready "):
                fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
                self.ic_pid = int(fields["pid"])
            if line.startswith("ingress listening on"):
                self._ready.set()
        self._ready.set()

    def kill(self, coordinator: bool) -> None:
        """SIGKILL the service or its coordinator; the other stops by itself."""
        os.kill(self.ic_pid if coordinator else self.proc.pid, signal.SIGKILL)
        if coordinator:
            assert self.proc.wait(timeout=DEADLINE) is not None  # the service sees it go
        else:
            wait_gone(self.ic_pid)  # the coordinator sees its binding go

    def stop(self) -> None:
        for pid in (self.proc.pid, self.ic_pid):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)
        if self.ic_pid:
            wait_gone(self.ic_pid)
