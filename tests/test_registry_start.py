"""Starting with any registry: the refusals that keep history safe when the registry is
not in the data dir (etcd, a shared SQLite file), the host an address is published
with, the ingress address kept while it serves, and the commands' ``--registry``."""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from ambrosia_py.cli import main
from ambrosia_py.client import Client, IngressError, ServiceUnreachableError
from ambrosia_py.coordinator.core.process import coordinator_argv
from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.files import RegistryRefusal, open_registry_for_start
from ambrosia_py.coordinator.registry.interface import Endpoint, InstanceRegistry
from ambrosia_py.coordinator.registry.publish import IngressPublisher, advertised_host
from ambrosia_py.coordinator.storage.files import InstanceFiles
from tests.etcd_server import EtcdServer, etcd_server
from tests.relay_service import Relay

__all__ = ["etcd_server"]

_clusters = itertools.count()


@pytest.fixture
def etcd(etcd_server: EtcdServer) -> Iterator[tuple[str, str, InstanceRegistry]]:
    """A spec, a cluster of its own, and a registry open on it."""
    spec, cluster = f"{etcd_server.spec}?lease_ttl=1", f"s{os.getpid()}-{next(_clusters)}"
    registry = open_registry(spec, Path("unused"), cluster)
    try:
        yield spec, cluster, registry
    finally:
        registry.close()


def with_files(data_dir: Path, instance: str, version: int = 0) -> None:
    """Give ``data_dir`` a log of ``instance`` (what makes it have files here)."""
    (data_dir / f"{instance}_{version}").mkdir(parents=True)
    (data_dir / f"{instance}_{version}" / "serverlog1").write_bytes(b"")


def test_etcd_start_rules(etcd: tuple[str, str, InstanceRegistry], tmp_path: Path) -> None:
    spec, cluster, registry = etcd
    data = tmp_path / "data"
    open_registry_for_start(data, "fresh", spec, cluster).close()  # a first start
    registry.register("moved")
    registry.set_committer_id("moved", 7)
    registry.commit_checkpoint("moved", 0, 3, 3)
    with pytest.raises(RegistryRefusal) as refused:
        open_registry_for_start(data, "moved", spec, cluster)
    assert str(refused.value) == (
        f"instance 'moved' has history in the registry {registry.where} (version 0, "
        f"checkpoint 3) but no logs or checkpoints in {data / 'moved_0'}: start it with the "
        "data dir that holds them, or a copy of it; it is never started afresh over its history"
    )
    with_files(data, "moved")
    open_registry_for_start(data, "moved", spec, cluster).close()  # its files are here
    with_files(data, "stray")
    with pytest.raises(RegistryRefusal, match="'stray' is not in the registry etcd") as refused:
        open_registry_for_start(data, "stray", spec, cluster)
    assert f"registry rebuild --data-dir {data} --registry {spec} --cluster {cluster}`" in str(
        refused.value
    )
    assert not (data / "registry.sqlite3").exists()  # etcd holds the registry


def test_an_unreachable_etcd_is_one_line(tmp_path: Path) -> None:
    spec = "etcd://127.0.0.1:1?timeout=0.5"
    with pytest.raises(RegistryRefusal, match=r"nothing was changed$"):
        open_registry_for_start(tmp_path, "x", spec)


def test_a_missing_shared_file_with_files_present_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared" / "registry.sqlite3"
    data = tmp_path / "data"
    with_files(data, "x")
    with pytest.raises(RegistryRefusal, match=f"^no registry {shared}, but instance files"):
        open_registry_for_start(data, "x", str(shared))
    assert not shared.exists()


def test_the_published_host() -> None:
    assert advertised_host("127.0.0.1") == "127.0.0.1"
    assert advertised_host("10.1.2.3") == "10.1.2.3"
    assert advertised_host("0.0.0.0") == socket.gethostname() == advertised_host("::")
    assert advertised_host("0.0.0.0", "svc.example") == "svc.example"


def test_the_ingress_address_lives_while_its_publisher_is_open(
    etcd: tuple[str, str, InstanceRegistry], tmp_path: Path
) -> None:
    spec, cluster, reader = etcd
    reader.register("svc")
    publisher = IngressPublisher(tmp_path, "svc", spec, cluster)
    assert publisher.publish("127.0.0.1", 4500)
    assert reader.addresses("svc").ingress == Endpoint("127.0.0.1", 4500)
    publisher.close()  # the lease is revoked: gone now, not after its TTL
    assert reader.addresses("svc").empty
    assert not IngressPublisher(tmp_path, "nobody", spec, cluster).publish("127.0.0.1", 1)


@pytest.mark.parametrize("backend", ["sqlite", "etcd"])
def test_withdrawing_leaves_an_address_published_since_by_another(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A replica that took the primary role over publishes its ingress over the old
    primary's; the old one, stopping later, must not withdraw it."""
    if backend == "etcd":
        spec, cluster, reader = request.getfixturevalue("etcd")
    else:
        spec, cluster = str(tmp_path / "registry.sqlite3"), "ambrosia"
        reader = open_registry(spec, tmp_path, cluster)
        request.addfinalizer(reader.close)
    reader.register("svc")
    dirs = []
    for name in ("old", "new"):  # each publisher's instance runs: it holds its lock
        files = InstanceFiles(tmp_path / name, "svc", 0)
        files.create()
        files.acquire_lock()
        request.addfinalizer(files.release_lock)
        dirs.append(files.data_dir)
    old = IngressPublisher(dirs[0], "svc", spec, cluster)
    new = IngressPublisher(dirs[1], "svc", spec, cluster)
    assert old.publish("127.0.0.1", 4500)
    assert new.publish("127.0.0.1", 4600)
    old.close()
    assert reader.addresses("svc").ingress == Endpoint("127.0.0.1", 4600)
    new.close()  # its own: withdrawn
    assert reader.addresses("svc").ingress is None


def test_a_client_by_name_of_an_instance_not_serving(
    etcd: tuple[str, str, InstanceRegistry], tmp_path: Path
) -> None:
    spec, cluster, _ = etcd
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    options: dict[str, Any] = dict(registry=spec, cluster=cluster, secret_file=secret)
    with Client.connect(instance="ghost", first_contact_timeout=0.3, **options) as client:
        assert client.address == "instance 'ghost'"
        with pytest.raises(ServiceUnreachableError, match="'ghost' publishes no ingress"):
            client.call(Relay.state)
    with pytest.raises(IngressError, match="unknown scheme 'http'"):
        Client.connect(instance="x", registry="http://127.0.0.1:2379", secret_file=secret)


def test_every_command_that_reads_the_registry_takes_it() -> None:
    relay = str(Path(__file__).with_name("relay_service.py"))
    commands = [
        ["run", relay],
        ["coordinator"],
        ["register"],
        ["instances"],
        ["replay", relay],
        ["debug"],
        ["log", "prune"],
        ["registry", "rebuild"],
    ]
    for command in commands:
        result = CliRunner().invoke(main, [*command, "--help"])
        flat = " ".join(result.output.split())
        assert result.exit_code == 0 and "--registry SPEC" in flat, command
        assert "[env var: AMBROSIA_REGISTRY]" in flat, command
        assert "--cluster TEXT" in flat and "default: ambrosia" in flat, command
    argv = coordinator_argv("a", Path("d"), "--link-port", "0", registry="etcd://h", cluster="c")
    assert argv[-6:] == ["--registry", "etcd://h", "--cluster", "c", "--link-port", "0"]
    assert "--registry" not in coordinator_argv("a", Path("d"))


def test_register_and_instances_in_etcd(etcd: tuple[str, str, InstanceRegistry]) -> None:
    spec, cluster, registry = etcd
    where = ["--registry", spec, "--cluster", cluster, "--data-dir", "/nonexistent"]
    result = CliRunner().invoke(main, ["register", "x", *where, "--receive-port", "24101"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("x: receive port 24101, send port ")
    info = registry.get("x")
    assert info is not None and info.receive_port == 24101
    result = CliRunner().invoke(main, ["instances", *where])
    assert result.exit_code == 0, result.output
    assert f"instances in {registry.where}" in " ".join(result.output.split())
    (row,) = [line for line in result.output.splitlines() if " x " in line]
    cells = [c.strip() for c in row.split("│")[1:-1]]
    assert cells == ["x", "0", "24101", str(info.send_port), "-", "-", "-", "no", "-", "-", "-"]
