"""The producer (``examples/pipeline/producer.py``) as a child process of the demo.

It is a plain program, not an immortal (its docstring says why that is enough), so the
demo never kills it. Its stdout is one JSON object per line: progress (``produced``,
``stored``, ``reconnects``, ``recovered``) every tenth of a second, then ``done``. A
thread reads them as they come and keeps the newest; everything is also copied to its
log file, for the end of the log a failure prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

__all__ = ["ProducerProcess"]


class ProducerProcess:
    """``python -m examples.pipeline.producer ...``, its progress read as it comes."""

    def __init__(self, args: list[str], log: Path, cwd: Path, env: Mapping[str, str]) -> None:
        self.argv = [sys.executable, "-m", "examples.pipeline.producer", *args]
        self.log = log
        self.cwd, self.env = cwd, dict(env)
        self.proc: subprocess.Popen[str] | None = None
        self.progress: dict[str, int] = {}
        self.done = False
        self._reader: threading.Thread | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                cwd=self.cwd,
                env=self.env,
                text=True,
            )
        self._reader = threading.Thread(target=self._read, name="producer-output", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with self.log.open("a") as log:
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                try:
                    message = json.loads(line)
                except ValueError:
                    continue  # not ours (a stray print); it is in the log
                if not isinstance(message, dict):
                    continue
                if "done" in message:
                    self.done = True
                elif "produced" in message:
                    self.progress = {k: int(v) for k, v in message.items()}

    def exited(self) -> int | None:
        """Its exit status once it has exited and its output is all read; else None."""
        if self.proc is None or self.proc.poll() is None:
            return None
        if self._reader is not None:
            self._reader.join(5.0)  # the pipe is at its end: this returns at once
        return self.proc.returncode

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def stop(self) -> None:
        """Ended if it still runs (only when the demo fails or is interrupted)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.kill()
        self.proc.wait(10)
