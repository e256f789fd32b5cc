"""What only the etcd registry has: its lease kept and re-granted, a watch through an etcd
restart, strict JSON, user and password, TLS, and its spec."""

from __future__ import annotations

import asyncio
import base64
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py.coordinator.registry.backends import (
    PASSWORD_ENV,
    open_registry,
    parse_etcd_spec,
)
from ambrosia_py.coordinator.registry.etcd import EtcdRegistry
from ambrosia_py.coordinator.registry.interface import Addresses, Endpoint, RegistryError
from ambrosia_py.testing.ports import free_port
from ambrosia_py.testing.processes import wait_for
from tests.certs import mutual_tls, needs_openssl
from tests.etcd_server import EtcdServer, EtcdTls, etcd_server, start_etcd
from tests.test_registry_backends import until

__all__ = ["etcd_server"]

_clusters = itertools.count()


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.fixture
def cluster() -> str:
    return f"etcd{os.getpid()}-{next(_clusters)}"


@pytest.fixture
def registries(
    etcd_server: EtcdServer, tmp_path: Path, cluster: str
) -> Iterator[tuple[EtcdRegistry, EtcdRegistry]]:
    """An owner and a reader, on the module's etcd, with 1 s leases."""
    opened = [open_registry(f"{etcd_server.spec}?lease_ttl=1", tmp_path, cluster) for _ in "ab"]
    assert all(isinstance(r, EtcdRegistry) for r in opened)
    owner, reader = opened
    assert isinstance(owner, EtcdRegistry) and isinstance(reader, EtcdRegistry)
    try:
        yield owner, reader
    finally:
        for registry in opened:
            registry.close()


def test_closing_withdraws_the_addresses_at_once(
    registries: tuple[EtcdRegistry, EtcdRegistry],
) -> None:
    owner, reader = registries
    owner.register("svc")
    owner.set_link_address("svc", "10.0.0.7", 4300)
    assert owner.keeper.granted_ttl == 1
    assert reader.addresses("svc") == Addresses(Endpoint("10.0.0.7", 4300), None, owner.host_name)
    owner.close()  # the lease is revoked: no waiting for its TTL
    assert reader.addresses("svc").empty
    with pytest.raises(RegistryError, match="is closed"):
        owner.get("svc")


async def test_a_lost_lease_is_granted_again_and_the_addresses_published_again(
    registries: tuple[EtcdRegistry, EtcdRegistry], etcd_server: EtcdServer
) -> None:
    owner, reader = registries
    owner.register("svc")
    owner.set_link_address("svc", "127.0.0.1", 4400)
    lost = owner.keeper.lease
    watch = reader.watch("svc")
    try:
        published = await until(watch, lambda a: not a.empty, "the address")
        # As if the owner had been cut off from etcd for longer than the TTL.
        etcd_server.post("/v3/lease/revoke", {"ID": str(lost)})
        await until(watch, lambda a: a.empty, "the address to go with the lease")
        again = await until(watch, lambda a: not a.empty, "the address published again")
        assert again == published
        assert owner.keeper.regrants == 1 and owner.keeper.lease not in (0, lost)
    finally:
        await watch.aclose()


async def test_a_lost_lease_never_puts_back_an_address_published_since_by_another(
    registries: tuple[EtcdRegistry, EtcdRegistry], etcd_server: EtcdServer
) -> None:
    """A primary paused past its lease finds, when it resumes, that a replica which took
    over has published its own address: it must leave that one alone."""
    owner, other = registries
    owner.register("svc")
    owner.set_ingress_address("svc", "127.0.0.1", 4400)
    lost = owner.keeper.lease
    other.set_ingress_address("svc", "127.0.0.1", 4500)  # now under the other's lease
    etcd_server.post("/v3/lease/revoke", {"ID": str(lost)})
    # The owner's keep-alive finds its lease gone and grants a new one: the address it
    # held is another's now, and stays so.
    await asyncio.to_thread(wait_for, "a new lease", lambda: owner.keeper.regrants == 1, 10.0)
    assert other.addresses("svc").ingress == Endpoint("127.0.0.1", 4500)


async def test_etcd_killed_and_restarted(tmp_path: Path, cluster: str) -> None:
    server = start_etcd(tmp_path / "etcd")
    try:
        owner = open_registry(f"{server.spec}?lease_ttl=1", tmp_path, cluster)
        reader = open_registry(server.spec, tmp_path, cluster)
        assert isinstance(owner, EtcdRegistry)
        try:
            owner.register("svc")
            await asyncio.to_thread(owner.set_link_address, "svc", "127.0.0.1", 4500)
            watch = reader.watch("svc")
            try:
                await until(watch, lambda a: not a.empty, "the address")
                server.kill()
                await asyncio.to_thread(server.start)  # same data dir, same ports
                # The watcher reconnected: it sees a change made after the restart.
                await asyncio.to_thread(owner.set_link_address, "svc", "127.0.0.1", 4501)
                moved = await until(
                    watch, lambda a: a.link is not None and a.link.port == 4501, "the move"
                )
                assert moved.link == Endpoint("127.0.0.1", 4501)
            finally:
                await watch.aclose()
            # The lease outlives the restart: kept alive for well past its TTL since.
            renewed = owner.keeper.renewals
            await asyncio.to_thread(
                wait_for,
                "keep-alives after the restart",
                lambda: owner.keeper.renewals >= renewed + 7,
            )
            assert reader.link_address("svc") == ("127.0.0.1", 4501)
            info = reader.get("svc")
            assert info is not None and info.name == "svc"  # instances survive, of course
        finally:
            owner.close()
            reader.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("{not json", "the value is not JSON"),
        ("[1, 2]", "the value is not a JSON object"),
        ('{"receive_port": 1}', "field 'send_port' is missing"),
        (
            '{"receive_port": "80", "send_port": 81, "current_version": 0, "committer_id": null}',
            "field 'receive_port' is '80', not an integer",
        ),
        (
            '{"receive_port": true, "send_port": 81, "current_version": 0, "committer_id": null}',
            "field 'receive_port' is True, not an integer",
        ),
        (
            '{"receive_port": 80, "send_port": 70000, "current_version": 0, "committer_id": null}',
            "field 'send_port' is 70000, outside 1..65535",
        ),
        (
            '{"receive_port": 80, "send_port": 81, "current_version": 0, "committer_id": null, '
            '"pickle": "gASV"}',
            "field 'pickle' is not known",
        ),
        (
            '{"receive_port": 80, "receive_port": 81, "send_port": 82, "current_version": 0, '
            '"committer_id": null}',
            "field 'receive_port' appears twice",
        ),
        (
            '{"receive_port": 80, "send_port": 81, "current_version": NaN, "committer_id": null}',
            "NaN is not a number JSON allows",
        ),
    ],
)
def test_a_malformed_instance_is_refused_naming_key_and_field(
    registries: tuple[EtcdRegistry, EtcdRegistry],
    etcd_server: EtcdServer,
    cluster: str,
    value: str,
    complaint: str,
) -> None:
    _, reader = registries
    key = f"/{cluster}/instances/bad"
    etcd_server.post("/v3/kv/put", {"key": b64(key), "value": b64(value)})
    for read in (lambda: reader.get("bad"), reader.instances, lambda: reader.register("other")):
        with pytest.raises(RegistryError, match=f"etcd key {key}: .*{complaint}"):
            read()


async def test_a_malformed_address_is_refused_naming_key_and_field(
    registries: tuple[EtcdRegistry, EtcdRegistry], etcd_server: EtcdServer, cluster: str
) -> None:
    _, reader = registries
    reader.register("svc")
    key = f"/{cluster}/addresses/svc/link"
    etcd_server.post(
        "/v3/kv/put", {"key": b64(key), "value": b64('{"host": "", "port": 1, "host_name": "m"}')}
    )
    with pytest.raises(RegistryError, match=f"etcd key {key}: field 'host' is '', not a non-empty"):
        reader.addresses("svc")
    with pytest.raises(RegistryError, match=f"etcd key {key}"):
        await anext(reader.watch("svc"))
    stray = f"/{cluster}/addresses/svc/other"
    etcd_server.post("/v3/kv/deleterange", {"key": b64(key)})
    etcd_server.post("/v3/kv/put", {"key": b64(stray), "value": b64("{}")})
    with pytest.raises(RegistryError, match=f"etcd key {stray}: not an address"):
        reader.link_address("svc")
    version_key = f"/{cluster}/versions/svc/0"
    etcd_server.post(
        "/v3/kv/put",
        {"key": b64(version_key), "value": b64('{"last_checkpoint": 0, "last_log": 1}')},
    )
    with pytest.raises(RegistryError, match=f"etcd key {version_key}: field 'last_checkpoint'"):
        reader.get("svc")


def test_user_and_password(tmp_path: Path, cluster: str, monkeypatch: pytest.MonkeyPatch) -> None:
    server = start_etcd(tmp_path / "etcd")
    try:
        server.post("/v3/auth/user/add", {"name": "root", "password": "s3cret"})
        server.post("/v3/auth/user/grant", {"user": "root", "role": "root"})
        server.post("/v3/auth/enable", {})
        password_file = tmp_path / "password"
        password_file.write_text("s3cret\n")
        spec = f"etcd://root@{server.endpoint}?password_file={password_file}"
        with open_registry(spec, tmp_path, cluster) as registry:
            registry.register("a")
            registry.set_link_address("a", "127.0.0.1", 4600)
            assert registry.link_address("a") == ("127.0.0.1", 4600)
        monkeypatch.setenv(PASSWORD_ENV, "s3cret")
        with open_registry(f"etcd://root@{server.endpoint}", tmp_path, cluster) as registry:
            assert [i.name for i in registry.instances()] == ["a"]
        monkeypatch.setenv(PASSWORD_ENV, "wrong")
        with pytest.raises(RegistryError, match="authentication failed"):
            open_registry(f"etcd://root@{server.endpoint}", tmp_path, cluster)
        with pytest.raises(RegistryError, match="user name is empty"):
            open_registry(server.spec, tmp_path, cluster)
    finally:
        server.stop()


@needs_openssl
def test_tls_with_client_certificates(tmp_path: Path, cluster: str) -> None:
    options = mutual_tls(tmp_path, ("localhost", "client"))
    _, server_cert, _, server_key, _, ca = options["localhost"]
    _, client_cert, _, client_key, _, _ = options["client"]
    tls = EtcdTls(*(Path(p) for p in (ca, server_cert, server_key, client_cert, client_key)))
    server = start_etcd(tmp_path / "etcd", tls)
    try:
        spec = f"{server.spec}?ca={tls.ca}&cert={tls.client_cert}&key={tls.client_key}"
        with open_registry(spec, tmp_path, cluster) as registry:
            assert registry.register("a").name == "a"
        with pytest.raises(RegistryError, match="no etcd endpoint answers"):
            open_registry(f"{server.spec}?ca={tls.ca}", tmp_path, cluster)  # no client cert
    finally:
        server.stop()


def test_spec_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = parse_etcd_spec("etcd://10.0.0.1:2380,node2,[::1]:2381?lease_ttl=3&timeout=0.5")
    assert settings.endpoints == ("http://10.0.0.1:2380", "http://node2:2379", "http://[::1]:2381")
    assert (settings.lease_ttl, settings.timeout, settings.user) == (3, 0.5, None)
    ca = tmp_path / "ca.pem"
    tls = parse_etcd_spec(f"etcds://h:1?ca={ca}&cert=c.pem&key=k.pem")
    assert tls.endpoints == ("https://h:1",) and (tls.ca_file, tls.cert_file) == (str(ca), "c.pem")
    monkeypatch.setenv(PASSWORD_ENV, "pw")
    assert parse_etcd_spec("etcd://me@h").password == "pw"
    assert "pw" not in repr(parse_etcd_spec("etcd://me@h"))
    for spec, complaint in [
        ("etcd://me:pw@h", "no password in the spec"),
        ("etcd://h?ca=x", "TLS options need etcds://"),
        ("etcds://h?cert=c", "cert= and key= together"),
        ("etcd://h?lease=1", "unknown option 'lease'"),
        ("etcd://h?timeout=1&timeout=2", "given twice"),
        ("etcd://h?lease_ttl=0.5", "lease_ttl= must be a whole number"),
        ("etcd://h/path", "only endpoints"),
        ("etcd://h:notaport", "endpoint 'h:notaport'"),
        ("etcd://h,", "an endpoint has no host"),
        ("etcd://h?password_file=/x", "needs a USER@"),
    ]:
        with pytest.raises(RegistryError, match=complaint):
            parse_etcd_spec(spec)
    monkeypatch.delenv(PASSWORD_ENV)
    with pytest.raises(RegistryError, match="needs a password"):
        parse_etcd_spec("etcd://me@h")
    with pytest.raises(RegistryError, match="cluster name"):
        open_registry("etcd://127.0.0.1:1", tmp_path, "a/b")
    with pytest.raises(RegistryError, match="cannot load the etcd TLS files"):
        open_registry(f"etcds://127.0.0.1:1?ca={tmp_path / 'missing.pem'}", tmp_path)
    with pytest.raises(RegistryError, match="no etcd endpoint answers"):
        open_registry(f"etcd://127.0.0.1:{free_port()}?timeout=2", tmp_path)
