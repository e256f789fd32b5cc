"""One suite, both registry backends: a SQLite file shared by processes with separate data
dirs, and etcd (a real one, started for this module).

Each test opens registries as separate processes would (one per data dir) through
:func:`open_registry`; what one writes the others must see, the port rules must hold
between them, and addresses must live exactly as long as their owner.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.interface import (
    Addresses,
    Endpoint,
    InstanceInfo,
    InstanceRegistry,
    RegistryError,
)
from ambrosia_py.coordinator.registry.rules import PORT_RANGE
from ambrosia_py.coordinator.registry.sqlite import SqliteRegistry
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.testing.ports import free_port
from ambrosia_py.testing.processes import DEADLINE, readline_within, wait_for
from tests.etcd_server import EtcdServer, etcd_server

__all__ = ["etcd_server"]  # the module-scoped fixture, used through request

REPO = Path(__file__).resolve().parent.parent
_clusters = itertools.count()


class Backend:
    """Registries of one store, opened as processes with separate data dirs would."""

    def __init__(self, kind: str, tmp_path: Path, server: EtcdServer | None) -> None:
        self.kind = kind
        self.tmp_path = tmp_path
        self.cluster = f"test{os.getpid()}-{next(_clusters)}"
        if server is None:
            self.spec = str(tmp_path / "shared" / "registry.sqlite3")
        else:
            self.spec = f"{server.spec}?lease_ttl=1"
        self.opened: list[InstanceRegistry] = []

    def open(self, data_dir: str = "data") -> InstanceRegistry:
        registry = open_registry(self.spec, self.tmp_path / data_dir, self.cluster)
        if isinstance(registry, SqliteRegistry):
            registry.poll_interval = 0.02
        self.opened.append(registry)
        return registry

    def close(self) -> None:
        for registry in self.opened:
            registry.close()


@pytest.fixture(params=["sqlite", "etcd"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    server = request.getfixturevalue("etcd_server") if request.param == "etcd" else None
    opened = Backend(request.param, tmp_path, server)
    try:
        yield opened
    finally:
        opened.close()


def hold_lock(data_dir: Path, info: InstanceInfo) -> InstanceFiles:
    """Be the instance's running coordinator, as far as its lock tells."""
    files = InstanceFiles(data_dir, info.name, info.current_version)
    files.create()
    files.acquire_lock()
    return files


async def until(
    watch: AsyncGenerator[Addresses, None], holds: Callable[[Addresses], bool], what: str
) -> Addresses:
    """The first addresses ``watch`` yields for which ``holds``, within the deadline."""

    async def scan() -> Addresses:
        async for addresses in watch:
            if holds(addresses):
                return addresses
        raise AssertionError(f"the watch ended before {what}")

    try:
        return await asyncio.wait_for(scan(), DEADLINE)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def test_both_backends_implement_the_interface(backend: Backend) -> None:
    assert isinstance(backend.open(), InstanceRegistry)


def test_register_get_and_instances(backend: Backend) -> None:
    one, other = backend.open("one"), backend.open("other")
    a = one.register("a")
    b = other.register("b", version=3)
    ports = [a.receive_port, a.send_port, b.receive_port, b.send_port]
    assert len(set(ports)) == 4 and all(p in PORT_RANGE for p in ports)
    assert a == InstanceInfo("a", a.receive_port, a.send_port, 0, None, None, None)
    assert b.current_version == 3
    assert other.get("a") == a and one.get("b") == b and one.get("missing") is None
    assert one.instances() == other.instances() == [a, b]
    assert one.register("a") == a  # idempotent without ports
    assert one.register("a", version=5) == a  # versions change with set_current_version


def test_port_rules(backend: Backend) -> None:
    one, other = backend.open("one"), backend.open("other")
    first, second = free_port(), free_port()
    a = one.register("a", receive_port=first, send_port=second)
    assert (a.receive_port, a.send_port) == (first, second)
    with pytest.raises(RegistryError, match=f"send port {first} for 'b' is already used by .*'a'"):
        other.register("b", send_port=first)
    with pytest.raises(RegistryError, match="must differ"):
        other.register("b", receive_port=first + 1, send_port=first + 1)
    with pytest.raises(RegistryError, match="not a TCP port"):
        other.register("b", receive_port=70000)
    moved = other.register("a", receive_port=second + 1)  # explicit ports replace
    assert (moved.receive_port, moved.send_port) == (second + 1, second)
    b = other.register("b", receive_port=first)  # freed by the move
    assert b.receive_port == first and b.send_port not in (first, second, second + 1)
    assert sorted(one.port_users(second)) == [("a", "send port", "127.0.0.1")]
    assert one.port_users(free_port()) == []


def test_processes_registering_at_once_never_share_a_port(backend: Backend) -> None:
    registries = [backend.open(f"d{i}") for i in range(3)]
    failures: list[BaseException] = []

    def register_many(registry: InstanceRegistry, prefix: str) -> None:
        try:
            for n in range(8):
                registry.register(f"{prefix}{n}")
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=register_many, args=(r, f"p{i}-")) for i, r in enumerate(registries)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(DEADLINE)
    assert not failures
    infos = registries[0].instances()
    assert len(infos) == 24
    ports = [p for info in infos for p in (info.receive_port, info.send_port)]
    assert len(set(ports)) == len(ports)


def test_versions_checkpoints_committer_and_refusals(backend: Backend) -> None:
    one, other = backend.open("one"), backend.open("other")
    one.register("a")
    one.commit_checkpoint("a", 0, 1, 1)
    other.commit_checkpoint("a", 0, 3, 3)
    one.set_committer_id("a", -5)
    info = other.get("a")
    assert info is not None
    assert (info.last_checkpoint, info.last_log, info.committer_id) == (3, 3, -5)
    with pytest.raises(RegistryError, match="refusing to go back to 2"):
        one.commit_checkpoint("a", 0, 2, 2)
    with pytest.raises(RegistryError, match="numbers start at 1"):
        one.commit_checkpoint("a", 0, 0, 1)
    with pytest.raises(RegistryError, match="32 bits"):
        one.set_committer_id("a", 2**31)
    # An upgrade: version 1's checkpoint 1 is committed, then the instance moves to it.
    one.commit_checkpoint("a", 1, 1, 1)
    assert other.get("a") == InstanceInfo("a", info.receive_port, info.send_port, 0, 3, 3, -5)
    other.set_current_version("a", 1)
    upgraded = one.get("a")
    assert upgraded is not None and (upgraded.current_version, upgraded.last_checkpoint) == (1, 1)
    other.set_current_version("a", 2)  # a version with nothing committed yet
    assert one.get("a") == InstanceInfo("a", info.receive_port, info.send_port, 2, None, None, -5)
    other.set_current_version("a", 0)  # back: version 0's record is kept
    assert one.get("a") == InstanceInfo("a", info.receive_port, info.send_port, 0, 3, 3, -5)
    with pytest.raises(RegistryError, match="negative"):
        one.set_current_version("a", -1)
    for change in (
        lambda: one.commit_checkpoint("nobody", 0, 1, 1),
        lambda: one.set_committer_id("nobody", 1),
        lambda: one.set_current_version("nobody", 1),
        lambda: one.set_link_address("nobody", "127.0.0.1", 4000),
    ):
        with pytest.raises(RegistryError, match="unknown instance 'nobody'"):
            change()


def test_restore(backend: Backend) -> None:
    one = backend.open()
    info = one.restore("r", 2, 17, {1: 4, 2: 9})
    assert (info.current_version, info.last_checkpoint, info.last_log, info.committer_id) == (
        2,
        9,
        9,
        17,
    )
    one.set_current_version("r", 1)
    assert backend.open("other").get("r") == InstanceInfo(
        "r", info.receive_port, info.send_port, 1, 4, 4, 17
    )
    with pytest.raises(RegistryError, match="registered already"):
        one.restore("r", 0, None, {})


def test_addresses_published_by_a_running_owner(backend: Backend) -> None:
    owner, reader = backend.open("owner"), backend.open("reader")
    info = owner.register("svc")
    assert reader.addresses("svc") == Addresses() and reader.addresses("nobody").empty
    files = hold_lock(backend.tmp_path / "owner", info)
    owner.set_link_address("svc", "127.0.0.1", 4100)
    owner.set_ingress_address("svc", "127.0.0.1", 4101)
    seen = reader.addresses("svc")
    assert seen.link == Endpoint("127.0.0.1", 4100) and seen.ingress == Endpoint("127.0.0.1", 4101)
    assert seen.host_name
    assert reader.link_address("svc") == ("127.0.0.1", 4100)
    assert ("svc", "link port", "127.0.0.1") in reader.port_users(4100)
    assert ("svc", "ingress", "127.0.0.1") in reader.port_users(4101)
    owner.clear_ingress_address("svc")
    assert reader.addresses("svc") == Addresses(seen.link, None, seen.host_name)
    owner.clear_link_address("svc")
    assert reader.addresses("svc").empty and reader.link_address("svc") is None
    files.release_lock()


def test_a_killed_owners_addresses_vanish(backend: Backend) -> None:
    reader = backend.open("reader")
    reader.register("svc")
    port = free_port()
    owner_dir = backend.tmp_path / "owner"
    arguments = [backend.spec, str(owner_dir), backend.cluster, "svc", str(port)]
    owner = subprocess.Popen(
        [sys.executable, "-m", "tests.registry_owner", *arguments],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        assert readline_within(owner.stdout) == "published\n"
        assert reader.addresses("svc").link == Endpoint("127.0.0.1", port)
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(DEADLINE)
        # etcd: the lease (1 s) runs out; SQLite: the kernel dropped the instance's lock.
        wait_for("the killed owner's address to vanish", lambda: reader.addresses("svc").empty)
        assert reader.link_address("svc") in (None, ("127.0.0.1", port))
    finally:
        owner.kill()
        owner.wait(DEADLINE)


async def test_watch_follows_the_addresses(backend: Backend) -> None:
    owner, reader = backend.open("owner"), backend.open("reader")
    info = owner.register("svc")
    files = hold_lock(backend.tmp_path / "owner", info)
    watch = reader.watch("svc")
    try:
        assert (await until(watch, lambda a: True, "the first addresses")).empty
        await asyncio.to_thread(owner.set_link_address, "svc", "127.0.0.1", 4200)
        first = await until(watch, lambda a: a.link is not None, "the link address")
        assert first.link == Endpoint("127.0.0.1", 4200) and first.ingress is None
        await asyncio.to_thread(owner.set_link_address, "svc", "127.0.0.1", 4201)
        moved = await until(watch, lambda a: a != first, "the moved link address")
        assert moved.link == Endpoint("127.0.0.1", 4201)
        await asyncio.to_thread(owner.clear_link_address, "svc")
        assert (await until(watch, lambda a: a != moved, "the withdrawal")).empty
    finally:
        await watch.aclose()
        files.release_lock()


def test_specs_that_open_the_sqlite_registry(tmp_path: Path) -> None:
    with open_registry(None, tmp_path / "data") as own:
        assert isinstance(own, SqliteRegistry)
        assert own.where == str(tmp_path / "data" / "registry.sqlite3")
        own.register("a")
    shared = tmp_path / "elsewhere" / "reg.sqlite3"
    with open_registry(str(shared), tmp_path / "one") as one:
        one.register("b")
    with open_registry(shared, tmp_path / "two") as two:
        assert [i.name for i in two.instances()] == ["b"]
    assert not (tmp_path / "one" / "registry.sqlite3").exists()
    with pytest.raises(RegistryError, match="is a directory"):
        open_registry(str(tmp_path), tmp_path / "data")
    with pytest.raises(RegistryError, match="unknown scheme 'http'"):
        open_registry("http://127.0.0.1:2379", tmp_path / "data")
