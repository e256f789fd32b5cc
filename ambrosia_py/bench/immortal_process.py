"""One immortal per process, for the figures between two instances.

A service deployed with ``ambrosia-py run`` is a process of its own beside its
coordinator; two instances are two such pairs. The testing runner starts immortals as
threads of the calling process, so two of them there share one interpreter (one GIL):
each binding then gets half a core at best, which no deployment has. Here each immortal
runs in a process of its own (the testing runner inside it: its binding in that
process, its coordinator a child of it), driven over a pipe from the bench's process.

Timestamps cross processes as they are: ``time.perf_counter`` reads the system's
monotonic clock, the same in every process of the machine.

Waiting for a count is done by reading the immortal's attribute from the process's main
thread every 5 ms, not by the testing runner's state copies: each copy runs in the
binding's event loop (a loop turn, a task and a pickling of the whole state), a load
that no deployed immortal carries and that showed in its CPU and latency figures.
"""

from __future__ import annotations

import importlib
import multiprocessing.connection
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..binding.dispatch_state import Mode
from ..binding.immortal import Immortal

if TYPE_CHECKING:
    from ..testing.runner import RunningImmortal

__all__ = ["STAMPS", "ImmortalProcess", "serve_fd", "stamp"]

STAMPS: list[float] = []  # the times effects took, in the process that ran them


def stamp() -> None:
    """An effect: when a handler got this far (handlers may not read the clock)."""
    STAMPS.append(time.perf_counter())


class ImmortalProcess:
    """``service`` as ``instance`` in a process of its own, started (or recovered) and
    primary once this returns; ``options`` set the service's options by name."""

    def __init__(
        self,
        data_dir: Path,
        service: type[Immortal],
        instance: str,
        *,
        timeout: float = 600.0,
        **options: Any,
    ) -> None:
        self.instance = instance
        self.timeout = timeout
        ours, theirs = socket.socketpair()
        self._pipe = multiprocessing.connection.Connection(ours.detach())
        serve = f"from {__name__} import serve_fd; serve_fd({theirs.fileno()})"
        command = [sys.executable, "-c", serve]
        # A plain child process, not multiprocessing's: no re-import of the caller's
        # main module, whatever runs the bench.
        self._process = subprocess.Popen(command, pass_fds=[theirs.fileno()])
        theirs.close()
        try:
            self._pipe.send((str(data_dir), service.__module__, service.__qualname__))
            self._pipe.send((instance, timeout, options))
            self._ask("ready")
        except BaseException:
            self._process.kill()
            self._process.wait()
            self._pipe.close()
            raise

    def impulse(self, method: str, *args: Any) -> None:
        """Send ``method(*args)`` as an impulse, as a background task would."""
        self._ask("impulse", method, args)

    def wait_until_at_least(self, attribute: str, value: int) -> float:
        """Wait until the immortal's ``attribute`` is at least ``value``; return when it
        was seen so (``time.perf_counter``; polled every 5 ms)."""
        result: float = self._ask("wait", attribute, value)
        return result

    def stamps(self) -> list[float]:
        """The times :func:`stamp` effects took in that process since the last call."""
        result: list[float] = self._ask("stamps")
        return result

    def stop(self) -> None:
        """Stop the immortal (its coordinator makes what it holds durable) and the process."""
        try:
            if self._process.poll() is None:
                self._ask("stop")
            self._process.wait(self.timeout)
        finally:
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            self._pipe.close()

    def _ask(self, *request: Any) -> Any:
        if request[0] != "ready":
            self._pipe.send(request)
        if not self._pipe.poll(self.timeout):
            raise TimeoutError(f"{self.instance}: no answer to {request[0]!r} in {self.timeout} s")
        try:
            ok, value = self._pipe.recv()
        except EOFError:
            raise RuntimeError(f"{self.instance}: its process ended") from None
        if not ok:
            raise RuntimeError(f"{self.instance}: {request[0]!r} failed there:\n{value}")
        return value


def _wait_at_least(running: RunningImmortal, name: str, value: int, timeout: float) -> float:
    """When the primary immortal's attribute ``name`` was seen at ``value`` or more
    (``time.perf_counter``), read from this thread between the binding's steps."""
    deadline = time.monotonic() + timeout
    polls = 0
    while True:
        d = running.dispatcher
        if d.mode is Mode.PRIMARY and getattr(d.immortal, name) >= value:
            return time.perf_counter()
        polls += 1
        if polls % 200 == 0 or time.monotonic() > deadline:
            _ = running.state  # raises, saying why, if the binding has stopped
        if time.monotonic() > deadline:
            raise TimeoutError(f"{running.instance}: {name} did not reach {value} in {timeout} s")
        time.sleep(0.005)


def _serve(pipe: multiprocessing.connection.Connection) -> None:
    """The child: start the immortal, then answer the bench's requests until ``stop``."""
    from ..testing.runner import ImmortalRunner

    data_dir, module, qualname = pipe.recv()
    instance, timeout, options = pipe.recv()
    runner = ImmortalRunner(Path(data_dir), timeout=timeout)
    try:
        service = getattr(importlib.import_module(module), qualname)
        running = runner.start(service, instance, **options)
    except BaseException:
        pipe.send((False, traceback.format_exc()))
        runner.close()
        return
    pipe.send((True, None))
    try:
        while True:
            request = pipe.recv()
            try:
                if request[0] == "impulse":
                    getattr(running.impulse, request[1])(*request[2])
                    answer: Any = None
                elif request[0] == "wait":
                    answer = _wait_at_least(running, request[1], request[2], timeout)
                elif request[0] == "stamps":
                    answer = list(STAMPS)
                    STAMPS.clear()
                else:  # stop
                    running.stop()
                    pipe.send((True, None))
                    return
            except Exception:
                pipe.send((False, traceback.format_exc()))
                continue
            pipe.send((True, answer))
    finally:
        runner.close()


def serve_fd(fd: int) -> None:
    """The child's entry: serve the bench over the connection on descriptor ``fd``."""
    _serve(multiprocessing.connection.Connection(fd))
