"""``ambrosia-py demo``: the main job, end to end, on this machine.

It runs ``examples/counter.py`` under ``ambrosia-py run`` in a fresh data directory,
sends it calls over TCP, kills the service with SIGKILL in the middle of the stream,
runs the same command again, and shows that every acknowledged call was counted exactly
once; then it verifies the recorded log and lists the instance.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click
from rich.console import Console

__all__ = ["demo"]

_DEADLINE = 60.0


class _Service:
    """``ambrosia-py run`` as a child process; learns the counter's port from its log."""

    def __init__(self, example: Path, data_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambrosia_py.cli",
                "run",
                str(example),
                "--data-dir",
                str(data_dir),
            ],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        self.port = 0
        self.log: list[str] = []
        ready = threading.Event()

        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.log.append(line)
                if "counter listening on" in line:
                    self.port = int(line.rsplit(":", 1)[1])
                    ready.set()
            ready.set()

        threading.Thread(target=drain, daemon=True).start()
        if not ready.wait(_DEADLINE) or not self.port:
            self.proc.kill()
            raise click.ClickException("the service did not start:\n" + "".join(self.log))

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=_DEADLINE)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _ask(f: object, line: str) -> str:
    assert hasattr(f, "write") and hasattr(f, "readline") and hasattr(f, "flush")
    f.write(line + "\n")
    f.flush()
    return str(f.readline()).strip()


@click.command()
@click.option(
    "--example",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=Path("examples/counter.py"),
    show_default=True,
    help="The counter service to run.",
)
@click.option("--calls", default=200, show_default=True, help="Calls before the crash.")
def demo(example: Path, calls: int) -> None:
    """Run the counter, SIGKILL it mid-stream, recover, and check exactly-once."""
    console = Console()
    with tempfile.TemporaryDirectory(prefix="ambrosia-demo-") as tmp:
        data_dir = Path(tmp)
        console.rule("1. start the counter (coordinator + service)")
        svc = _Service(example, data_dir)
        console.print(f"counter is listening on 127.0.0.1:{svc.port}")
        acked = 0
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", svc.port), timeout=_DEADLINE) as conn:
            f = conn.makefile("rw")
            for i in range(1, calls + 1):
                reply = _ask(f, f"add {i}")
                if not reply.startswith("ok "):
                    raise click.ClickException(f"unexpected reply {reply!r}")
                acked += i
        elapsed = time.perf_counter() - start
        console.print(
            f"{calls} calls acknowledged, each logged durably before it ran "
            f"({calls / elapsed:,.0f} acknowledged round trips/s); count = {acked}"
        )
        console.rule("2. SIGKILL the service")
        svc.kill()
        console.print(f"killed pid {svc.proc.pid}; its coordinator saw it go and stopped")
        console.rule("3. run the same command again: recovery")
        svc = _Service(example, data_dir)
        with socket.create_connection(("127.0.0.1", svc.port), timeout=_DEADLINE) as conn:
            f = conn.makefile("rw")
            count = int(_ask(f, "get").split()[1])
            after = _ask(f, "add 1")
        svc.stop()
        verdict = "[green]exactly once[/green]" if count == acked else "[red]MISMATCH[/red]"
        console.print(f"recovered count = {count}, expected {acked}: {verdict}; then {after!r}")
        for line in svc.log:
            if "replayed" in line or "checkpoint" in line:
                console.print("  " + line.rstrip(), style="dim", markup=False, highlight=False)
        console.rule("4. the history stays on disk")
        for args in (
            ["log", "verify", str(data_dir / "counter_0")],
            ["instances", "--data-dir", str(data_dir)],
        ):
            out = subprocess.run(
                [sys.executable, "-m", "ambrosia_py.cli", *args], capture_output=True, text=True
            )
            console.print(f"$ ambrosia-py {args[0]} {args[1]} ...", style="bold")
            console.print(out.stdout.rstrip(), markup=False, highlight=False)
        if count != acked:
            raise SystemExit(1)
