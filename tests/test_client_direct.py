"""The blocking client's own connection, used by the calling threads (client/blocking.py),
against a real ``ambrosia-py run --ingress``: many threads share it, a call that gets no
answer in time says it may have run, and closing the client ends a call waiting on it."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import CallTimeoutError, Client, ClientClosedError

from .ingress_process import DEADLINE, RunProcess, free_port

SERVICE = """
from ambrosia_py import Immortal, rpc


class Echo(Immortal):
    def __init__(self) -> None:
        self.calls = 0

    @rpc
    def echo(self, text: str) -> str:
        self.calls += 1
        return text.upper()
"""


@pytest.fixture
def echo(tmp_path: Path) -> Iterator[tuple[RunProcess, Any, str, Path]]:
    service_file = tmp_path / "direct_echo.py"
    service_file.write_text(SERVICE)
    service: Any = load_service(str(service_file))
    port = free_port()
    svc = RunProcess(service_file, tmp_path / "data", port)
    try:
        yield svc, service, f"127.0.0.1:{port}", tmp_path / "data"
    finally:
        if svc.proc is not None and svc.proc.poll() is None:
            os.kill(svc.proc.pid, signal.SIGCONT)
        svc.stop()


def test_many_threads_share_one_client(echo: tuple[RunProcess, Any, str, Path]) -> None:
    _, service, address, data_dir = echo
    got: dict[str, str] = {}
    errors: list[BaseException] = []
    with Client(address, data_dir=data_dir, timeout=DEADLINE) as client:
        assert client.call(service.echo, "first") == "FIRST"  # reached: the direct way now

        def caller(t: int) -> None:
            try:
                for i in range(40):
                    text = f"t{t}-{i}"
                    got[text] = client.call(service.echo, text)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=caller, args=(t,)) for t in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
        assert client.resent == 0
    assert not errors, errors
    assert got == {f"t{t}-{i}": f"T{t}-{i}".upper() for t in range(8) for i in range(40)}


def test_no_answer_in_time_says_it_may_have_run(echo: tuple[RunProcess, Any, str, Path]) -> None:
    svc, service, address, data_dir = echo
    assert svc.proc is not None
    with Client(address, data_dir=data_dir, timeout=1.0) as client:
        assert client.call(service.echo, "a") == "A"
        assert client.call(service.echo, "b") == "B"  # on the calling thread's connection
        os.kill(svc.proc.pid, signal.SIGSTOP)  # the service answers nothing
        try:
            with pytest.raises(CallTimeoutError) as e:
                client.call(service.echo, "c", key="late")
        finally:
            os.kill(svc.proc.pid, signal.SIGCONT)
        assert e.value.key == b"late" and e.value.attempts >= 1
        assert "may have run" in str(e.value)
        assert client.call(service.echo, "d") == "D"  # its connection is still usable
    # The same key again, from another client: the first call's outcome.
    with Client(address, data_dir=data_dir, timeout=DEADLINE) as again:
        assert again.call(service.echo, "other words", key="late") == "C"


def test_closing_the_client_ends_a_call_waiting_on_it(
    echo: tuple[RunProcess, Any, str, Path],
) -> None:
    svc, service, address, data_dir = echo
    assert svc.proc is not None
    client = Client(address, data_dir=data_dir, timeout=DEADLINE)
    assert client.call(service.echo, "a") == "A"
    assert client.call(service.echo, "b") == "B"
    outcome: list[BaseException | str] = []

    def waiting() -> None:
        try:
            outcome.append(client.call(service.echo, "never"))
        except BaseException as exc:
            outcome.append(exc)

    os.kill(svc.proc.pid, signal.SIGSTOP)
    try:
        thread = threading.Thread(target=waiting)
        thread.start()
        deadline = time.monotonic() + DEADLINE
        while not client_waits(client):  # the call is on the wire, its thread reading
            assert time.monotonic() < deadline
            time.sleep(0.005)  # polling the client's state, bounded by the deadline
        client.close()
        thread.join(DEADLINE)
    finally:
        os.kill(svc.proc.pid, signal.SIGCONT)
    assert not thread.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ClientClosedError), outcome


def client_waits(client: Client) -> bool:
    """Whether a call waits on the client's own connection."""
    link = client._link  # the test looks inside: no public way to see a call waiting
    return link is not None and link.waiting > 0
