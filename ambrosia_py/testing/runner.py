"""Run an immortal under test: a real coordinator process, the binding in this process.

The coordinator is started with ``ambrosia-py coordinator`` in a data directory of the
test's; the binding runs on an event loop in a thread of the test process, so the test
can send impulses, wait for the state it expects, read the state, and kill the
coordinator with SIGKILL whenever it likes. The binding dies with its coordinator (its
in-memory state is dropped); starting the same instance again recovers from the log.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cloudpickle

from .. import eventloop
from ..binding.client import serve
from ..binding.dispatcher import Dispatcher, Mode
from ..binding.files import StateFiles, state_files_dir, use_state_files
from ..binding.immortal import Immortal
from ..coordinator.binding_auth import token_for_ready_line
from ..coordinator.ic_cli import coordinator_argv
from .processes import readline_within

__all__ = ["ImmortalRunner", "RunningImmortal"]

DEFAULT_TIMEOUT = 30.0


class _Impulses:
    def __init__(self, running: RunningImmortal) -> None:
        self._running = running

    def __getattr__(self, name: str) -> Callable[..., None]:
        def send(*args: Any, **kwargs: Any) -> None:
            def in_loop() -> None:
                getattr(self._running.dispatcher.immortal.impulse, name)(*args, **kwargs)

            self._running._in_loop(in_loop)

        return send


class RunningImmortal:
    """One incarnation of an immortal: its coordinator process and its binding thread."""

    def __init__(
        self,
        service: type[Immortal],
        data_dir: Path,
        instance: str,
        timeout: float,
        options: dict[str, Any] | None = None,
        coordinator_options: Sequence[str] = (),
    ) -> None:
        options = options or {}
        self.service = service
        self.instance = instance
        self.data_dir = data_dir
        self.timeout = timeout
        # The coordinator's log goes to a file (a pipe nobody reads would fill up and
        # stall it); failures quote its end.
        data_dir.mkdir(parents=True, exist_ok=True)
        self.ic_log = data_dir / f"{instance}.coordinator.log"
        with self.ic_log.open("ab") as log_file:
            self.ic = subprocess.Popen(
                coordinator_argv(instance, data_dir, *coordinator_options),
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
            )
        assert self.ic.stdout is not None
        line = readline_within(self.ic.stdout, timeout)
        if not line.startswith("ready"):
            if line == "" and self.ic.poll() is None:  # no line, and it still runs: hung
                self.ic.kill()
            self.ic.wait(timeout)
            raise RuntimeError(f"coordinator did not start: {line!r}\n{self._log_tail()}")
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        self._token = token_for_ready_line(fields, data_dir, instance)
        self.dispatcher = Dispatcher(service, instance, options=service.make_options(**options))
        self.loop = eventloop.new_event_loop()
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(int(fields["receive_port"]), int(fields["send_port"])),
            daemon=True,
        )
        self._thread.start()
        try:
            self.wait_until(lambda _: self.dispatcher.mode is Mode.PRIMARY)
        except BaseException:  # the caller gets no handle to stop it with: stop it here
            # A coordinator that refused the start exits by itself, saying why: let it.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.ic.wait(self.timeout)
            self.kill()
            raise

    def _run(self, receive_port: int, send_port: int) -> None:
        try:
            with use_state_files(StateFiles(state_files_dir(self.data_dir, self.instance))):
                self.loop.run_until_complete(
                    serve(
                        self.service,
                        self.instance,
                        receive_port,
                        send_port,
                        dispatcher=self.dispatcher,
                        token=self._token,
                    )
                )
        except BaseException as exc:  # reported to the test by the next call
            self.error = exc

    def _in_loop(self, fn: Callable[[], Any]) -> Any:
        if not self._thread.is_alive():
            raise RuntimeError(f"the binding of {self.instance!r} has stopped ({self.error!r})")

        async def call() -> Any:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(self.timeout)

    @property
    def impulse(self) -> Any:
        """``running.impulse.method(args)``: an impulse, as a background task would send."""
        return _Impulses(self)

    @property
    def state(self) -> dict[str, Any]:
        """A copy of the immortal's attributes, taken between two records."""

        def copy() -> dict[str, Any]:
            return dict(cloudpickle.loads(cloudpickle.dumps(self.dispatcher.state())))

        result: dict[str, Any] = self._in_loop(copy)
        return result

    def wait_until(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float | None = None
    ) -> dict[str, Any]:
        """Wait (with a deadline) until ``predicate(state)`` holds; return that state."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            state = self.state if self.dispatcher.mode is Mode.PRIMARY else {}
            if self.dispatcher.mode is Mode.PRIMARY and predicate(state):
                return state
            if not self._thread.is_alive():
                raise RuntimeError(
                    f"the binding of {self.instance!r} stopped ({self.error!r})\n"
                    + self._log_tail()
                ) from self.error
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.instance}: condition not met; state {state!r}\n{self._log_tail()}"
                )
            time.sleep(0.005)  # polling a condition, bounded by the deadline

    def _log_tail(self, lines: int = 20) -> str:
        text = self.ic_log.read_text(errors="replace").splitlines()[-lines:]
        return "coordinator log (last lines):\n" + "\n".join(text)

    def kill(self) -> None:
        """SIGKILL the coordinator; the binding goes down with it."""
        if self.ic.poll() is None:
            os.kill(self.ic.pid, signal.SIGKILL)
        self.ic.wait(self.timeout)
        self._thread.join(self.timeout)
        self.loop.close()

    def stop(self) -> None:
        """Stop cleanly: the binding leaves, the coordinator flushes and exits."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self._cancel_all)
            self._thread.join(self.timeout)
        try:
            self.ic.wait(self.timeout)
        except subprocess.TimeoutExpired:
            self.ic.kill()
            self.ic.wait()
        if not self.loop.is_closed():
            self.loop.close()

    def _cancel_all(self) -> None:
        for task in asyncio.all_tasks(self.loop):
            task.cancel()


class ImmortalRunner:
    """Starts immortals in one data directory and cleans up after the test."""

    def __init__(
        self,
        data_dir: Path,
        timeout: float = DEFAULT_TIMEOUT,
        coordinator_options: Sequence[str] = (),
    ) -> None:
        """``coordinator_options``: more command-line options for every coordinator it
        starts (``--link-to``, ``--secret-file``, ...), as ``ambrosia-py coordinator``
        takes them."""
        self.data_dir = data_dir
        self.timeout = timeout
        self.coordinator_options = tuple(coordinator_options)
        self._running: list[RunningImmortal] = []

    def start(
        self, service: type[Immortal], instance: str | None = None, **options: Any
    ) -> RunningImmortal:
        """Start (or, if it has history, recover) ``instance`` running ``service``.

        ``options`` set the service's options (its nested ``Options`` class) by name.
        """
        running = RunningImmortal(
            service,
            self.data_dir,
            instance or service.__name__.lower(),
            self.timeout,
            options,
            self.coordinator_options,
        )
        self._running.append(running)
        return running

    def close(self) -> None:
        for running in self._running:
            if running.ic.poll() is None:
                running.kill()
