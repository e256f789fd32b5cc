"""A real etcd for tests: on free loopback ports, in a temporary data dir, stopped by pid.

``from tests.etcd_server import etcd_server`` in a test module gives it the module-scoped
fixture ``etcd_server`` (one etcd for the module's tests: each should use its own key
prefix, the registry's ``cluster``). :func:`start_etcd` starts one for a single test.
Without the ``etcd`` command (Debian: ``etcd-server``, which ``make test`` installs) the
tests that need it skip, saying so.

etcd runs with a 50 ms heartbeat and a 500 ms election timeout, so it grants 1 s leases
(with its defaults the shortest is 2 s).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from ambrosia_py.testing.ports import free_port

__all__ = ["EtcdServer", "EtcdTls", "etcd_server", "start_etcd"]

_DEADLINE = 30.0
_NO_ETCD = "no etcd command: apt-get install etcd-server (make test installs it)"


@attrs.frozen
class EtcdTls:
    """Mutual TLS for clients: etcd's certificate (for ``localhost``) and the one it
    requires of clients, both from ``ca``."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


class EtcdServer:
    """One etcd member; :meth:`kill` and :meth:`start` again keep its data dir and ports.

    It listens for clients on ``host`` (by default 127.0.0.1; another of this machine's
    addresses serves clients in other network namespaces); with ``tls`` they reach it at
    ``https://localhost:PORT``.
    """

    def __init__(
        self, directory: Path, tls: EtcdTls | None = None, host: str = "127.0.0.1"
    ) -> None:
        self.directory = directory
        self.tls = tls
        self.host = host
        self.data_dir = directory / "etcd-data"
        self.log_path = directory / "etcd.log"
        self.client_port = free_port()
        self.peer_port = free_port()
        self.endpoint = f"{'localhost' if tls else host}:{self.client_port}"
        self.url = f"{'https' if tls else 'http'}://{self.endpoint}"
        self.spec = f"{'etcds' if tls else 'etcd'}://{self.endpoint}"
        self.process: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        peer = f"http://127.0.0.1:{self.peer_port}"
        listen = self.url.replace("localhost", self.host)
        command = [
            *("etcd", "--data-dir", str(self.data_dir)),
            *("--listen-client-urls", listen, "--advertise-client-urls", self.url),
            *("--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer),
            *("--initial-cluster", f"default={peer}"),
            *("--heartbeat-interval", "50", "--election-timeout", "500"),
        ]
        if self.tls is not None:
            command += [
                *("--cert-file", str(self.tls.server_cert), "--key-file", str(self.tls.server_key)),
                *("--trusted-ca-file", str(self.tls.ca), "--client-cert-auth"),
            ]
        return command

    def _open(self, request: urllib.request.Request | str, timeout: float) -> Any:
        context = self.tls.client_context() if self.tls else None
        return urllib.request.urlopen(request, timeout=timeout, context=context)

    def start(self) -> None:
        """Start etcd and wait until ``/health`` says it has a leader."""
        self.directory.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        deadline = time.monotonic() + _DEADLINE
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"etcd exited with {self.process.returncode}:\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"etcd not healthy within {_DEADLINE:g} s:\n{self.log_tail()}")
            time.sleep(0.02)  # polling /health, bounded by the deadline

    def healthy(self) -> bool:
        try:
            with self._open(f"{self.url}/health", 1) as answer:
                return bool(json.load(answer).get("health") == "true")
        except (OSError, ValueError):
            return False

    def kill(self) -> None:
        """SIGKILL, as a crash would; waits until it is gone."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=_DEADLINE)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process is None or self.process.poll() is not None:
            return
        os.kill(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.kill()

    def post(self, path: str, body: dict[str, object]) -> dict[str, Any]:
        """A raw call to etcd's JSON gateway (for tests that reach past the registry)."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(body).encode(), method="POST"
        )
        with self._open(request, 5) as answer:
            result: dict[str, Any] = json.load(answer)
        return result

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def start_etcd(directory: Path, tls: EtcdTls | None = None, host: str = "127.0.0.1") -> EtcdServer:
    """A running etcd in ``directory``, for clients on ``host`` (skips the test if there
    is no etcd command); stop it when done."""
    if shutil.which("etcd") is None:
        pytest.skip(_NO_ETCD)
    server = EtcdServer(directory, tls, host)
    server.start()
    return server


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdServer]:
    server = start_etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield server
    finally:
        server.stop()
