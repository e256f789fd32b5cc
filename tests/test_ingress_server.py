"""The ingress with a real coordinator (the binding in this process, its server on the
binding's event loop) and the clients: values, exceptions and refusals come back as
they should, a key's call runs once however often it is sent (a lost answer, a retry
while it still runs), and clients without the secret get nothing and run nothing."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import UnknownMethodError
from ambrosia_py.client import (
    AsyncClient,
    AuthenticationError,
    CallRefusedError,
    CallTimeoutError,
    Client,
    IngressError,
    KeyReusedError,
)
from ambrosia_py.ingress import ClientConnection, IngressServer, IngressSettings, KeyTable
from ambrosia_py.ingress.envelope import RetentionEnvelope
from ambrosia_py.ingress.keys import Running
from ambrosia_py.testing import ImmortalRunner, RunningImmortal

DEADLINE = 30.0


class Overdrawn(Exception):
    pass


class Other(Immortal):
    @rpc
    def double(self, n: int) -> int:
        return 2 * n


class Ledger(Immortal):
    def __init__(self) -> None:
        self.applied: list[str] = []

    @rpc
    def apply(self, token: str, times: int = 1) -> int:
        self.applied.extend([token] * times)
        return len(self.applied)

    @rpc
    def withdraw(self, amount: int) -> None:
        self.applied.append(f"withdraw {amount}")
        raise Overdrawn(f"cannot withdraw {amount}")

    @rpc(codec="json")
    def add(self, a: int, b: int) -> dict[str, int]:
        self.applied.append("add")
        return {"sum": a + b}

    @rpc
    async def via_other(self, token: str) -> int:
        self.applied.append(token)
        doubled: int = await self.proxy("other", Other).double(len(self.applied))
        return doubled


class NotServed(Immortal):
    @rpc
    def elsewhere(self) -> None: ...


def wait_for(condition: Any, what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)  # polling a condition, bounded by the deadline


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "secret"
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


def serve_ingress(running: RunningImmortal, secret_file: Path, **settings: Any) -> IngressServer:
    server = IngressServer(secret_file.read_bytes(), IngressSettings(**settings))

    async def start() -> None:
        await server.bind()
        server.attach(running.dispatcher)

    asyncio.run_coroutine_threadsafe(start(), running.loop).result(DEADLINE)
    return server


@pytest.fixture
def ledger(ambrosia: ImmortalRunner, secret_file: Path) -> Iterator[tuple[RunningImmortal, str]]:
    running = ambrosia.start(Ledger)
    server = serve_ingress(running, secret_file)
    host, port = server.address
    yield running, f"{host}:{port}"
    running.loop.call_soon_threadsafe(server.close)


def keys(running: RunningImmortal) -> KeyTable:
    """The key table: the dispatcher's ingress hook (registered by the server's attach)."""
    table = running.dispatcher.ingress
    assert isinstance(table, KeyTable)
    return table


def applied(running: RunningImmortal) -> list[str]:
    result: list[str] = running.state["applied"]
    return result


def test_values_none_exceptions_and_json_come_back(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    with Client(address, secret_file=secret_file, timeout=DEADLINE) as client:
        assert client.call(Ledger.apply, "a") == 1
        assert client.call(Ledger.apply, "b", times=2) == 3
        assert client.call(Ledger.add, 2, b=3) == {"sum": 5}
        with pytest.raises(Overdrawn, match="cannot withdraw 7") as err:
            client.call(Ledger.withdraw, 7)
        assert any("raised by Ledger.withdraw at" in note for note in err.value.__notes__)
        assert client.info is not None and client.info.instance == "ledger"
        assert client.info.service == "Ledger"
    assert applied(running) == ["a", "b", "b", "add", "withdraw 7"]


def test_a_wrong_call_fails_at_once_naming_the_method_and_argument(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    with Client(address, secret_file=secret_file) as client:
        with pytest.raises(
            TypeError,
            match=r"Ledger.apply\(token, times=1\): missing a required argument: 'token'",
        ):
            client.call(Ledger.apply)
        with pytest.raises(TypeError, match="got an unexpected keyword argument 'tiems'"):
            client.call(Ledger.apply, "x", tiems=2)
        with pytest.raises(TypeError, match=r"Ledger.apply: argument 'token' cannot be encoded"):
            client.call(Ledger.apply, threading.Lock())
        with pytest.raises(TypeError, match="is not an @rpc method"):
            client.call(print, "x")
        assert client.info is None  # nothing was sent: it never even connected
    assert applied(running) == []


def test_a_key_sent_again_gets_the_first_outcome_and_runs_once(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    with Client(address, secret_file=secret_file) as client:
        first = client.call(Ledger.apply, "once", key="order-1")
        assert client.call(Ledger.apply, "once", key="order-1") == first
        with pytest.raises(Overdrawn):
            client.call(Ledger.withdraw, 5, key=b"\x00w")
        with pytest.raises(Overdrawn):  # the stored exception, not a second run
            client.call(Ledger.withdraw, 5, key=b"\x00w")
        with pytest.raises(KeyReusedError, match="already names a call of method id"):
            client.call(Ledger.withdraw, 5, key="order-1")
    assert applied(running) == ["once", "withdraw 5"]


def test_a_lost_answer_is_found_by_the_retry(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    """The connection goes right after the call is sent: the call runs (it was logged),
    its answer has nowhere to go; the retry with the key gets it and runs nothing."""
    running, address = ledger
    host, port = address.rsplit(":", 1)
    spec = Ledger.rpc_methods_by_name()["apply"]
    import pickle

    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        conn = ClientConnection(secret_file.read_bytes())
        while conn.info is None:
            conn.receive_data(sock.recv(4096))
            sock.sendall(conn.data_to_send())
        conn.call(1, b"lost", spec.id, pickle.dumps((("t",), {})))
        sock.sendall(conn.data_to_send())
    wait_for(lambda: applied(running) == ["t"], "the call to run")
    with Client(address, secret_file=secret_file) as client:
        assert client.call(Ledger.apply, "t", key=b"lost") == 1
    assert applied(running) == ["t"]


def test_a_retry_while_the_call_still_runs_waits_for_the_same_answer(
    ambrosia: ImmortalRunner, secret_file: Path
) -> None:
    other = ambrosia.start(Other, "other")
    other.stop()  # registered, not running: a call to it waits for it
    running = ambrosia.start(Ledger)
    server = serve_ingress(running, secret_file)
    address = "{}:{}".format(*server.address)
    spec = Ledger.rpc_methods_by_name()["via_other"]

    async def until(condition: Any, what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            await asyncio.sleep(0.005)  # polling a condition, bounded by the deadline

    async def main() -> list[int]:
        async with (
            AsyncClient(address, secret_file=secret_file, timeout=DEADLINE) as first,
            AsyncClient(address, secret_file=secret_file, timeout=DEADLINE) as second,
        ):
            one = asyncio.ensure_future(first.call(Ledger.via_other, "slow", key="k"))
            await until(
                lambda: keys(running).lookup(b"k", spec.id) is Running.RUNNING,
                "the first call to run",
            )
            two = asyncio.ensure_future(second.call(Ledger.via_other, "slow", key="k"))
            # The retry found the call running: it waits beside the first, nothing is logged.
            await until(lambda: len(server._waiting.get((b"k", spec.id), ())) == 2, "the retry")
            assert not one.done() and not two.done()
            started = ambrosia.start(Other, "other")  # the awaited call can now return
            try:
                return list(await asyncio.wait_for(asyncio.gather(one, two), DEADLINE))
            finally:
                started.stop()

    assert asyncio.run(main()) == [2, 2]
    assert applied(running) == ["slow"]
    running.loop.call_soon_threadsafe(server.close)


def test_a_method_the_service_lacks_is_refused_before_it_is_logged(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    with (
        Client(address, secret_file=secret_file) as client,
        pytest.raises(UnknownMethodError, match=r"Ledger \(instance 'ledger'\) has no @rpc"),
    ):
        client.call(NotServed.elsewhere)
    assert keys(running).finished == 0


def test_the_retention_options_reach_the_table_as_logged_input(
    ambrosia: ImmortalRunner, secret_file: Path
) -> None:
    running = ambrosia.start(Ledger)
    server = serve_ingress(running, secret_file, keep_count=3, keep_seconds=2.5)
    wait_for(lambda: keys(running).retention == RetentionEnvelope(3, 2500), "retention")
    with Client("{}:{}".format(*server.address), secret_file=secret_file) as client:
        for n in range(5):
            client.call(Ledger.apply, str(n), key=str(n))
    assert keys(running).finished == 3
    running.loop.call_soon_threadsafe(server.close)


def test_many_threads_share_one_client(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    results: list[int] = []
    with Client(address, secret_file=secret_file) as client:

        def work(t: int) -> None:
            for i in range(20):
                results.append(client.call(Ledger.apply, f"{t}-{i}", key=f"{t}-{i}"))

        threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(DEADLINE)
    assert sorted(results) == list(range(1, 81))
    assert sorted(applied(running)) == sorted(f"{t}-{i}" for t in range(4) for i in range(20))


# --- who gets in --------------------------------------------------------------------------


def test_a_client_with_another_secret_is_told_so_and_runs_nothing(
    ledger: tuple[RunningImmortal, str], tmp_path: Path
) -> None:
    running, address = ledger
    wrong = tmp_path / "wrong"
    wrong.write_bytes(os.urandom(32))
    wrong.chmod(0o600)
    with (
        Client(address, secret_file=wrong, timeout=DEADLINE) as client,
        pytest.raises(AuthenticationError, match=f"in a row: the secret from {wrong} is not"),
    ):
        client.call(Ledger.apply, "intruder")
    assert applied(running) == []


def test_garbage_and_silence_get_nothing_and_the_service_goes_on(
    ledger: tuple[RunningImmortal, str], secret_file: Path
) -> None:
    running, address = ledger
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        hello = sock.recv(4096)
        assert len(hello) == 45 and hello[5:13] == b"AMBINGR1"  # random bytes, nothing more
        sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096) == b""  # closed without a byte
    with socket.create_connection((host, int(port)), timeout=DEADLINE) as sock:
        sock.recv(4096)
        sock.sendall(struct.pack("<IB", 73, 2) + b"AMBINGR1" + bytes(64))  # a wrong proof
        assert sock.recv(4096) == b""
    with Client(address, secret_file=secret_file) as client:
        assert client.call(Ledger.apply, "fine") == 1
    assert applied(running) == ["fine"]


def test_a_listener_that_never_says_hello_is_a_timeout_of_a_call_never_sent(
    secret_file: Path, tmp_path: Path
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts, says nothing: no HELLO ever comes
        port = listener.getsockname()[1]
        with (
            Client(
                f"127.0.0.1:{port}", secret_file=secret_file, timeout=0.5, handshake_timeout=0.2
            ) as client,
            pytest.raises(CallTimeoutError, match=r"Ledger\.apply was never sent to") as err,
        ):
            client.call(Ledger.apply, "x", key="mine")
    assert err.value.key == b"mine" and isinstance(err.value, TimeoutError)
    assert err.value.attempts == 0 and "It did not run" in str(err.value)
    assert "may have run" not in str(err.value)


def test_a_missing_or_open_secret_file_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(IngressError, match=f"no cluster secret at {tmp_path}/link-secret"):
        Client("127.0.0.1:1", data_dir=tmp_path)
    loose = tmp_path / "loose"
    loose.write_bytes(os.urandom(32))
    loose.chmod(0o644)
    with pytest.raises(IngressError, match=r"readable or writable by others.*chmod 600"):
        Client("127.0.0.1:1", secret_file=loose)


def test_a_call_larger_than_the_service_takes_is_refused_before_it_is_sent(
    ambrosia: ImmortalRunner, secret_file: Path
) -> None:
    running = ambrosia.start(Ledger)
    server = serve_ingress(running, secret_file, max_call_frame=400)
    with Client("{}:{}".format(*server.address), secret_file=secret_file) as client:
        assert client.call(Ledger.apply, "x" * 100, key="k" * 200) == 1
        with pytest.raises(CallRefusedError, match="the service takes calls of at most 400"):
            client.call(Ledger.apply, "x" * 400)
        assert client.resent == 0  # refused here, not by a closed connection
    assert applied(running) == ["x" * 100]
    running.loop.call_soon_threadsafe(server.close)


def test_where_the_client_finds_the_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ambrosia_py.client.calls import client_secret

    def secret(path: Path) -> bytes:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
        return path.read_bytes()

    given = secret(tmp_path / "given")
    in_data_dir = secret(tmp_path / "data" / "link-secret")
    from_env = secret(tmp_path / "env")
    monkeypatch.setenv("AMBROSIA_SECRET_FILE", str(tmp_path / "env"))
    assert client_secret(tmp_path / "given", tmp_path / "data") == (given, tmp_path / "given")
    assert client_secret(None, tmp_path / "data")[0] == in_data_dir
    assert client_secret(None, None)[0] == from_env
    monkeypatch.delenv("AMBROSIA_SECRET_FILE")
    monkeypatch.delenv("AMBROSIA_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    default = secret(tmp_path / "ambrosia-data" / "link-secret")
    assert client_secret(None, None)[0] == default
    # run's data dir from the environment, as run takes it
    elsewhere = secret(tmp_path / "elsewhere" / "link-secret")
    monkeypatch.setenv("AMBROSIA_DATA_DIR", str(tmp_path / "elsewhere"))
    assert client_secret(None, None)[0] == elsewhere != default
