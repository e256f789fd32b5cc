"""A port another start cannot take is one line naming the address, who holds it when
the data dir's registry can tell, and what to do: the ingress, the link port and the
binding ports, with real ``ambrosia-py run`` processes."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.cli.exits import ExitStatus
from ambrosia_py.coordinator.registry.store import Registry
from ambrosia_py.testing import ServiceProcess, free_port

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")
DEADLINE = 60.0


def run(data_dir: Path, instance: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``ambrosia-py run`` to its end (it fails at once here), its output captured."""
    argv = [sys.executable, "-m", "ambrosia_py.cli", "run", EXAMPLE, "--instance", instance]
    return subprocess.run(
        [*argv, "--data-dir", str(data_dir), *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def first(tmp_path: Path) -> Iterator[tuple[ServiceProcess, int, int]]:
    """Instance ``a`` serving, with its ingress and link ports (given, so known)."""
    ingress, link = free_port(), free_port()
    args = ["--ingress", f"127.0.0.1:{ingress}", "--link-port", str(link)]
    svc = ServiceProcess(EXAMPLE, "a", tmp_path / "data", args)
    try:
        svc.start()
        svc.wait_for_log("ingress listening on", DEADLINE)
        svc.wait_for_log(f"accepting links from other coordinators on 127.0.0.1:{link}")
        yield svc, ingress, link
    finally:
        svc.stop()


def test_a_second_instance_on_the_same_ingress_port_names_the_first(
    tmp_path: Path, first: tuple[ServiceProcess, int, int]
) -> None:
    svc, ingress, _ = first
    pid = svc.coordinator_pid()
    done = run(tmp_path / "data", "b", "--ingress", f"127.0.0.1:{ingress}")
    assert done.returncode == ExitStatus.ERROR
    assert done.stderr.strip() == (
        f"Error: the ingress cannot listen on 127.0.0.1:{ingress}: Address already in use; "
        f"instance 'a' (coordinator pid {pid}) has its ingress there (127.0.0.1:{ingress}): "
        "stop it, or give --ingress another port (0: any free one)"
    )
    with Registry(tmp_path / "data") as registry:
        assert registry.get("b") is None  # refused before anything started

    again = run(tmp_path / "data", "a", "--ingress", f"127.0.0.1:{ingress}")
    assert f"instance 'a' runs already (coordinator pid {pid}; its ingress is there)" in (
        again.stderr
    )


def test_a_second_instance_on_the_same_link_port_names_the_first(
    tmp_path: Path, first: tuple[ServiceProcess, int, int]
) -> None:
    svc, _, link = first
    pid = svc.coordinator_pid()
    done = run(tmp_path / "data", "c", "--link-port", str(link))
    assert done.returncode == ExitStatus.COORDINATOR_DIED
    assert (
        f"ambrosia-py: the coordinator cannot listen on its link port 127.0.0.1:{link}: "
        f"Address already in use; instance 'a' (coordinator pid {pid}) has its link port "
        f"there (127.0.0.1:{link}): stop it, or give --link-port another port (or none: any "
        "free one)"
    ) in done.stderr
    assert "refused to go on (exit status 2)" in done.stderr
    assert "run the same command again to recover" not in done.stderr


def test_the_ingress_address_is_withdrawn_when_the_service_stops(
    tmp_path: Path, first: tuple[ServiceProcess, int, int]
) -> None:
    svc, ingress, link = first
    with Registry(tmp_path / "data") as registry:
        assert registry.port_users(ingress) == [("a", "ingress", "127.0.0.1")]
        assert registry.port_users(link) == [("a", "link port", "127.0.0.1")]
    svc.stop()
    with Registry(tmp_path / "data") as registry:
        assert registry.port_users(ingress) == []


def test_a_binding_port_held_by_another_program_is_said_so(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run(tmp_path / "data", "e", "--receive-port", str(port))
    assert done.returncode == ExitStatus.USAGE  # refused before the ready line
    assert (
        f"ambrosia-py: the coordinator cannot listen on its receive port 127.0.0.1:{port}: "
        f"Address already in use; no running instance of the data dir {tmp_path / 'data'} "
        "uses it (another program does, or an instance of another data dir): stop it, or "
        "give --receive-port another port"
    ) in done.stderr


def test_a_binding_port_of_another_registered_instance_is_refused_with_the_fix(
    tmp_path: Path,
) -> None:
    with Registry(tmp_path / "data") as registry:
        port = registry.register("a").receive_port
    done = run(tmp_path / "data", "e", "--receive-port", str(port))
    assert done.returncode == ExitStatus.USAGE
    assert (
        f"receive port {port} for 'e' is already used by instance 'a': give another "
        "--receive-port, or none (a free one is allocated)"
    ) in done.stderr
