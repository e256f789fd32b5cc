"""The instance registry: registration, ports, versions, checkpoints, several processes."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.store import (
    PORT_RANGE,
    InstanceInfo,
    Registry,
    RegistryError,
    _bindable,
)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(tmp_path / "data")
    try:
        yield reg
    finally:
        reg.close()


def test_register_allocates_distinct_free_ports(registry: Registry) -> None:
    a = registry.register("a")
    b = registry.register("b")
    ports = [a.receive_port, a.send_port, b.receive_port, b.send_port]
    assert len(set(ports)) == 4
    assert all(p in PORT_RANGE for p in ports)
    assert a == InstanceInfo("a", a.receive_port, a.send_port, 0, None, None, None)
    assert registry.get("a") == a
    assert registry.get("missing") is None
    assert registry.instances() == [a, b]
    assert (registry.data_dir / "registry.sqlite3").exists()


def test_register_is_idempotent_unless_ports_are_given(registry: Registry) -> None:
    a = registry.register("a", version=2)
    assert registry.register("a") == a
    assert registry.register("a", version=5) == a  # versions change via set_current_version
    moved = registry.register("a", receive_port=a.send_port + 1000)
    assert moved.receive_port == a.send_port + 1000 and moved.send_port == a.send_port
    assert moved.current_version == 2


def test_explicit_port_clash_is_refused(registry: Registry) -> None:
    registry.register("a", receive_port=21000, send_port=21001)
    with pytest.raises(
        RegistryError, match="send port 21000 for 'b' is already used by instance 'a'"
    ):
        registry.register("b", receive_port=22000, send_port=21000)
    assert registry.get("b") is None
    with pytest.raises(RegistryError, match="must differ"):
        registry.register("c", receive_port=23000, send_port=23000)
    with pytest.raises(RegistryError, match="not a TCP port"):
        registry.register("c", receive_port=70000)
    with pytest.raises(RegistryError, match="needs a name"):
        registry.register("")


def test_allocation_skips_ports_that_are_in_use(
    registry: Registry, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A narrow range: one port taken by a listener, one by another instance.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        busy = listener.getsockname()[1]
        if not all(_bindable(p) for p in range(busy + 1, busy + 5)):
            pytest.skip("the ports next to the listener's are in use")
        first = registry.register("first", receive_port=busy + 1, send_port=busy + 2)
        monkeypatch.setattr(
            "ambrosia_py.coordinator.registry.store.PORT_RANGE", range(busy, busy + 5)
        )
        info = registry.register("second")
        assert {info.receive_port, info.send_port} == {busy + 3, busy + 4}
        assert first.receive_port not in (info.receive_port, info.send_port)
        with pytest.raises(RegistryError, match="no free loopback port"):
            registry.register("third")


def test_state_survives_reopening_and_close_is_final(tmp_path: Path) -> None:
    with Registry(tmp_path) as reg:
        a = reg.register("a")
        reg.commit_checkpoint("a", 0, 2, 2)
    with Registry(tmp_path) as reg:
        info = reg.get("a")
        assert info is not None and info.receive_port == a.receive_port
        assert info.last_checkpoint == 2
    with pytest.raises(RegistryError, match="closed"):
        reg.get("a")


WORKER = """
import sys, pathlib
from ambrosia_py.coordinator.registry.store import Registry
print("ready", flush=True)
sys.stdin.readline()
reg = Registry(pathlib.Path(sys.argv[1]))  # a fresh database, opened by all at once
for i in range(5):
    name = f"{sys.argv[2]}-{i}"
    info = reg.register(name)
    reg.commit_checkpoint(name, 0, 1, 1)
reg.close()
print("done", flush=True)
"""


def test_concurrent_registration_from_several_processes(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(tmp_path), f"w{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline() == "ready\n"
        for p in procs:  # all start registering at once
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            out, _ = p.communicate(timeout=60)
            assert p.returncode == 0 and out == "done\n"
    finally:
        for p in procs:
            p.kill()
            p.wait()
    with Registry(tmp_path) as reg:
        infos = reg.instances()
    assert sorted(i.name for i in infos) == sorted(f"w{w}-{i}" for w in range(4) for i in range(5))
    ports = [p for i in infos for p in (i.receive_port, i.send_port)]
    assert len(set(ports)) == len(ports) == 40
    assert all(i.last_checkpoint == 1 for i in infos)


def test_an_unreadable_registry_is_a_registry_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "registry.sqlite3"
    path.write_bytes(b"\x5a" * 4096)
    with pytest.raises(RegistryError, match=f"cannot open the registry {path}: .*not a database"):
        Registry(tmp_path)


def test_registry_files_are_0600_and_a_new_data_dir_0700(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        with Registry(tmp_path / "new" / "data") as reg:
            reg.register("a")
            made = [reg.path, *(reg.path.with_name(reg.path.name + s) for s in ("-wal", "-shm"))]
            assert [stat.S_IMODE(p.stat().st_mode) for p in made] == [0o600] * 3
    finally:
        os.umask(old)
    for d in (tmp_path / "new", tmp_path / "new" / "data"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_restore_registers_an_instance_from_its_files(registry: Registry) -> None:
    info = registry.restore("a", 2, 1234, {0: 5, 2: 1})
    assert (info.current_version, info.last_checkpoint, info.last_log) == (2, 1, 1)
    assert info.committer_id == 1234
    with pytest.raises(RegistryError, match="registered already"):
        registry.restore("a", 0, None, {})
