"""Restate beside ours in ``bench compare``: its server, its Python SDK, its defaults.

Restate is what a Python user choosing durable execution weighs first: a server that
journals every step of a handler in its own replicated log, and services written with
its SDK that it calls over HTTP. Here, in a temporary directory:

- its server (``restate-server``, the binary the npm package ``@restatedev/restate-server``
  ships; ``make bench`` installs it into ``.bench-peers/``), with a config file that only
  moves its data under that directory, binds its ingress, admin and node ports to free
  ports on 127.0.0.1, and turns off telemetry, the web UI and the info-level log;
  durability as shipped: a single node's replicated log, its RocksDB WAL synced;
- the services of :mod:`.compare_restate_app` under hypercorn, in a process of their
  own, registered as a deployment through the admin API.

The same work as ours (:mod:`.compare_callers`): ordinary programs call
``Counter/{key}/add`` over the HTTP ingress, each with a keep-alive connection and a
key of its own, each answer checked to be the calls made on that key; and one service
awaiting another's handler (``Caller.loop``: ``ctx.service_call`` to ``Callee.take``,
timed between answers). The server's ``fsync`` and ``fdatasync`` calls are counted for
a batch of each (:func:`~.compare_peer_process.count_syncs`).

:func:`unavailable` says why Restate cannot run here, in one line; a server that does
not start raises :class:`~.compare_peer_process.PeerUnavailableError`. Either way
``bench compare`` names it and goes on.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from ..testing.ports import free_ports
from .compare_callers import CallPlan, make_calls, measure_callers, median_gap_ms
from .compare_peer_process import PeerProcess, PeerUnavailableError, count_syncs

__all__ = [
    "SERVER_ENV",
    "RestateCaller",
    "RestateServer",
    "loop",
    "measure_restate",
    "running",
    "server_binary",
    "unavailable",
]

SERVER_ENV = "AMBROSIA_BENCH_RESTATE_SERVER"  # a restate-server binary to use instead
# Where ``make bench`` installs the server: the repository's .bench-peers/ (npm's tree).
PEERS_DIR = Path(__file__).resolve().parents[2] / ".bench-peers"
START_TIMEOUT = 90.0
CALL_TIMEOUT = 120.0
_APP = "import sys; from ambrosia_py.bench.compare_restate_app import serve; serve(sys.argv[1])"


def server_binary() -> Path | None:
    """The ``restate-server`` to run: :data:`SERVER_ENV`, else the one ``make bench``
    installed, else one on ``PATH``."""
    if chosen := os.environ.get(SERVER_ENV):
        return Path(chosen)
    found = sorted(PEERS_DIR.glob("node_modules/@restatedev/restate-server-*/bin/restate-server"))
    if found:
        return found[0]
    on_path = shutil.which("restate-server")
    return Path(on_path) if on_path else None


def unavailable() -> str | None:
    """Why Restate cannot be measured here (one line), or None."""
    absent = [m for m in ("restate", "hypercorn") if importlib.util.find_spec(m) is None]
    if absent:
        them = "them" if len(absent) > 1 else "it"
        return f"no {', '.join(absent)} here; `make bench` installs {them} (the bench extra)"
    if server_binary() is None:
        return "no restate-server here; `make bench` installs it (npm) into .bench-peers/"
    return None


def _config(directory: Path, ingress: int, admin: int, node: int) -> Path:
    path = directory / "restate.toml"
    path.write_text(
        f'base-dir = "{directory / "data"}"\n'
        'listen-mode = "tcp"\n'
        "disable-telemetry = true\n"
        'log-filter = "warn"\n'
        "log-disable-ansi-codes = true\n"
        f'bind-address = "127.0.0.1:{node}"\n'
        f'advertised-address = "http://127.0.0.1:{node}/"\n'
        "[admin]\n"
        f'bind-address = "127.0.0.1:{admin}"\n'
        "disable-web-ui = true\n"
        "[ingress]\n"
        f'bind-address = "127.0.0.1:{ingress}"\n'
    )
    return path


def _post(conn: http.client.HTTPConnection, path: str, body: Any) -> tuple[int, Any]:
    """POST ``body`` as JSON on a kept-alive connection: (status, JSON answer or text)."""
    conn.request("POST", path, json.dumps(body).encode(), {"content-type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    try:
        return response.status, json.loads(data) if data else None
    except ValueError:
        return response.status, data.decode(errors="replace")


def _answered(
    port: int, method: str, path: str, body: Any = None, timeout: float = 10.0
) -> tuple[int, Any]:
    """One request on a connection of its own: (status, answer); (0, the error) when
    the server does not answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if method == "GET":
            conn.request("GET", path)
            response = conn.getresponse()
            return response.status, response.read().decode(errors="replace")
        return _post(conn, path, body)
    except OSError as exc:
        return 0, str(exc)
    finally:
        conn.close()


class RestateCaller:
    """A keep-alive connection to the ingress and a key of its own: each answer must
    be the calls made on that key so far."""

    def __init__(self, port: int, key: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=CALL_TIMEOUT)
        self.path = f"/Counter/{key}/add"
        self.made = 0

    def call(self) -> None:
        status, value = _post(self.conn, self.path, 1)
        if status != 200 or value != self.made + 1:
            raise RuntimeError(f"Restate {self.path}: {status} {value!r} after {self.made} calls")
        self.made += 1

    def close(self) -> None:
        self.conn.close()


@attrs.frozen
class RestateServer:
    """A running Restate with the services registered."""

    ingress: int  # the HTTP ingress's port on 127.0.0.1
    pid: int  # the server's process


@contextlib.contextmanager
def running(directory: Path) -> Iterator[RestateServer]:
    """The server, then the services' process, started in ``directory`` and the
    deployment registered; both stopped on the way out, however it is left."""
    binary = server_binary()
    if binary is None:
        raise PeerUnavailableError(unavailable() or "no restate-server")
    directory.mkdir(parents=True, exist_ok=True)
    ingress, admin, node, sdk = free_ports(4)
    config = _config(directory, ingress, admin, node)
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            PeerProcess(
                "restate-server", [str(binary), "--config-file", str(config)], directory
            ).running()
        )
        server.wait_until(
            "its admin API", lambda: _answered(admin, "GET", "/health")[0] == 200, START_TIMEOUT
        )
        services = stack.enter_context(
            PeerProcess(
                "restate-services", [sys.executable, "-c", _APP, str(sdk)], directory
            ).running()
        )
        services.wait_for_port(sdk, START_TIMEOUT)
        deployment = {"uri": f"http://127.0.0.1:{sdk}"}
        server.wait_until(
            "the deployment registered",
            lambda: _answered(admin, "POST", "/deployments", deployment)[0] in (200, 201),
            START_TIMEOUT,
        )
        # The new services reach the ingress a moment after the admin API has them.
        server.wait_until(
            "the ingress serving Counter",
            lambda: _answered(ingress, "POST", "/Counter/ready/add", 0)[0] == 200,
            START_TIMEOUT,
        )
        yield RestateServer(ingress, server.pid)


def loop(port: int, n: int) -> list[float]:
    """``Caller.loop(n)``: the times its ``n`` awaited answers arrived."""
    status, stamps = _answered(port, "POST", "/Caller/loop", n, CALL_TIMEOUT)
    if status != 200 or not isinstance(stamps, list) or len(stamps) != n + 1:
        raise RuntimeError(f"Restate Caller.loop({n}): {status} {str(stamps)[:200]}")
    return [float(s) for s in stamps]


def measure_restate(directory: Path, plan: CallPlan) -> dict[str, float]:
    """Restate's figures (``client_*`` as :func:`~.compare_callers.measure_callers`,
    ``await_p50_ms``, and the syncs per call where counted)."""
    with running(directory) as restate:
        figures = measure_callers(lambda i: RestateCaller(restate.ingress, f"caller-{i}"), plan)
        one = RestateCaller(restate.ingress, "syncs")
        try:
            one.call()  # the key's first call reads no state: not what is counted
            _, syncs = count_syncs(
                [restate.pid], directory / "syncs-client", lambda: make_calls(one, plan.sync_batch)
            )
        finally:
            one.close()
        if syncs is not None:
            figures["client_syncs_per_call"] = syncs / plan.sync_batch
        loop(restate.ingress, 1)  # the first call between the two services opens their stream
        figures["await_p50_ms"] = median_gap_ms(loop(restate.ingress, plan.awaits))
        _, syncs = count_syncs(
            [restate.pid],
            directory / "syncs-await",
            lambda: loop(restate.ingress, plan.sync_batch),
        )
        if syncs is not None:
            figures["await_syncs_per_call"] = syncs / plan.sync_batch
        return figures
