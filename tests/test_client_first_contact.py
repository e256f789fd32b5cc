"""A client that has never reached its service says what it found there, and soon: nothing
listening, or something that is not an ambrosia-py ingress (an HTTP server, a
coordinator's own ports); never "it may have run" for a call that was never sent."""

from __future__ import annotations

import http.server
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.client import (
    CallTimeoutError,
    Client,
    IngressProtocolError,
    ServiceUnreachableError,
)
from ambrosia_py.testing import ServiceProcess, free_port
from examples.counter import Counter

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")
TIMEOUT = 60.0  # the call's own timeout: first contact must give up long before it


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(bytes(range(32)))
    path.chmod(0o600)
    return path


def call_once(address: str, secret: Path) -> tuple[BaseException, float]:
    started = time.monotonic()
    expected = (ServiceUnreachableError, IngressProtocolError, CallTimeoutError)
    with (
        Client(address, secret_file=secret, timeout=TIMEOUT) as client,
        pytest.raises(expected) as e,
    ):
        client.call(Counter.add, 1)
    return e.value, time.monotonic() - started


def test_nothing_listening_is_said_without_waiting_for_the_timeout(secret: Path) -> None:
    port = free_port()
    error, took = call_once(f"127.0.0.1:{port}", secret)
    assert isinstance(error, ServiceUnreachableError), error
    text = str(error)
    assert f"nothing listens on 127.0.0.1:{port}" in text
    assert f"--ingress {port}" in text and "it did not run" in text
    assert "may have run" not in text
    assert took < TIMEOUT / 2, took  # it gave up on first contact, not on the call's timeout


@pytest.fixture
def http_server() -> Iterator[int]:
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_an_http_server_is_not_an_ingress(secret: Path, http_server: int) -> None:
    error, took = call_once(f"127.0.0.1:{http_server}", secret)
    assert type(error) is IngressProtocolError, error
    assert f"127.0.0.1:{http_server} is not an ambrosia-py ingress" in str(error)
    assert "sent no HELLO" in str(error) and "may have run" not in str(error)
    assert took < TIMEOUT / 2, took


@pytest.fixture(scope="module")
def counter(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ServiceProcess, dict[str, int]]]:
    data = tmp_path_factory.mktemp("counter")
    ports = {name: free_port() for name in ("ingress", "link", "receive")}
    args = ["--ingress", str(ports["ingress"]), "--link-port", str(ports["link"])]
    svc = ServiceProcess(EXAMPLE, "counter", data, [*args, "--receive-port", str(ports["receive"])])
    with svc.running():
        svc.wait_for_log("ingress listening on")
        yield svc, ports


@pytest.mark.parametrize("port", ["link", "receive"])
def test_a_coordinators_own_ports_are_not_an_ingress(
    counter: tuple[ServiceProcess, dict[str, int]], port: str
) -> None:
    svc, ports = counter
    error, took = call_once(f"127.0.0.1:{ports[port]}", svc.data_dir / "link-secret")
    assert isinstance(error, IngressProtocolError), error
    assert f"127.0.0.1:{ports[port]}" in str(error)
    assert "not an ambrosia-py ingress" in str(error) or "does not speak" in str(error), error
    assert "may have run" not in str(error)
    assert took < TIMEOUT / 2, took


def test_the_service_itself_answers(counter: tuple[ServiceProcess, dict[str, int]]) -> None:
    """The control: the same client, at the right port, gets its answer."""
    svc, ports = counter
    with Client(f"127.0.0.1:{ports['ingress']}", data_dir=svc.data_dir, timeout=TIMEOUT) as client:
        assert client.call(Counter.add, 0) >= 0


def test_a_call_that_was_never_sent_says_it_did_not_run(secret: Path) -> None:
    port = free_port()
    client = Client(f"127.0.0.1:{port}", secret_file=secret, timeout=0.5)
    with client, pytest.raises(CallTimeoutError) as e:
        client.call(Counter.add, 1)
    assert e.value.attempts == 0
    assert "was never sent" in str(e.value) and "It did not run" in str(e.value)


def test_retries_after_a_lost_service_are_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    svc = ServiceProcess(EXAMPLE, "counter", tmp_path / "data", ["--ingress", str(port)])
    svc.start()
    try:
        svc.wait_for_log("ingress listening on")
        with Client(f"127.0.0.1:{port}", data_dir=tmp_path / "data", timeout=TIMEOUT) as client:
            assert client.call(Counter.add, 2) == 2
            svc.kill()
            svc.start()  # recovers; the client's next call reconnects
            with caplog.at_level(logging.WARNING, logger="ambrosia_py.client"):
                assert client.call(Counter.add, 3) == 5
    finally:
        svc.stop()
    lost = [r for r in caplog.records if "sending calls again with their keys" in r.message]
    back = [r for r in caplog.records if "is back" in r.message]
    assert len(lost) == 1 and len(back) == 1, caplog.text
