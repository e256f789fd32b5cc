"""End to end: examples/counter.py under `ambrosia-py run`, SIGKILLed at random points.

A client sends ``add v`` with distinct values and waits for each ``ok``. After every
crash (of the service or of its coordinator, alternately) the command is run again and
the recovered count must be the sum of a prefix of the values sent that includes every
acknowledged one: each acknowledged call counted exactly once, none lost, none twice.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counter.py"
DEADLINE = 60.0


class Service:
    def __init__(self, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambrosia_py.cli",
                "run",
                str(EXAMPLE),
                "--data-dir",
                str(data_dir),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.port = 0
        self.ic_pid = 0
        threading.Thread(target=self._drain, daemon=True).start()
        if not self._ready.wait(DEADLINE):
            raise AssertionError("service did not start:\n" + "".join(self.lines))

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            if line.startswith("ready "):
                fields = dict(kv.split("=") for kv in line.split() if "=" in kv)
                self.ic_pid = int(fields["pid"])
            if "counter listening on" in line:
                self.port = int(line.rsplit(":", 1)[1])
                self._ready.set()
        self._ready.set()

    def stop(self) -> None:
        for pid in (self.proc.pid, self.ic_pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(timeout=DEADLINE)


def wait_gone(pid: int) -> None:
    deadline = time.monotonic() + DEADLINE
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.01)  # polling for a process to end, bounded by the deadline
    raise AssertionError(f"process {pid} did not stop")


def test_counter_survives_sigkill_of_either_process(tmp_path: Path) -> None:
    rng = random.Random(7)
    values = list(range(1, 10_000))
    sent = 0  # values[:sent] were sent
    acked = 0  # values[:acked] were acknowledged
    for round_no in range(5):
        svc = Service(tmp_path)
        try:
            with socket.create_connection(("127.0.0.1", svc.port), timeout=DEADLINE) as conn:
                f = conn.makefile("rw")
                f.write("get\n")
                f.flush()
                count = int(f.readline().split()[1])
                # Exactly once: the count is the sum of a prefix of what was sent that
                # holds every acknowledged value.
                applied = [j for j in range(acked, sent + 1) if sum(values[:j]) == count]
                assert applied, (
                    f"round {round_no}: count {count} is no prefix sum ({acked=} {sent=})"
                )
                sent = acked = applied[0]
                if round_no == 4:
                    break
                for _ in range(rng.randint(5, 60)):
                    f.write(f"add {values[sent]}\n")
                    f.flush()
                    sent += 1
                    assert f.readline().startswith("ok "), "no acknowledgement"
                    acked = sent
                # One more call in flight when the kill comes: it may or may not count.
                f.write(f"add {values[sent]}\n")
                f.flush()
                sent += 1
                victim = svc.proc.pid if round_no % 2 == 0 else svc.ic_pid
                os.kill(victim, signal.SIGKILL)
            # The other process notices and stops by itself.
            if round_no % 2 == 0:
                wait_gone(svc.ic_pid)  # the coordinator sees its binding go
            else:
                assert svc.proc.wait(timeout=DEADLINE) is not None  # the service sees its IC go
        finally:
            svc.stop()
    assert acked > 0
