"""``ambrosia-py run --ingress``: its options, the errors a user can meet, in one line, and
a stop by SIGTERM."""

from __future__ import annotations

import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.binding.loading import load_service
from ambrosia_py.cli import main
from ambrosia_py.client import Client
from ambrosia_py.testing.processes import process_gone, wait_for

from .ingress_process import DEADLINE, RunProcess, free_port

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args])
    return result.exit_code, result.output


def test_help_lists_the_ingress_options() -> None:
    code, out = invoke(EXAMPLE, "--help")
    assert code == 0
    for option in ("--ingress [HOST:]PORT", "--ingress-keep N", "--ingress-keep-seconds S"):
        assert option in out


@pytest.mark.parametrize("bad", ["host:", "70000", "127.0.0.1:http", "a:b:c"])
def test_a_malformed_ingress_address_is_a_clear_error(tmp_path: Path, bad: str) -> None:
    code, out = invoke(EXAMPLE, "--data-dir", str(tmp_path), "--ingress", bad)
    assert code == 2
    assert f"Invalid value for --ingress: {bad!r} is not HOST:PORT or PORT" in out


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, out = invoke(EXAMPLE, "--data-dir", str(tmp_path), "--ingress", str(port))
    assert code == 1
    assert out.strip() == (
        f"Error: the ingress cannot listen on 127.0.0.1:{port}: Address already in use; no "
        f"running instance of the data dir {tmp_path} uses it (another program does, or an "
        "instance of another data dir): stop it, or give --ingress another port (0: any free "
        "one)"
    )
    assert not (tmp_path / "registry.sqlite3").exists()  # no coordinator was started


def test_a_secret_others_can_read_is_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(bytes(32))
    secret.chmod(0o644)
    code, out = invoke(
        EXAMPLE, "--data-dir", str(tmp_path), "--ingress", "0", "--secret-file", str(secret)
    )
    assert code == 1
    assert "readable or writable by others (mode 0644); chmod 600 it" in out
    assert "Traceback" not in out


def test_sigterm_stops_run_cleanly_and_keeps_every_answered_call(tmp_path: Path) -> None:
    """What process managers send to stop a service: ``run`` exits 0 (as on Ctrl-C), its
    coordinator makes what it holds durable and exits, and a start after it has every
    call that was answered, once."""
    counter: Any = load_service(str(EXAMPLE))
    port = free_port()
    svc = RunProcess(Path(EXAMPLE), tmp_path, port)
    try:
        with Client(f"127.0.0.1:{port}", data_dir=tmp_path, timeout=DEADLINE) as client:
            answers = [client.call(counter.add, n, key=f"add-{n}") for n in range(1, 21)]
        assert answers == [n * (n + 1) // 2 for n in range(1, 21)]
        ic = svc.coordinator_pid()
        assert svc.proc is not None and ic is not None
        svc.proc.send_signal(signal.SIGTERM)
        assert svc.proc.wait(DEADLINE) == 0, svc.tail()
        wait_for("the coordinator to exit after its binding", lambda: process_gone(ic), DEADLINE)
        assert "binding disconnected" in svc.output()
        svc = RunProcess(Path(EXAMPLE), tmp_path, port)
        with Client(f"127.0.0.1:{port}", data_dir=tmp_path, timeout=DEADLINE) as client:
            assert client.call(counter.add, 20, key="add-20") == 210  # stored: not run again
            assert client.call(counter.get) == 210
    finally:
        svc.stop()
