"""The stream-service messages of seed 003 as values, and the names they travel under.

Frozen classes for every message of seed 003 (*Payload BARE specs*), the protocol names
of both dialects (:class:`Dialect`: where the seed and the released Ockam code name a
protocol differently), and which response answers which request. How each is laid out
in bytes is :mod:`~immortals.ockam.codec`'s, which re-exports everything here.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeAlias

import attrs

__all__ = [
    "ANSWERED_WITH",
    "SEED_PROTOCOL_NAMES",
    "BasePayload",
    "CreatePartitionedRequest",
    "CreateStreamRequest",
    "Dialect",
    "Direction",
    "Error",
    "GetIndex",
    "GetPartitionIndex",
    "Index",
    "Init",
    "PartitionIndex",
    "PartitionedInit",
    "Protocol",
    "PullRequest",
    "PullResponse",
    "PushConfirm",
    "PushRequest",
    "Request",
    "Response",
    "SaveIndex",
    "SavePartitionIndex",
    "Status",
    "StreamMessage",
    "protocol_name",
]


class Protocol(enum.StrEnum):
    """The protocol names a BasePayload carries, as the released code spells them."""

    STREAM_CREATE = "stream_create"
    STREAM_CREATE_PARTITIONED = "stream_create_partitioned"
    STREAM_PUSH = "stream_push"
    STREAM_PULL = "stream_pull"
    STREAM_INDEX = "stream_index"
    STREAM_INDEX_PARTITIONED = "stream_index_partitioned"
    ERROR = "error"


SEED_PROTOCOL_NAMES: Final[Mapping[Protocol, str]] = MappingProxyType(
    {
        # Seed 003, *Create partitioned stream*: "stream_create_partitions".
        Protocol.STREAM_CREATE_PARTITIONED: "stream_create_partitions",
        # Seed 003, *Partitioned index*, reuses "stream_index"; the released code renamed
        # it, since one reply's bytes read both ways (see the module docstring).
        Protocol.STREAM_INDEX_PARTITIONED: "stream_index",
    }
)
"""Where seed 003 names a protocol differently from the released code."""


class Dialect(enum.StrEnum):
    """Which of seed 003 and the released Ockam code to follow where the two differ.

    On the wire it picks the names a sender uses (:data:`SEED_PROTOCOL_NAMES`); decoders
    accept both. In the hub's index service it picks what a saved index means
    (:mod:`~immortals.ockam.indexes`).
    """

    SEED = "seed"
    RELEASED = "released"


def protocol_name(protocol: Protocol, dialect: Dialect) -> str:
    """The name ``protocol`` travels under in ``dialect``."""
    if dialect is Dialect.SEED:
        return SEED_PROTOCOL_NAMES.get(protocol, str(protocol))
    return str(protocol)


class Direction(enum.StrEnum):
    """Which way a payload travels: a hub receives requests and sends responses."""

    REQUEST = "request"
    RESPONSE = "response"


class Status(enum.IntEnum):
    """PushConfirm status (seed 003, *Push*)."""

    OK = 0
    ERROR = 1


# --- messages ---------------------------------------------------------------------------


@attrs.frozen
class CreateStreamRequest:
    """``stream_create`` request: create (or find) a stream; None asks for a new name."""

    stream_name: str | None


@attrs.frozen
class Init:
    """``stream_create`` response, sent by the stream worker itself."""

    stream_name: str


@attrs.frozen
class CreatePartitionedRequest:
    """Partitioned create (seed: ``stream_create_partitions``; released:
    ``stream_create_partitioned``): one stream per partition 0..n-1."""

    stream_name: str | None
    partitions: int


@attrs.frozen
class PartitionedInit:
    """Partitioned create response, one per partition, from that partition's worker."""

    stream_name: str
    partition: int


@attrs.frozen
class PushRequest:
    """``stream_push`` request: store ``data``; ``request_id`` is echoed, not deduplicated."""

    request_id: int
    data: bytes


@attrs.frozen
class PushConfirm:
    """``stream_push`` response: the index the pushed message was stored at."""

    request_id: int
    status: Status = attrs.field(converter=Status)
    index: int


@attrs.frozen
class PullRequest:
    """``stream_pull`` request: up to ``limit`` messages from ``index`` on."""

    request_id: int
    index: int
    limit: int


@attrs.frozen
class StreamMessage:
    """One stored message in a PullResponse (not a payload on its own)."""

    index: int
    data: bytes


def _to_messages(messages: Iterable[StreamMessage]) -> tuple[StreamMessage, ...]:
    return tuple(messages)


@attrs.frozen
class PullResponse:
    """``stream_pull`` response."""

    request_id: int
    messages: tuple[StreamMessage, ...] = attrs.field(converter=_to_messages)


@attrs.frozen
class GetIndex:
    """``stream_index`` request, union tag 0: the index saved for this client and stream."""

    client_id: str
    stream_name: str


@attrs.frozen
class SaveIndex:
    """``stream_index`` request, union tag 1: save an index (monotonic; no reply)."""

    client_id: str
    stream_name: str
    index: int


@attrs.frozen
class Index:
    """``stream_index`` response. What ``index`` means depends on the hub's dialect
    (:mod:`~immortals.ockam.indexes`); None only in the released dialect, for a pair never
    saved (clients read it as 0)."""

    client_id: str
    stream_name: str
    index: int | None


@attrs.frozen
class GetPartitionIndex:
    """Partitioned index request (seed: ``stream_index``; released:
    ``stream_index_partitioned``), union tag 0."""

    client_id: str
    stream_name: str
    partition: int


@attrs.frozen
class SavePartitionIndex:
    """Partitioned index request, union tag 1 (no reply)."""

    client_id: str
    stream_name: str
    partition: int
    index: int


@attrs.frozen
class PartitionIndex:
    """Partitioned index response, under the name the request came with."""

    client_id: str
    stream_name: str
    partition: int
    index: int | None


@attrs.frozen
class Error:
    """``error`` response, e.g. reason "Invalid request" for an empty stream name."""

    reason: str


@attrs.frozen
class BasePayload:
    """The wrapper of every payload: a protocol name and the inner message's bytes."""

    protocol: str
    data: bytes


Request: TypeAlias = (
    CreateStreamRequest
    | CreatePartitionedRequest
    | PushRequest
    | PullRequest
    | GetIndex
    | SaveIndex
    | GetPartitionIndex
    | SavePartitionIndex
)
"""What a hub receives."""

Response: TypeAlias = (
    Init | PartitionedInit | PushConfirm | PullResponse | Index | PartitionIndex | Error
)
"""What a client receives."""


ANSWERED_WITH: Final[Mapping[type[Any], type[Any]]] = MappingProxyType(
    {
        CreateStreamRequest: Init,
        CreatePartitionedRequest: PartitionedInit,  # one per partition
        PushRequest: PushConfirm,
        PullRequest: PullResponse,
        GetIndex: Index,
        GetPartitionIndex: PartitionIndex,
        # SaveIndex and SavePartitionIndex have no reply (seed 003, *Updating an index*).
    }
)
"""The response class each request is answered with (or ``error``)."""
