"""``ambrosia-py run --ingress``: its options, and the errors a user can meet, in one line."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from ambrosia_py.cli import main

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
        f"Error: the ingress cannot listen on 127.0.0.1:{port}: Address already in use"
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
