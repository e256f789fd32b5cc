"""The stream-service messages and their BARE payloads, sans-IO.

Owns the message classes of seed 003 (*Payload BARE specs*), the one table of protocol
names, and the schema table that says, for every message, its protocol, its direction
(a hub receives requests and sends responses) and its fields in wire order. Encoding,
decoding and size arithmetic all read that table, so a field order is written down once.

Every payload is ``BasePayload { protocol: string, data: data }`` with the inner
message already encoded in ``data``. We speak the released protocol names and field
orders (reference, *Payload wrapper and protocol names*); the seed's differing names are
kept in :data:`SEED_PROTOCOL_NAMES` for the docs, and never accepted on the wire.

Decoding is strict: the protocol must be known in that direction, the inner message
must use its ``data`` exactly, and the wrapper must end there. Errors name the protocol,
the direction and the field, e.g. ``"stream_push request PushRequest.data at offset 17:
..."``, with offsets counted from the start of the payload.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, TypeAlias, TypeVar, cast

import attrs

from . import bare
from .bare import Reader
from .errors import UnknownProtocolError

__all__ = [
    "PROTOCOLS",
    "SEED_PROTOCOL_NAMES",
    "BasePayload",
    "CreatePartitionedRequest",
    "CreateStreamRequest",
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
    "decode_payload",
    "decode_request",
    "decode_response",
    "encode",
    "encode_payload",
    "encoded_size",
    "pull_response_fitting",
]

T = TypeVar("T")


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
        # Seed 003, *Partitioned index*, reuses "stream_index", which would make the two
        # index schemas indistinguishable on the wire; the released code renamed it.
        Protocol.STREAM_INDEX_PARTITIONED: "stream_index",
    }
)
"""Where seed 003 names a protocol differently from the released code (docs only)."""


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
    """``stream_create_partitioned`` request: one stream per partition 0..n-1."""

    stream_name: str | None
    partitions: int


@attrs.frozen
class PartitionedInit:
    """``stream_create_partitioned`` response, one per partition."""

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
    """``stream_index`` request, union tag 0: the next index this client should read."""

    client_id: str
    stream_name: str


@attrs.frozen
class SaveIndex:
    """``stream_index`` request, union tag 1: store the next index (monotonic; no reply)."""

    client_id: str
    stream_name: str
    index: int


@attrs.frozen
class Index:
    """``stream_index`` response; None when nothing was saved (clients read it as 0)."""

    client_id: str
    stream_name: str
    index: int | None


@attrs.frozen
class GetPartitionIndex:
    """``stream_index_partitioned`` request, union tag 0."""

    client_id: str
    stream_name: str
    partition: int


@attrs.frozen
class SavePartitionIndex:
    """``stream_index_partitioned`` request, union tag 1."""

    client_id: str
    stream_name: str
    partition: int
    index: int


@attrs.frozen
class PartitionIndex:
    """``stream_index_partitioned`` response."""

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


# --- the schema table -------------------------------------------------------------------


@attrs.frozen
class _Kind(Generic[T]):
    """How one field type is written, read and sized."""

    encode: Callable[[T], bytes]
    read: Callable[[Reader, str], T]
    size: Callable[[T], int]


def _read_stream_message(r: Reader, field: str) -> StreamMessage:
    return StreamMessage(r.uint(f"{field}.index"), r.data(f"{field}.data"))


def _encode_stream_message(m: StreamMessage) -> bytes:
    return bare.uint(m.index) + bare.data(m.data)


def _stream_message_size(m: StreamMessage) -> int:
    return bare.uint_size(m.index) + bare.data_size(len(m.data))


def _optional_size(value: T | None, size: Callable[[T], int]) -> int:
    return 1 if value is None else 1 + size(value)


_UINT: _Kind[int] = _Kind(bare.uint, Reader.uint, bare.uint_size)
_STRING: _Kind[str] = _Kind(bare.string, Reader.string, bare.string_size)
_DATA: _Kind[bytes] = _Kind(bare.data, Reader.data, lambda b: bare.data_size(len(b)))
_OPT_STRING: _Kind[str | None] = _Kind(
    lambda v: bare.optional(v, bare.string),
    lambda r, f: r.optional(f, Reader.string),
    lambda v: _optional_size(v, bare.string_size),
)
_OPT_UINT: _Kind[int | None] = _Kind(
    lambda v: bare.optional(v, bare.uint),
    lambda r, f: r.optional(f, Reader.uint),
    lambda v: _optional_size(v, bare.uint_size),
)
_STATUS: _Kind[Status] = _Kind(
    lambda s: bare.uint(int(s)),
    lambda r, f: Status(r.enum(f, len(Status))),
    lambda s: bare.uint_size(int(s)),
)
_MESSAGES: _Kind[tuple[StreamMessage, ...]] = _Kind(
    lambda ms: bare.list_(ms, _encode_stream_message),
    lambda r, f: r.list_(f, _read_stream_message),
    lambda ms: bare.uint_size(len(ms)) + sum(_stream_message_size(m) for m in ms),
)

_UNION_NAME = "Request"  # the seed's name for the index request union


@attrs.frozen
class _Spec:
    """One message: its class, protocol, direction, union tag, fields in wire order."""

    cls: type[Any]
    protocol: Protocol
    direction: Direction
    fields: tuple[tuple[str, _Kind[Any]], ...]
    tag: int | None = None


_REQ, _RESP = Direction.REQUEST, Direction.RESPONSE
_P = Protocol

# Field orders as the reference gives them: client_id first in every index message.
_SPECS: Final[tuple[_Spec, ...]] = (
    _Spec(CreateStreamRequest, _P.STREAM_CREATE, _REQ, (("stream_name", _OPT_STRING),)),
    _Spec(Init, _P.STREAM_CREATE, _RESP, (("stream_name", _STRING),)),
    _Spec(
        CreatePartitionedRequest,
        _P.STREAM_CREATE_PARTITIONED,
        _REQ,
        (("stream_name", _OPT_STRING), ("partitions", _UINT)),
    ),
    _Spec(
        PartitionedInit,
        _P.STREAM_CREATE_PARTITIONED,
        _RESP,
        (("stream_name", _STRING), ("partition", _UINT)),
    ),
    _Spec(PushRequest, _P.STREAM_PUSH, _REQ, (("request_id", _UINT), ("data", _DATA))),
    _Spec(
        PushConfirm,
        _P.STREAM_PUSH,
        _RESP,
        (("request_id", _UINT), ("status", _STATUS), ("index", _UINT)),
    ),
    _Spec(
        PullRequest,
        _P.STREAM_PULL,
        _REQ,
        (("request_id", _UINT), ("index", _UINT), ("limit", _UINT)),
    ),
    _Spec(PullResponse, _P.STREAM_PULL, _RESP, (("request_id", _UINT), ("messages", _MESSAGES))),
    _Spec(GetIndex, _P.STREAM_INDEX, _REQ, (("client_id", _STRING), ("stream_name", _STRING)), 0),
    _Spec(
        SaveIndex,
        _P.STREAM_INDEX,
        _REQ,
        (("client_id", _STRING), ("stream_name", _STRING), ("index", _UINT)),
        1,
    ),
    _Spec(
        Index,
        _P.STREAM_INDEX,
        _RESP,
        (("client_id", _STRING), ("stream_name", _STRING), ("index", _OPT_UINT)),
    ),
    _Spec(
        GetPartitionIndex,
        _P.STREAM_INDEX_PARTITIONED,
        _REQ,
        (("client_id", _STRING), ("stream_name", _STRING), ("partition", _UINT)),
        0,
    ),
    _Spec(
        SavePartitionIndex,
        _P.STREAM_INDEX_PARTITIONED,
        _REQ,
        (
            ("client_id", _STRING),
            ("stream_name", _STRING),
            ("partition", _UINT),
            ("index", _UINT),
        ),
        1,
    ),
    _Spec(
        PartitionIndex,
        _P.STREAM_INDEX_PARTITIONED,
        _RESP,
        (
            ("client_id", _STRING),
            ("stream_name", _STRING),
            ("partition", _UINT),
            ("index", _OPT_UINT),
        ),
    ),
    # Seed 003, *Error*: a response only.
    _Spec(Error, _P.ERROR, _RESP, (("reason", _STRING),)),
)

_BY_CLASS: Final[Mapping[type[Any], _Spec]] = MappingProxyType({s.cls: s for s in _SPECS})

PROTOCOLS: Final[Mapping[type[Any], Protocol]] = MappingProxyType(
    {s.cls: s.protocol for s in _SPECS}
)
"""The protocol each message class travels under (derived from the schema table)."""


def _decoder_table() -> dict[tuple[str, Direction], dict[int | None, _Spec]]:
    table: dict[tuple[str, Direction], dict[int | None, _Spec]] = {}
    for spec in _SPECS:
        table.setdefault((str(spec.protocol), spec.direction), {})[spec.tag] = spec
    return table


_DECODERS: Final = _decoder_table()


# --- encoding ---------------------------------------------------------------------------


def _spec_of(msg: object) -> _Spec:
    spec = _BY_CLASS.get(type(msg))
    if spec is None:
        raise TypeError(f"{type(msg).__name__} is not a stream-service message")
    return spec


def _encode_inner(spec: _Spec, msg: object) -> bytes:
    parts = [] if spec.tag is None else [bare.uint(spec.tag)]
    for name, kind in spec.fields:
        try:
            parts.append(kind.encode(getattr(msg, name)))
        except ValueError as exc:
            raise ValueError(f"{spec.cls.__name__}.{name}: {exc}") from exc
    return b"".join(parts)


def encode(msg: Request | Response) -> bytes:
    """``msg`` as a BasePayload: its protocol name, then its own encoding as ``data``.

    Raises ValueError naming the field if a number is outside BARE's 64-bit ``uint``.
    """
    spec = _spec_of(msg)
    return bare.string(spec.protocol) + bare.data(_encode_inner(spec, msg))


def encoded_size(msg: Request | Response) -> int:
    """The length of ``encode(msg)``, computed from the field sizes without encoding."""
    spec = _spec_of(msg)
    inner = 0 if spec.tag is None else bare.uint_size(spec.tag)
    for name, kind in spec.fields:
        inner += kind.size(getattr(msg, name))
    return bare.string_size(spec.protocol) + bare.data_size(inner)


def encode_payload(payload: BasePayload) -> bytes:
    """A BasePayload whose ``data`` is already encoded, as bytes."""
    return bare.string(payload.protocol) + bare.data(payload.data)


# --- decoding ---------------------------------------------------------------------------


def decode_payload(payload: bytes | memoryview) -> BasePayload:
    """The BasePayload wrapper alone, whatever its protocol name; strict."""
    r = Reader(payload, "BasePayload")
    protocol = r.string("protocol")
    data = r.data("data")
    r.end()
    return BasePayload(protocol, data)


def _decode(payload: bytes | memoryview, direction: Direction) -> object:
    r = Reader(payload, "BasePayload")
    at = r.pos
    protocol = r.string("protocol")
    specs = _DECODERS.get((protocol, direction))
    if specs is None:
        raise UnknownProtocolError(protocol, at, direction.value)
    prefix = f"{protocol} {direction.value}"
    inner = r.sub("data", prefix)
    r.end()
    spec = specs.get(None)
    if spec is None:  # a union: the tag picks the struct
        inner.context = f"{prefix} {_UNION_NAME}"
        spec = specs[inner.union_tag("tag", [t for t in specs if t is not None])]
    inner.context = f"{prefix} {spec.cls.__name__}"
    values = {name: kind.read(inner, name) for name, kind in spec.fields}
    inner.end()
    return spec.cls(**values)


def decode_request(payload: bytes | memoryview) -> Request:
    """A payload a hub receives, as its request message; DecodeError if malformed.

    A protocol name unknown as a request (including ``error``, which is a response
    only, and the seed's names) is an :class:`UnknownProtocolError`.
    """
    return cast(Request, _decode(payload, Direction.REQUEST))


def decode_response(payload: bytes | memoryview) -> Response:
    """A payload a client receives, as its response message; DecodeError if malformed."""
    return cast(Response, _decode(payload, Direction.RESPONSE))


# --- sizing a pull reply ----------------------------------------------------------------


def pull_response_fitting(
    request_id: int, messages: Iterable[StreamMessage], max_payload_bytes: int
) -> PullResponse:
    """The PullResponse with the longest prefix of ``messages`` that encodes (as a
    BasePayload) in at most ``max_payload_bytes``.

    Sizes are added up arithmetically, one message at a time, and ``messages`` is read
    only as far as needed. The hub uses this so a reply never exceeds the TCP frame
    limit. Raises ValueError if even an empty response does not fit.
    """
    protocol = bare.string_size(Protocol.STREAM_PULL)
    head = len(bare.uint(request_id))  # also refuses an id outside 64 bits

    def total(count: int, items: int) -> int:
        return protocol + bare.data_size(head + bare.uint_size(count) + items)

    if total(0, 0) > max_payload_bytes:
        raise ValueError(
            f"an empty PullResponse takes {total(0, 0)} bytes, over {max_payload_bytes}"
        )
    taken: list[StreamMessage] = []
    items = 0
    for m in messages:
        size = _stream_message_size(m)
        # The total only grows with each message, so the first one that does not fit
        # ends the prefix.
        if total(len(taken) + 1, items + size) > max_payload_bytes:
            break
        taken.append(m)
        items += size
    return PullResponse(request_id, tuple(taken))
