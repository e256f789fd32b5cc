"""The primary role (:mod:`.primary`) in etcd: a key under the primary process's lease, an
epoch that is the revision of the write that began the term.

Keys, beside the registry's (:mod:`.etcd_records`; values strict JSON, read as strictly)::

    /<cluster>/primary/<name>          {"replica", "log_position"}   the current term
    /<cluster>/replicas/<name>/<N>     {"host", "port", "host_name", "log_position",
                                        "recovering" (may be left out: false)}
    /<cluster>/group/<name>            {"replicas", "ack", "previous"}  (:mod:`.groups`)

Both live under the lease of the process that wrote them: the registry's one lease per
process (:class:`.etcd_lease.LeaseKeeper`), which its replica registration uses too; so a
replica registers before it campaigns, and a primary that dies or is cut off from etcd
loses its term within the lease's TTL.

The group is under no lease: it outlives every process. Its version is its key's
``mod_revision``, so every write of it gives it a higher one.

A term's epoch is the key's ``mod_revision``: the revision of the transaction that wrote
it, higher than every revision before, and unchanged while the term lasts (keep-alives
write nothing, and nothing else writes the key). The transactions:

- ``campaign``: if the key has no ``create_revision`` (nobody holds it), the instance
  is registered and the group's ``mod_revision`` is the version the caller read, put it
  under our lease;
- ``take_over``: if the key's ``mod_revision`` is the epoch the caller saw and the
  group's the version it read, put it under our lease. The put moves the key onto our
  lease, so the deposed primary's lease ending later does not delete the new term;
- ``resign``: if the key's ``mod_revision`` is the term's epoch, delete it.

The keeper puts back, under a new lease, what it holds when its lease ran out; the
primary key is never among those (it is written here, not published through the keeper):
a term whose lease ended is over, and putting it back would take the role behind the back
of whoever took it since. ``current`` and ``still_primary`` are ranges, linearizable as
etcd serves them by default. ``watch_primary`` is the registry's :func:`.etcd.follow` of
the key, through a client that hands each value on with its revision (the term's epoch).
"""

from __future__ import annotations

import base64
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Coroutine
from typing import Any, TypeVar

import attrs

from ..replication.group import Group
from .etcd import EtcdRegistry, follow
from .etcd_client import (
    EtcdClient,
    EtcdSettings,
    EtcdUnavailable,
    KeyValue,
    WatchEvent,
    compare,
    put_op,
    range_op,
)
from .etcd_records import _Fields
from .groups import changed, decode_group, encode_group
from .interface import Endpoint, RegistryError
from .primary import LOG_POSITION_MAX, Replica, Term, check_replica

__all__ = ["EtcdPrimaryElection"]

T = TypeVar("T")
_TRIES = 50  # of a campaign whose key keeps vanishing and reappearing under it
_REPLICA = (0, 2**31 - 1)
_POSITION = (0, LOG_POSITION_MAX)


class EtcdPrimaryElection:
    """The primary role of instances in ``registry``'s etcd, for this process."""

    def __init__(self, registry: EtcdRegistry) -> None:
        self._registry = registry
        # Touched only on the registry's loop, one coroutine at a time.
        self._registered: set[str] = set()  # replica keys this process published
        self._terms: set[Term] = set()  # terms begun here and not resigned

    @property
    def where(self) -> str:
        return self._registry.where

    def _run(self, work: Coroutine[Any, Any, T]) -> T:
        return self._registry._run(work)

    def _keys(self, instance: str) -> tuple[str, str]:
        """The key of ``instance``'s term and the prefix of its replicas' keys."""
        keys = self._registry.keys
        keys.check_name(instance)
        return f"{keys.root}primary/{instance}", f"{keys.root}replicas/{instance}/"

    def close(self) -> None:
        """Resign what this process holds and withdraw its replicas (before the registry
        is closed; closing the registry alone revokes the lease, which ends them too)."""
        self._run(self._close())

    async def _close(self) -> None:
        for term in sorted(self._terms, key=lambda t: t.epoch):
            await self._resign(term)
        for key in sorted(self._registered):
            await self._registry.keeper.withdraw(key)
        self._registered.clear()

    # --- replicas ----------------------------------------------------------------------

    def register_replica(
        self,
        instance: str,
        replica: int,
        address: Endpoint,
        log_position: int,
        recovering: bool = False,
    ) -> None:
        check_replica(replica, log_position, address)
        key = self._keys(instance)[1] + str(replica)
        record = {
            "host": address.host,
            "port": address.port,
            "host_name": self._registry.host_name,
            "log_position": log_position,
            "recovering": recovering,
        }
        self._run(self._register(instance, replica, key, _json(record)))

    async def _register(self, instance: str, replica: int, key: str, value: bytes) -> None:
        keeper = self._registry.keeper
        _, found = await self._registry._client.range(key)
        if found and (not keeper.lease or found[0].lease != keeper.lease):
            raise RegistryError(
                f"replica {replica} of {instance!r} is registered by another live process "
                f"(etcd lease {found[0].lease:x})"
            )
        if not await keeper.publish(key, value, self._registry.keys.instance(instance)):
            raise _unknown(instance)
        self._registered.add(key)

    def replicas(self, instance: str) -> list[Replica]:
        prefix = self._keys(instance)[1]
        _, found = self._run(self._registry._client.range(prefix, prefix=True))
        return sorted(
            (_replica(kv.key, kv.key[len(prefix) :], kv.value) for kv in found),
            key=lambda r: r.replica,
        )

    # --- the term ----------------------------------------------------------------------

    def campaign(
        self, instance: str, replica: int, log_position: int, *, group_version: int
    ) -> Term | None:
        check_replica(replica, log_position)
        key = self._keys(instance)[0]
        return self._run(self._campaign(instance, replica, key, log_position, group_version))

    async def _campaign(
        self, instance: str, replica: int, key: str, log_position: int, group_version: int
    ) -> Term | None:
        registered = self._registry.keys.instance(instance)
        group_key = self._group_key(instance)
        nobody = compare(key, "CREATE", "EQUAL", 0)
        same_group = compare(group_key, "MOD", "EQUAL", group_version)
        for _ in range(_TRIES):
            exists = compare(registered, "VERSION", "GREATER", 0)
            conditions = [nobody, exists, same_group]
            term = await self._begin(instance, replica, key, log_position, conditions)
            if term is not None:
                return term
            _, (held, found, group) = await self._registry._client.txn(
                [], [range_op(key), range_op(registered), range_op(group_key)]
            )
            if not found:
                raise _unknown(instance)
            if held or (group[0].mod_revision if group else 0) != group_version:
                return None
        raise RegistryError(f"could not campaign for {instance!r}: its term kept changing")

    def take_over(
        self, instance: str, replica: int, seen: Term, log_position: int, *, group_version: int
    ) -> Term | None:
        check_replica(replica, log_position)
        key = self._keys(instance)[0]
        if seen.instance != instance:
            raise RegistryError(f"a term of {seen.instance!r} is not one of {instance!r}")
        same = compare(key, "MOD", "EQUAL", seen.epoch)
        same_group = compare(self._group_key(instance), "MOD", "EQUAL", group_version)
        return self._run(self._begin(instance, replica, key, log_position, [same, same_group]))

    async def _begin(
        self,
        instance: str,
        replica: int,
        key: str,
        log_position: int,
        conditions: list[dict[str, Any]],
    ) -> Term | None:
        """Put the term's key under our lease if ``conditions`` hold; the term it began."""
        if self._keys(instance)[1] + str(replica) not in self._registered:
            raise RegistryError(
                f"replica {replica} of {instance!r}: register it in this process first "
                "(its term lives under the lease of its registration)"
            )
        lease = self._registry.keeper.lease
        if not lease:  # its registration waits for etcd to answer again
            raise EtcdUnavailable(f"no etcd lease yet to hold the term of {instance!r} under")
        value = _json({"replica": replica, "log_position": log_position})
        done, reads = await self._registry._client.txn(
            conditions, [put_op(key, value, lease), range_op(key)]
        )
        if not done:
            return None
        term = _term(instance, reads[0][0])
        self._terms.add(term)
        return term

    def current(self, instance: str) -> Term | None:
        key = self._keys(instance)[0]
        _, found = self._run(self._registry._client.range(key))
        return _term(instance, found[0]) if found else None

    def still_primary(self, term: Term) -> bool:
        return self.current(term.instance) == term

    def renew(self, term: Term, log_position: int, *, group_version: int) -> Term | None:
        check_replica(term.replica, log_position)
        if term not in self._terms:
            return None
        return self._run(self._renew(term, log_position, group_version))

    async def _renew(self, term: Term, log_position: int, group_version: int) -> Term | None:
        key = self._keys(term.instance)[0]
        lease = self._registry.keeper.lease
        if not lease:
            return None
        conditions = [
            compare(key, "MOD", "EQUAL", term.epoch),
            compare(self._group_key(term.instance), "MOD", "EQUAL", group_version),
        ]
        value = _json({"replica": term.replica, "log_position": log_position})
        done, reads = await self._registry._client.txn(
            conditions, [put_op(key, value, lease), range_op(key)]
        )
        if not done:
            return None
        renewed = _term(term.instance, reads[0][0])
        self._terms.discard(term)
        self._terms.add(renewed)
        return renewed

    # --- the group ---------------------------------------------------------------------

    def _group_key(self, instance: str) -> str:
        self._keys(instance)
        return f"{self._registry.keys.root}group/{instance}"

    def group(self, instance: str) -> Group | None:
        key = self._group_key(instance)
        _, found = self._run(self._registry._client.range(key))
        return _group(found[0]) if found else None

    def found_group(self, instance: str, group: Group) -> Group:
        key = self._group_key(instance)
        value = encode_group(Group.of(group.replicas, group.k))
        absent = compare(key, "CREATE", "EQUAL", 0)
        exists = compare(self._registry.keys.instance(instance), "VERSION", "GREATER", 0)
        client = self._registry._client
        self._run(client.txn([absent, exists], [put_op(key, value)]))
        _, found = self._run(client.range(key))
        if not found:
            raise _unknown(instance)
        return _group(found[0])

    def change_group(
        self, instance: str, replicas: frozenset[int], k: int | None, *, from_version: int
    ) -> Group:
        key = self._group_key(instance)
        stored = self.group(instance)
        group = changed(stored, instance, replicas, k, from_version)
        same = compare(key, "MOD", "EQUAL", from_version)
        done, reads = self._run(
            self._registry._client.txn([same], [put_op(key, encode_group(group)), range_op(key)])
        )
        if not done:
            raise RegistryError(f"the group of {instance!r} changed meanwhile: look at it again")
        return _group(reads[0][0])

    def settle_group(self, term: Term, group: Group) -> Group | None:
        if term not in self._terms or group.previous is None:
            return None
        key = self._group_key(term.instance)
        conditions = [
            compare(key, "MOD", "EQUAL", group.version),
            compare(self._keys(term.instance)[0], "MOD", "EQUAL", term.epoch),
        ]
        operations = [put_op(key, encode_group(group.settled)), range_op(key)]
        done, reads = self._run(self._registry._client.txn(conditions, operations))
        return _group(reads[0][0]) if done else None

    def resign(self, term: Term) -> None:
        self._keys(term.instance)
        self._run(self._resign(term))

    async def _resign(self, term: Term) -> None:
        if term not in self._terms:
            return  # not ours to end
        key = self._keys(term.instance)[0]
        delete = {"request_delete_range": {"key": base64.b64encode(key.encode()).decode()}}
        await self._registry._client.txn([compare(key, "MOD", "EQUAL", term.epoch)], [delete])
        self._terms.discard(term)

    async def watch_primary(self, instance: str) -> AsyncGenerator[Term | None, None]:
        key = self._keys(instance)[0]
        settings = self._registry.settings
        # Folded into 1-tuples: ``follow`` yields nothing for a first fold of ``None``.
        # ``key`` as a prefix also holds longer names that start with this one: left out.
        terms = follow(
            lambda: _revisions_client(settings),
            key,
            lambda values: (_stamped_term(instance, key, values.get(key)),),
        )
        async with contextlib.aclosing(terms):
            async for (term,) in terms:
                yield term


class _Revisions(EtcdClient):
    """A client whose values carry their ``mod_revision`` in front (``b"REVISION VALUE"``),
    so that :func:`.etcd.follow`, which folds values alone, can fold terms with their
    epochs."""

    async def range(
        self, key: str, *, prefix: bool = False, revision: int = 0
    ) -> tuple[int, list[KeyValue]]:
        at, found = await super().range(key, prefix=prefix, revision=revision)
        return at, [attrs.evolve(kv, value=_stamp(kv.mod_revision, kv.value)) for kv in found]

    async def watch(self, prefix: str, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        async for events in super().watch(prefix, start_revision):
            yield [
                e if e.deleted else attrs.evolve(e, value=_stamp(e.revision, e.value))
                for e in events
            ]


async def _revisions_client(settings: EtcdSettings) -> EtcdClient:
    return _Revisions(settings)  # made on the loop that is to use it: the watcher's


def _stamp(revision: int, value: bytes) -> bytes:
    return b"%d %s" % (revision, value)


def _stamped_term(instance: str, key: str, stamped: bytes | None) -> Term | None:
    if stamped is None:
        return None
    revision, _, value = stamped.partition(b" ")
    return _term(instance, KeyValue(key, value, 0, int(revision), 0))


def _json(record: dict[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def _term(instance: str, kv: KeyValue) -> Term:
    fields = _Fields(kv.key, kv.value, ("replica", "log_position"))
    return Term(
        instance,
        fields.required_int("replica", _REPLICA),
        kv.mod_revision,
        fields.required_int("log_position", _POSITION),
    )


def _group(kv: KeyValue) -> Group:
    return decode_group(kv.value, kv.mod_revision, f"etcd key {kv.key}")


def _replica(key: str, number: str, raw: bytes) -> Replica:
    if not (number.isascii() and number.isdigit()) or str(int(number)) != number:
        raise RegistryError(f"etcd key {key}: {number!r} is not a replica number")
    expected = ("host", "port", "host_name", "log_position")
    fields = _Fields(key, raw, expected, optional=("recovering",))
    return Replica(
        int(number),
        Endpoint(fields.text("host"), fields.required_int("port", (1, 65535))),
        fields.required_int("log_position", _POSITION),
        fields.text("host_name"),
        fields.flag("recovering"),
    )


def _unknown(instance: str) -> RegistryError:
    return RegistryError(f"unknown instance {instance!r} (register it first)")
