"""What the etcd registry keeps under ``/<cluster>/``: its keys, and their JSON values.

Keys (``<name>`` an instance name, which never holds ``/``)::

    /<cluster>/instances/<name>            {"receive_port", "send_port", "current_version",
                                            "committer_id"}
    /<cluster>/versions/<name>/<version>   {"last_checkpoint", "last_log"}
    /<cluster>/addresses/<name>/link       {"host", "port", "host_name"}  (under a lease)
    /<cluster>/addresses/<name>/ingress    {"host", "port", "host_name"}  (under a lease)

A version with no key has committed no checkpoint. Values are JSON objects, never
pickles: nothing read from etcd is run as code. They are read strictly, since anyone who
can write to etcd can write there: not JSON, not an object, a field missing, unknown,
of the wrong type or out of range is refused with a :class:`RegistryError` naming the key
and the field. (A field added later is a new format, refused by readers that predate it.)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs

from .interface import Addresses, Endpoint, InstanceInfo, RegistryError

__all__ = [
    "ADDRESS_KINDS",
    "AddressRecord",
    "InstanceRecord",
    "Keys",
    "VersionRecord",
    "decode_address",
    "decode_instance",
    "decode_version",
    "encode",
    "fold_addresses",
]

ADDRESS_KINDS = ("link", "ingress")
_INT32 = (-(2**31), 2**31 - 1)
_PORT = (1, 65535)
_COUNT = (1, 2**63 - 1)  # checkpoint and log numbers
_VERSION = (0, 2**63 - 1)


class Keys:
    """The key layout under ``/<cluster>/``."""

    def __init__(self, cluster: str) -> None:
        if not cluster or "/" in cluster:
            raise RegistryError(f"cluster name {cluster!r}: give a non-empty name without '/'")
        self.root = f"/{cluster}/"
        self.instances = f"{self.root}instances/"
        self.versions = f"{self.root}versions/"
        self.addresses = f"{self.root}addresses/"

    @staticmethod
    def check_name(name: str) -> None:
        if not name or "/" in name:
            raise RegistryError(f"instance name {name!r}: give a non-empty name without '/'")

    def instance(self, name: str) -> str:
        return self.instances + name

    def version(self, name: str, version: int) -> str:
        return f"{self.versions}{name}/{version}"

    def address(self, name: str, kind: str) -> str:
        return f"{self.addresses}{name}/{kind}"

    def addresses_of(self, name: str) -> str:
        return f"{self.addresses}{name}/"


@attrs.frozen
class InstanceRecord:
    receive_port: int
    send_port: int
    current_version: int
    committer_id: int | None

    def info(self, name: str, version: VersionRecord | None) -> InstanceInfo:
        version = version or VersionRecord(None, None)
        return InstanceInfo(
            name,
            self.receive_port,
            self.send_port,
            self.current_version,
            version.last_checkpoint,
            version.last_log,
            self.committer_id,
        )


@attrs.frozen
class VersionRecord:
    last_checkpoint: int | None
    last_log: int | None


@attrs.frozen
class AddressRecord:
    host: str
    port: int
    host_name: str


def encode(record: InstanceRecord | VersionRecord | AddressRecord) -> bytes:
    """The JSON a record is stored as."""
    return json.dumps(attrs.asdict(record), sort_keys=True, separators=(",", ":")).encode()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    for field, value in pairs:
        if field in fields:
            raise ValueError(f"field {field!r} appears twice")
        fields[field] = value
    return fields


class _Fields:
    """The fields of one JSON object read from ``key`` (or from ``where``, in words),
    taken one by one and checked: every ``expected`` one there, ``optional`` ones
    perhaps, no other. :meth:`of` takes an object found inside another."""

    def __init__(
        self,
        key: str,
        raw: bytes,
        expected: tuple[str, ...],
        optional: tuple[str, ...] = (),
        *,
        where: str | None = None,
    ) -> None:
        self.where = f"etcd key {key}" if where is None else where
        try:
            doc = json.loads(
                raw.decode("utf-8"),
                parse_constant=_refuse_constant,
                object_pairs_hook=_refuse_duplicates,
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise RegistryError(f"{self.where}: the value is not JSON ({exc})") from None
        self.doc = self._checked(doc, expected, optional)

    @classmethod
    def of(cls, doc: object, where: str, expected: tuple[str, ...]) -> _Fields:
        fields = cls.__new__(cls)
        fields.where = where
        fields.doc = fields._checked(doc, expected, ())
        return fields

    def _checked(
        self, doc: object, expected: tuple[str, ...], optional: tuple[str, ...]
    ) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise RegistryError(f"{self.where}: the value is not a JSON object")
        missing = [f for f in expected if f not in doc]
        unknown = sorted(set(doc) - set(expected) - set(optional))
        if missing:
            raise RegistryError(f"{self.where}: field {missing[0]!r} is missing")
        if unknown:
            raise RegistryError(f"{self.where}: field {unknown[0]!r} is not known")
        return doc

    def integer(self, field: str, bounds: tuple[int, int], *, nullable: bool = False) -> int | None:
        value = self.doc[field]
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise RegistryError(f"{self.where}: field {field!r} is {value!r}, not an integer")
        if not bounds[0] <= value <= bounds[1]:
            raise RegistryError(
                f"{self.where}: field {field!r} is {value}, outside {bounds[0]}..{bounds[1]}"
            )
        return value

    def required_int(self, field: str, bounds: tuple[int, int]) -> int:
        value = self.integer(field, bounds)
        assert value is not None
        return value

    def flag(self, field: str) -> bool:
        """An optional true or false, false when left out."""
        value = self.doc.get(field, False)
        if not isinstance(value, bool):
            raise RegistryError(f"{self.where}: field {field!r} is {value!r}, not true or false")
        return value

    def text(self, field: str) -> str:
        value = self.doc[field]
        if not isinstance(value, str) or not value:
            raise RegistryError(
                f"{self.where}: field {field!r} is {value!r}, not a non-empty string"
            )
        return value


def decode_instance(key: str, raw: bytes) -> InstanceRecord:
    fields = _Fields(key, raw, ("receive_port", "send_port", "current_version", "committer_id"))
    return InstanceRecord(
        fields.required_int("receive_port", _PORT),
        fields.required_int("send_port", _PORT),
        fields.required_int("current_version", _VERSION),
        fields.integer("committer_id", _INT32, nullable=True),
    )


def decode_version(key: str, raw: bytes) -> VersionRecord:
    fields = _Fields(key, raw, ("last_checkpoint", "last_log"))
    return VersionRecord(
        fields.integer("last_checkpoint", _COUNT, nullable=True),
        fields.integer("last_log", _COUNT, nullable=True),
    )


def decode_address(key: str, raw: bytes) -> AddressRecord:
    fields = _Fields(key, raw, ("host", "port", "host_name"))
    return AddressRecord(
        fields.text("host"), fields.required_int("port", _PORT), fields.text("host_name")
    )


def fold_addresses(prefix: str, values: Mapping[str, bytes]) -> Addresses:
    """An instance's :class:`Addresses` from the keys under its ``prefix`` (its
    ``addresses_of``); a key of another kind is refused, naming it."""
    found: dict[str, AddressRecord] = {}
    for key, raw in sorted(values.items()):
        kind = key[len(prefix) :]
        if kind not in ADDRESS_KINDS:
            raise RegistryError(
                f"etcd key {key}: not an address the registry knows ({', '.join(ADDRESS_KINDS)})"
            )
        found[kind] = decode_address(key, raw)
    if not found:
        return Addresses()
    link, ingress = found.get("link"), found.get("ingress")
    return Addresses(
        Endpoint(link.host, link.port) if link else None,
        Endpoint(ingress.host, ingress.port) if ingress else None,
        (link or found["ingress"]).host_name,
    )
