"""An instance's replica group as the registry's store keeps it (the rules:
``coordinator/replication/group.py``): one JSON object per instance, the same in etcd
and in a SQLite registry::

    {"replicas": [0, 1, 3], "ack": 2, "previous": null}
    {"replicas": [0, 1, 2, 3], "ack": 3, "previous": {"replicas": [0, 1, 2], "ack": 2}}

``previous`` is the group a change under way comes from. The group's version is the
store's, never written in the value: the etcd key's ``mod_revision``, or a counter the
SQLite row keeps. Every write of the group changes it, and a term begins only in a
transaction that finds the version its candidate read (``campaign``, ``take_over``).

The value is read strictly, as every registry value is (anyone who can write to the
store can write there): not JSON, not an object, a field missing or unknown, replicas
not numbers in increasing order or an ack out of range is refused, naming where.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from ..replication.group import MAX_REPLICA_NUMBER, MAX_REPLICAS, Group
from .etcd_records import _Fields
from .interface import RegistryError

__all__ = ["changed", "decode_group", "encode_group"]


def encode_group(group: Group) -> bytes:
    """``group``'s value, compact and with sorted keys."""
    record: dict[str, Any] = _part(group)
    record["previous"] = None if group.previous is None else _part(group.previous)
    return json.dumps(record, sort_keys=True, separators=(",", ":")).encode()


def changed(
    stored: Group | None, instance: str, replicas: frozenset[int], k: int | None, version: int
) -> Group:
    """The group a change of ``stored`` (which the caller read as of ``version``) to
    ``replicas`` committing on ``k`` begins: changing from it, with the next version."""
    if stored is None:
        raise RegistryError(
            f"{instance!r} has no replica group yet: its replicas store it as they first start"
        )
    if stored.version != version:
        raise RegistryError(
            f"the group of {instance!r} changed meanwhile (it is {stored.describe()} now): "
            "look at it again"
        )
    if stored.previous is not None:
        raise RegistryError(
            f"a change of the group of {instance!r} is under way ({stored.describe()}): it "
            "is settled once a term of the new group has committed its start"
        )
    try:
        group = stored.changed(replicas, k)
    except ValueError as exc:
        raise RegistryError(f"the group of {instance!r}: {exc}") from None
    if group.replicas == stored.replicas and group.k == stored.k:
        raise RegistryError(f"the group of {instance!r} is {stored.describe()} already")
    return group


def _part(group: Group) -> dict[str, Any]:
    return {"replicas": sorted(group.replicas), "ack": group.k}


def decode_group(raw: bytes, version: int, where: str) -> Group:
    """The group ``raw`` holds, of the store's ``version``; ``where`` names it in errors."""
    fields = _Fields("", raw, ("replicas", "ack", "previous"), where=where)
    current = _read_part(fields)
    previous = fields.doc["previous"]
    try:
        if previous is None:
            return Group.of(current.replicas, current.k, version=version)
        part = _Fields.of(previous, f"{where}, field 'previous'", ("replicas", "ack"))
        return Group.of(current.replicas, current.k, version=version, previous=_read_part(part))
    except ValueError as exc:
        raise RegistryError(f"{where}: {exc}") from None


def _read_part(fields: _Fields) -> Group:
    replicas, ack = fields.doc["replicas"], fields.doc["ack"]
    if (
        not isinstance(replicas, list)
        or not 1 <= len(replicas) <= MAX_REPLICAS
        or any(not _integer(r, 0, MAX_REPLICA_NUMBER) for r in replicas)
        or any(a >= b for a, b in itertools.pairwise(replicas))
    ):
        raise RegistryError(
            f"{fields.where}: field 'replicas' is {replicas!r}, not 1 to {MAX_REPLICAS} "
            "replica numbers in increasing order"
        )
    if not _integer(ack, 1, len(replicas)):
        raise RegistryError(f"{fields.where}: field 'ack' is {ack!r}, not in 1..{len(replicas)}")
    return Group.of(replicas, ack)


def _integer(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
