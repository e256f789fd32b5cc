"""The instance registry in etcd (v3 API, etcd 3.4+): instances on many machines find
each other by name.

Everything lives under ``/<cluster>/`` as JSON (:mod:`.etcd_records`: the keys, the
values, and how strictly they are read). The client is etcd's JSON gateway over httpx
(:mod:`.etcd_client` says why not a gRPC client). The rules are the SQLite registry's
(:mod:`.rules`); each change reads what it needs and writes in one etcd transaction that
fails if anything it read has changed since, and is then tried again:

- ``register`` reads every instance at revision R and writes only if no instance key
  changed after R, so two registrations can never take the same port;
- ``commit_checkpoint`` writes the version's key only if it is as it was read (the
  number only grows) and the instance exists; others compare the instance's key.

Addresses (link, ingress, machine name) are put under the process's lease, which
:class:`.etcd_lease.LeaseKeeper` keeps alive: a dead coordinator's addresses vanish
within the lease's TTL. :meth:`EtcdRegistry.watch` follows them (:func:`follow`),
reconnecting when etcd goes away and comes back.

While etcd cannot be reached, a request fails with
:class:`~.interface.RegistryUnavailable`, except the two a serving coordinator makes:
:meth:`EtcdRegistry.link_address` answers with what this process read last, and an
address published is held and put once etcd answers (:mod:`.etcd_lease`).

The registry's methods are synchronous, like the SQLite registry's, for the commands and
for the coordinator (which calls them from worker threads). They run on a private event
loop in a thread of their own, which also keeps the lease alive, so a busy caller cannot
starve the keep-alives. :meth:`EtcdRegistry.watch` is asynchronous and runs on the
caller's loop, with its own connection.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import threading
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import attrs

from .etcd_client import (
    EtcdClient,
    EtcdSettings,
    EtcdUnavailable,
    KeyValue,
    compare,
    put_op,
    range_op,
)
from .etcd_lease import LeaseKeeper
from .etcd_records import (
    AddressRecord,
    InstanceRecord,
    Keys,
    VersionRecord,
    decode_address,
    decode_instance,
    decode_version,
    encode,
    fold_addresses,
)
from .interface import (
    DEFAULT_CLUSTER,
    Addresses,
    InstanceInfo,
    RegistryError,
    RegistryUnavailable,
)
from .rules import (
    PORT_RANGE,
    check_checkpoint,
    check_committer_id,
    check_port,
    check_register,
    check_version,
    choose_ports,
)

__all__ = ["EtcdRegistry", "follow"]

log = logging.getLogger("ambrosia_py.coordinator")

T = TypeVar("T")
_TRIES = 50  # of a transaction whose reads others keep changing
_RETRY_DELAY = (0.05, 2.0)  # watch reconnection: first and longest wait, seconds


class EtcdRegistry:
    """The registry under ``/<cluster>/`` of the etcd ``settings`` reach.

    ``host_name``: the machine name published with this process's addresses (default
    the host's name). Opening checks that etcd answers.
    """

    def __init__(
        self,
        settings: EtcdSettings,
        cluster: str = DEFAULT_CLUSTER,
        host_name: str | None = None,
    ) -> None:
        self.settings = settings
        self.keys = Keys(cluster)
        self.host_name = host_name or socket.gethostname()
        self._closed = False
        self._known: dict[str, Addresses] = {}  # as last read, for link_address
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="etcd registry", daemon=True
        )
        self._thread.start()
        try:
            self._client = self._run(_make_client(settings))
        except BaseException:
            self._stop_loop()
            raise
        self.keeper = LeaseKeeper(self._client, settings.lease_ttl)
        try:
            self._run(self._client.ping(self.keys.root))
        except BaseException:
            self._run(self._client.aclose())
            self._stop_loop()
            raise

    @property
    def where(self) -> str:
        return f"etcd {','.join(self.settings.endpoints)} under {self.keys.root}"

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            work.close()
            raise RegistryError(f"the registry ({self.where}) is closed")
        if threading.current_thread() is self._thread:
            work.close()
            raise RuntimeError("the etcd registry's methods are not for its own loop")
        try:
            return asyncio.run_coroutine_threadsafe(work, self._loop).result()
        except RegistryError as exc:
            exc.args = (f"{exc} (registry: {self.where})",)
            raise

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def close(self) -> None:
        """Revoke the lease (withdrawing this process's addresses at once) and let go."""
        if self._closed:
            return
        try:
            self._run(self.keeper.stop(revoke=True))
            self._run(self._client.aclose())
        finally:
            self._closed = True
            self._stop_loop()

    def __enter__(self) -> EtcdRegistry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reading -----------------------------------------------------------------------

    def get(self, name: str) -> InstanceInfo | None:
        return self._run(self._get(name))

    async def _get(self, name: str) -> InstanceInfo | None:
        revision, found = await self._client.range(self.keys.instance(name))
        if not found:
            return None
        record = decode_instance(found[0].key, found[0].value)
        key = self.keys.version(name, record.current_version)
        _, versions = await self._client.range(key, revision=revision)
        return record.info(name, _version(versions))

    def instances(self) -> list[InstanceInfo]:
        return self._run(self._instances())

    async def _instances(self) -> list[InstanceInfo]:
        revision, found = await self._client.range(self.keys.instances, prefix=True)
        _, versions = await self._client.range(self.keys.versions, prefix=True, revision=revision)
        by_key = {kv.key: kv for kv in versions}
        infos = []
        for kv in found:
            name = kv.key[len(self.keys.instances) :]
            record = decode_instance(kv.key, kv.value)
            version = by_key.get(self.keys.version(name, record.current_version))
            infos.append(record.info(name, _version([version] if version else [])))
        return sorted(infos, key=lambda info: info.name)

    def link_address(self, name: str) -> tuple[str, int] | None:
        """The link address of ``name``; while etcd cannot be reached, the one this
        process read last (a link that reconnects during an outage dials where its peer
        was: the peer cannot have published a move meanwhile either)."""
        try:
            link = self.addresses(name).link
        except RegistryUnavailable:
            link = self._known.get(name, Addresses()).link
        return None if link is None else (link.host, link.port)

    def addresses(self, name: str) -> Addresses:
        self.keys.check_name(name)
        found = self._run(self._addresses(name))
        self._known[name] = found
        return found

    async def _addresses(self, name: str) -> Addresses:
        prefix = self.keys.addresses_of(name)
        _, found = await self._client.range(prefix, prefix=True)
        return fold_addresses(prefix, {kv.key: kv.value for kv in found})

    def port_users(self, port: int) -> list[tuple[str, str, str]]:
        return self._run(self._port_users(port))

    async def _port_users(self, port: int) -> list[tuple[str, str, str]]:
        revision, found = await self._client.range(self.keys.instances, prefix=True)
        _, published = await self._client.range(self.keys.addresses, prefix=True, revision=revision)
        users = []
        for kv in found:
            record = decode_instance(kv.key, kv.value)
            name = kv.key[len(self.keys.instances) :]
            for what, used in (
                ("receive port", record.receive_port),
                ("send port", record.send_port),
            ):
                if used == port:
                    users.append((name, what, "127.0.0.1"))
        for kv in published:
            name, _, kind = kv.key[len(self.keys.addresses) :].partition("/")
            address = decode_address(kv.key, kv.value)
            if address.port == port:
                users.append((name, "link port" if kind == "link" else kind, address.host))
        return users

    # --- writing -----------------------------------------------------------------------

    def register(
        self,
        name: str,
        *,
        receive_port: int | None = None,
        send_port: int | None = None,
        version: int = 0,
    ) -> InstanceInfo:
        check_register(name, receive_port, send_port, version)
        self.keys.check_name(name)
        return self._run(self._register(name, receive_port, send_port, version))

    async def _register(
        self, name: str, receive_port: int | None, send_port: int | None, version: int
    ) -> InstanceInfo:
        for _ in range(_TRIES):
            revision, found = await self._client.range(self.keys.instances, prefix=True)
            records = {
                kv.key[len(self.keys.instances) :]: decode_instance(kv.key, kv.value)
                for kv in found
            }
            existing = records.get(name)
            if existing is not None and receive_port is None and send_port is None:
                info = await self._get(name)
                if info is not None:
                    return info
                continue
            used = {
                port: other
                for other, record in records.items()
                if other != name
                for port in (record.receive_port, record.send_port)
            }
            ports = None if existing is None else (existing.receive_port, existing.send_port)
            rp, sp = choose_ports(name, ports, receive_port, send_port, used, PORT_RANGE)
            record = (
                InstanceRecord(rp, sp, version, None)
                if existing is None
                else attrs.evolve(existing, receive_port=rp, send_port=sp)
            )
            # Every instance key as read at ``revision``: none changed or appeared since.
            unchanged = compare(self.keys.instances, "MOD", "LESS", revision + 1, prefix=True)
            key = self.keys.instance(name)
            done, _ = await self._client.txn([unchanged], [put_op(key, encode(record))])
            if done:
                info = await self._get(name)
                if info is not None:
                    return info
            await _pause()
        raise self._busy(f"register {name!r}")

    def set_current_version(self, name: str, version: int) -> None:
        check_version(version)
        self._run(self._change(name, lambda r: attrs.evolve(r, current_version=version)))

    def set_committer_id(self, name: str, committer_id: int) -> None:
        check_committer_id(committer_id)
        self._run(self._change(name, lambda r: attrs.evolve(r, committer_id=committer_id)))

    async def _change(self, name: str, change: Callable[[InstanceRecord], InstanceRecord]) -> None:
        """Rewrite the instance's key with ``change``, if nobody wrote it in between."""
        self.keys.check_name(name)
        key = self.keys.instance(name)
        for _ in range(_TRIES):
            _, found = await self._client.range(key)
            if not found:
                raise _unknown(name)
            record = change(decode_instance(key, found[0].value))
            same = compare(key, "MOD", "EQUAL", found[0].mod_revision)
            done, _ = await self._client.txn([same], [put_op(key, encode(record))])
            if done:
                return
            await _pause()
        raise self._busy(f"change {name!r}")

    def commit_checkpoint(self, name: str, version: int, checkpoint: int, log: int) -> None:
        check_checkpoint(name, version, checkpoint, log, None)
        self.keys.check_name(name)
        self._run(self._commit(name, version, checkpoint, log))

    async def _commit(self, name: str, version: int, checkpoint: int, log: int) -> None:
        instance, key = self.keys.instance(name), self.keys.version(name, version)
        for _ in range(_TRIES):
            _, (found, versions) = await self._client.txn([], [range_op(instance), range_op(key)])
            if not found:
                raise _unknown(name)
            recorded = _version(versions).last_checkpoint
            check_checkpoint(name, version, checkpoint, log, recorded)
            modified = versions[0].mod_revision if versions else 0
            conditions = [
                compare(instance, "VERSION", "GREATER", 0),
                compare(key, "MOD", "EQUAL", modified),
            ]
            record = VersionRecord(checkpoint, log)
            done, _ = await self._client.txn(conditions, [put_op(key, encode(record))])
            if done:
                return
            await _pause()
        raise self._busy(f"commit checkpoint {checkpoint} of {name!r}")

    def restore(
        self, name: str, version: int, committer_id: int | None, checkpoints: dict[int, int]
    ) -> InstanceInfo:
        if self.get(name) is not None:
            raise RegistryError(f"instance {name!r} is registered already")
        self.register(name, version=version)
        if committer_id is not None:
            self.set_committer_id(name, committer_id)
        for v, checkpoint in sorted(checkpoints.items()):
            self.commit_checkpoint(name, v, checkpoint, checkpoint)
        info = self.get(name)
        assert info is not None
        return info

    # --- addresses, under the lease ------------------------------------------------------

    def set_link_address(self, name: str, host: str, port: int) -> None:
        self._publish(name, "link", host, port)

    def set_ingress_address(self, name: str, host: str, port: int) -> None:
        self._publish(name, "ingress", host, port)

    def clear_link_address(self, name: str) -> None:
        self.keys.check_name(name)
        self._run(self.keeper.withdraw(self.keys.address(name, "link")))

    def clear_ingress_address(self, name: str, address: tuple[str, int] | None = None) -> None:
        self.keys.check_name(name)
        key = self.keys.address(name, "ingress")
        if address is None:
            self._run(self.keeper.withdraw(key))
        else:  # ours only while it is still under this process's lease
            self._run(self.keeper.withdraw_own(key))

    def _publish(self, name: str, kind: str, host: str, port: int) -> None:
        check_port(port, "link port" if kind == "link" else "ingress port")
        self.keys.check_name(name)
        if not host:
            raise RegistryError(f"the {kind} address of {name!r} needs a host")
        value = encode(AddressRecord(host, port, self.host_name))
        key, instance = self.keys.address(name, kind), self.keys.instance(name)
        if not self._run(self.keeper.publish(key, value, instance)):
            raise _unknown(name)

    def watch(self, name: str) -> AsyncGenerator[Addresses, None]:
        self.keys.check_name(name)
        prefix = self.keys.addresses_of(name)
        return follow(
            lambda: _make_client(self.settings),
            prefix,
            lambda values: fold_addresses(prefix, values),
        )

    def _busy(self, doing: str) -> RegistryError:
        return RegistryError(
            f"could not {doing}: others kept changing the registry ({_TRIES} tries)"
        )


async def follow(
    make_client: Callable[[], Awaitable[EtcdClient]],
    prefix: str,
    fold: Callable[[dict[str, bytes]], T],
) -> AsyncGenerator[T, None]:
    """``fold`` of the keys under ``prefix`` now, then each time it changes.

    Reads the keys at a revision, then watches from the next one, folding after each
    revision (each transaction) even when etcd sends several at once; when the watch breaks
    (etcd went away) it reads and watches again, waiting longer each time it fails (up to
    two seconds), and yields only what differs from what it yielded last.
    """
    client = await make_client()
    delay, last, outage = _RETRY_DELAY[0], None, False
    try:
        while True:
            try:
                revision, found = await client.range(prefix, prefix=True)
                values = {kv.key: kv.value for kv in found}
                if outage:
                    log.info("watching %s again", prefix)
                    outage = False
                current = fold(values)
                if current != last:
                    last = current
                    yield current
                async for events in client.watch(prefix, revision + 1):
                    delay = _RETRY_DELAY[0]
                    for i, event in enumerate(events):
                        if event.deleted:
                            values.pop(event.key, None)
                        else:
                            values[event.key] = event.value
                        if i + 1 < len(events) and events[i + 1].revision == event.revision:
                            continue  # one transaction: its changes count together
                        current = fold(values)
                        if current != last:
                            last = current
                            yield current
            except EtcdUnavailable as exc:  # or WatchCanceled: read afresh, watch again
                if not outage:
                    log.warning("watching %s: %s; trying again", prefix, exc)
                    outage = True
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, _RETRY_DELAY[1])
    finally:
        await client.aclose()


async def _make_client(settings: EtcdSettings) -> EtcdClient:
    return EtcdClient(settings)  # made on the loop that is to use it


async def _pause() -> None:
    """A short random wait before a transaction is tried again."""
    await asyncio.sleep(random.uniform(0.001, 0.02))


def _version(found: list[KeyValue]) -> VersionRecord:
    return decode_version(found[0].key, found[0].value) if found else VersionRecord(None, None)


def _unknown(name: str) -> RegistryError:
    return RegistryError(f"unknown instance {name!r} (register it first)")
