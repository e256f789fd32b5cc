"""`ambrosia-py run`: loading services, their options, and the errors a user can meet."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from ambrosia_py.cli import main
from ambrosia_py.testing import ServiceProcess, wait_for

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["run", *args])
    return result.exit_code, result.output


def test_service_options_become_flags(tmp_path: Path) -> None:
    path = tmp_path / "optioned.py"
    path.write_text(
        "from ambrosia_py import Immortal\n\n"
        "class Optioned(Immortal):\n    class Options:\n        port: int = 0\n"
    )
    code, out = invoke("--instance", "x", str(path), "--help")
    assert code == 0
    assert "--port INTEGER" in out and "Optioned option." in out


def test_a_missing_service_file_is_a_clear_error(tmp_path: Path) -> None:
    code, out = invoke(str(tmp_path / "nope.py"))
    assert code == 2 and "no such file" in out


def test_a_wrong_class_name_lists_the_ones_there() -> None:
    code, out = invoke(f"{EXAMPLE}:Nope")
    assert code == 2 and "has no Immortal subclass 'Nope'" in out and "['Counter']" in out


def test_a_file_with_no_immortal_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "plain.py"
    path.write_text("x = 1\n")
    code, out = invoke(str(path))
    assert code == 2 and "defines 0 Immortal subclasses" in out


def test_a_file_named_like_a_loaded_module_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "json.py"  # the standard library's json is loaded already
    path.write_text("from ambrosia_py import Immortal\n\nclass J(Immortal):\n    pass\n")
    code, out = invoke(str(path))
    assert code == 2
    assert "a module 'json' is already loaded from" in out and "rename the file" in out


def test_an_unreachable_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: nothing answers there
        code, out = invoke(
            EXAMPLE,
            "--data-dir",
            str(tmp_path),
            "--separated",
            "--receive-port",
            str(port),
            "--send-port",
            str(port),
            "--connect-timeout",
            "0.2",
        )
    assert code == 1 and f"no coordinator listening on 127.0.0.1:{port}" in out


def test_an_instance_already_running_is_refused(tmp_path: Path) -> None:
    first = ServiceProcess(EXAMPLE, None, tmp_path, ["--ingress", "127.0.0.1:0"])
    with first.running():
        first.wait_for_log("ingress listening on")
        second = subprocess.run(
            [sys.executable, "-m", "ambrosia_py.cli", "run", EXAMPLE, "--data-dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        # The coordinator's refusal, in one line, is all there is to say.
        assert second.returncode == 2
        assert "is locked by pid" in second.stderr
        assert len(second.stderr.splitlines()) == 1 and "Traceback" not in second.stderr


def test_ctrl_c_stops_service_and_coordinator_cleanly(tmp_path: Path) -> None:
    svc = ServiceProcess(EXAMPLE, None, tmp_path, ["--ingress", "127.0.0.1:0"])
    with svc.running():
        svc.wait_for_log("ingress listening on")
        assert svc.proc is not None
        svc.proc.send_signal(signal.SIGINT)
        assert svc.proc.wait(timeout=60) == 0
        wait_for("the coordinator's last line", lambda: "binding disconnected" in svc.output())


def test_a_malformed_link_address_is_a_clear_error(tmp_path: Path) -> None:
    for bad in ("server", "server=host", "server=host:port", "=host:1", "server=host:70000"):
        code, out = invoke(EXAMPLE, "--data-dir", str(tmp_path), "--link-to", bad)
        assert code == 2
        assert f"{bad!r} is not NAME=HOST:PORT" in out
