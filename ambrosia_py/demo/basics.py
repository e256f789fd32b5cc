"""``ambrosia-py demo --basics``: the core, in two small examples.

It runs ``examples/counter.py`` under ``ambrosia-py run --ingress`` in a fresh data
directory, calls it with :class:`ambrosia_py.client.Client`, kills the service with
SIGKILL while a call is in flight, runs the same command again, and shows that every
call, the one in flight included, was counted exactly once (the client sent it again
with the same idempotency key); then it verifies the recorded log and lists the
instance. Last, ``examples/hello``:
a client awaiting a server on another instance, the server SIGKILLed mid-stream and run
again, every call run exactly once. (The main demo, the pipeline, is :mod:`.command`.)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import click

from ..binding.loading import load_service
from ..client import Client
from ..coordinator.storage.files import log_bytes_in
from ..testing.ports import free_port
from ..testing.processes import interruptible
from .output import Output

__all__ = ["run_basics"]

_DEADLINE = 60.0


class _Service:
    """``ambrosia-py run`` as a child process, its output collected.

    It counts as started once a line containing ``ready`` appears; for the counter that is
    the line naming its port.
    """

    def __init__(self, example: Path, data_dir: Path, *args: str, ready: str) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ambrosia_py.cli",
                "run",
                str(example),
                "--data-dir",
                str(data_dir),
                *args,
            ],
            stderr=subprocess.STDOUT,
            stdout=subprocess.PIPE,
            text=True,
            preexec_fn=interruptible,  # stop() sends SIGINT, however the demo was started
        )
        self.port = 0
        self.log: list[str] = []
        started = threading.Event()
        self.finished = threading.Event()

        def drain() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.log.append(line)
                if ready in line:
                    if "listening on" in line:
                        self.port = int(line.rsplit(":", 1)[1])
                    started.set()
                if line.startswith("done:"):
                    self.finished.set()
            started.set()
            self.finished.set()

        threading.Thread(target=drain, daemon=True).start()
        if not started.wait(_DEADLINE) or self.proc.poll() is not None:
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


def run_basics(out: Output, examples: Path, calls: int = 200) -> bool:
    """The counter and examples/hello, each SIGKILLed mid-stream, recovered, checked;
    whether each was exactly once. Off a terminal a heartbeat line comes whenever a
    step keeps quiet (starting a service, recovering, waiting for calls)."""
    with out.heartbeat("demo --basics"):
        return _basics(out, examples, calls)


def _basics(out: Output, examples: Path, calls: int) -> bool:
    example = examples / "counter.py"
    with tempfile.TemporaryDirectory(prefix="ambrosia-demo-") as tmp:
        data_dir = Path(tmp)
        out.rule("1. start the counter (coordinator + service) with its ingress")
        address = f"127.0.0.1:{free_port()}"
        run_args = ("--ingress", address)
        svc = _Service(example, data_dir, *run_args, ready="ingress listening on")
        out.print(f"the counter takes calls on {address}")
        counter: Any = load_service(str(example))
        acked = 0
        with Client(address, data_dir=data_dir, timeout=_DEADLINE) as client:
            start = time.perf_counter()
            for i in range(1, calls + 1):
                acked += i
                if client.call(counter.add, i) != acked:
                    raise click.ClickException(f"add {i} did not answer {acked}")
            elapsed = time.perf_counter() - start
            out.print(
                f"{calls} calls answered, each logged durably before it ran "
                f"({calls / elapsed:,.0f} answered calls/s); count = {acked}"
            )
            out.rule("2. SIGKILL the service while a call is in flight")
            last: list[int] = []
            in_flight = threading.Thread(
                target=lambda: last.append(client.call(counter.add, 1, key="demo-last"))
            )
            in_flight.start()
            svc.kill()
            acked += 1
            out.print(f"killed pid {svc.proc.pid}; its coordinator saw it go and stopped")
            out.rule("3. run the same command again: recovery")
            svc = _Service(example, data_dir, *run_args, ready="ingress listening on")
            in_flight.join(_DEADLINE)
            out.print(f"the call in flight was sent again with its key and answered: {last}")
            count = client.call(counter.get)
        svc.stop()
        good = count == acked and last == [acked]
        verdict = "[green]exactly once[/green]" if good else "[red]MISMATCH[/red]"
        out.print(f"recovered count = {count}, expected {acked}: {verdict}")
        for line in svc.log:
            if "replayed" in line or "checkpoint" in line:
                out.print("  " + line.rstrip(), style="dim", markup=False, highlight=False)
        out.rule("4. the history stays on disk")
        for args in (
            ["log", "verify", str(data_dir / "counter_0")],
            ["instances", "--data-dir", str(data_dir)],
        ):
            ran = subprocess.run(
                [sys.executable, "-m", "ambrosia_py.cli", *args], capture_output=True, text=True
            )
            out.print(f"$ ambrosia-py {args[0]} {args[1]} ...", style="bold")
            out.verbatim(ran.stdout.rstrip())
        return _hello(out, examples / "hello", data_dir) and good


def _hello(out: Output, folder: Path, data_dir: Path, count: int = 1001) -> bool:
    """Two instances linked over TCP; the server is SIGKILLed while the client awaits it."""
    out.rule("5. two immortals: examples/hello, client awaiting the server")
    server = _Service(folder / "server.py", data_dir, "--instance", "server", ready="ready")
    client = _Service(
        folder / "client.py",
        data_dir,
        "--instance",
        "client",
        "--count",
        str(count),
        ready="ready",
    )
    # Kill in mid-stream: once the server's log holds a good share of the calls.
    log_dir = data_dir / "server_0"
    deadline = time.monotonic() + _DEADLINE
    while log_bytes_in(log_dir) < 20 * count and not client.finished.is_set():
        if time.monotonic() > deadline:
            raise click.ClickException("no calls reached the server:\n" + "".join(server.log))
        time.sleep(0.02)  # polling a condition, bounded by the deadline
    server.kill()
    out.print(f"SIGKILLed the server (pid {server.proc.pid}) with calls in flight")
    server = _Service(folder / "server.py", data_dir, "--instance", "server", ready="ready")
    out.print("ran the server's command again: it recovered, the link reconnected")
    client.finished.wait(_DEADLINE)
    client.stop()
    server.stop()
    done = [line.strip() for line in client.log if line.startswith("done:")]
    expected = f"greeting #{count}"
    good = bool(done) and expected in done[0]
    verdict = "[green]exactly once[/green]" if good else "[red]MISMATCH[/red]"
    out.print(f"client: {done[0] if done else 'did not finish'}", markup=False)
    out.print(f"{count} awaited calls, each run once by the server (#{count} last): {verdict}")
    return good
