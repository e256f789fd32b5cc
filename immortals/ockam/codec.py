"""The stream-service messages and their BARE payloads, sans-IO.

Owns the schema table that says, for every message of seed 003 (*Payload BARE specs*),
its protocol, its direction (a hub receives requests and sends responses) and its fields
in wire order. Encoding, decoding and size arithmetic all read that table, so a field
order is written down once. The message classes and the protocol names live in
:mod:`~immortals.ockam.messages`, re-exported here.

Every payload is ``BasePayload { protocol: string, data: data }`` with the inner
message already encoded in ``data``. Field orders are the released code's (reference,
*Payload wrapper and protocol names*: ``client_id`` first in every index message, as the
seed's *Payload BARE specs* also has it). Two protocols have two names
(:class:`Dialect`): the seed calls the partitioned create ``stream_create_partitions``
and reuses ``stream_index`` for partitioned indexes, where the released code says
``stream_create_partitioned`` and ``stream_index_partitioned``. A sender picks one
dialect's names; a decoder accepts both. Under ``stream_index`` the seed's partitioned
messages are told from the plain ones by their bytes alone: a plain Get is two strings
and a partitioned one two strings and a ``uint``; a plain Save has one ``uint`` after
them and a partitioned one two. Requests are never ambiguous. Responses are, once: the
bytes of ``Index(index=0)`` are also ``PartitionIndex(partition=1, index=None)``, so a
reader of the seed's index replies says which it asked for (``decode_response(...,
expect=...)``); without it the plain reading wins.

Decoding is strict: the protocol must be known in that direction, the inner message
must use its ``data`` exactly, and the wrapper must end there. Errors name the protocol,
the direction and the field, e.g. ``"stream_push request PushRequest.data at offset 17:
..."``, with offsets counted from the start of the payload.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, Final, Generic, TypeAlias, TypeVar, cast

import attrs

from . import bare
from .bare import Reader
from .errors import DecodeError, UnknownProtocolError
from .messages import (
    ANSWERED_WITH,
    SEED_PROTOCOL_NAMES,
    BasePayload,
    CreatePartitionedRequest,
    CreateStreamRequest,
    Dialect,
    Direction,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionedInit,
    PartitionIndex,
    Protocol,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    Request,
    Response,
    SaveIndex,
    SavePartitionIndex,
    Status,
    StreamMessage,
    protocol_name,
)

__all__ = [
    "ANSWERED_WITH",
    "PROTOCOLS",
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
    "decode_payload",
    "decode_request",
    "decode_request_with_dialect",
    "decode_response",
    "encode",
    "encode_payload",
    "encoded_size",
    "protocol_name",
    "pull_response_fitting",
]

T = TypeVar("T")


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

_NAMES: Final[Mapping[tuple[Protocol, Dialect], bytes]] = MappingProxyType(
    {(p, d): bare.string(protocol_name(p, d)) for p in Protocol for d in Dialect}
)

_Entry: TypeAlias = tuple[_Spec, Dialect]  # a schema, and the dialect of the name it came under


def _decoder_table() -> dict[tuple[str, Direction], dict[int | None, list[_Entry]]]:
    # Each name lists the schemas it may carry, the released reading of the name first.
    table: dict[tuple[str, Direction], dict[int | None, list[_Entry]]] = {}
    for dialect in (Dialect.RELEASED, Dialect.SEED):
        for spec in _SPECS:
            name = protocol_name(spec.protocol, dialect)
            entries = table.setdefault((name, spec.direction), {}).setdefault(spec.tag, [])
            if all(known is not spec for known, _ in entries):
                entries.append((spec, dialect))
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


def encode(msg: Request | Response, dialect: Dialect = Dialect.RELEASED) -> bytes:
    """``msg`` as a BasePayload: its protocol name in ``dialect``, then its own encoding
    as ``data``.

    The released names are the default: they are what a released hub understands, and
    only they make every reply readable without knowing the request (module docstring).
    Raises ValueError naming the field if a number is outside BARE's 64-bit ``uint``.
    """
    spec = _spec_of(msg)
    return _NAMES[spec.protocol, dialect] + bare.data(_encode_inner(spec, msg))


def encoded_size(msg: Request | Response, dialect: Dialect = Dialect.RELEASED) -> int:
    """The length of ``encode(msg, dialect)``, computed from the field sizes."""
    spec = _spec_of(msg)
    inner = 0 if spec.tag is None else bare.uint_size(spec.tag)
    for name, kind in spec.fields:
        inner += kind.size(getattr(msg, name))
    return len(_NAMES[spec.protocol, dialect]) + bare.data_size(inner)


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


def _decode(
    payload: bytes | memoryview, direction: Direction, expect: type[Any] | None = None
) -> tuple[object, Dialect]:
    r = Reader(payload, "BasePayload")
    at = r.pos
    protocol = r.string("protocol")
    specs = _DECODERS.get((protocol, direction))
    if specs is None:
        raise UnknownProtocolError(protocol, at, direction.value)
    prefix = f"{protocol} {direction.value}"
    inner = r.sub("data", prefix)
    r.end()
    entries = specs.get(None)
    if entries is None:  # a union: the tag picks the struct
        inner.context = f"{prefix} {_UNION_NAME}"
        entries = specs[inner.union_tag("tag", [t for t in specs if t is not None])]
    if expect is not None:
        entries = [e for e in entries if e[0].cls is expect] or entries
    if len(entries) > 1:
        return _decode_either(payload, inner, prefix, entries)
    ((spec, dialect),) = entries
    inner.context = f"{prefix} {spec.cls.__name__}"
    values = {name: kind.read(inner, name) for name, kind in spec.fields}
    inner.end()
    return spec.cls(**values), dialect


def _decode_either(
    payload: bytes | memoryview, inner: Reader, prefix: str, entries: list[_Entry]
) -> tuple[object, Dialect]:
    """The first of ``entries`` whose fields use the inner bytes exactly (a name that
    carries the seed's schemas and the released ones: see the module docstring)."""
    start, stop = inner.pos, inner.pos + inner.remaining
    failures: list[tuple[DecodeError, bool]] = []  # and whether only trailing bytes were left
    for spec, dialect in entries:
        reader = Reader(payload, f"{prefix} {spec.cls.__name__}", start=start, end=stop)
        try:
            values = {name: kind.read(reader, name) for name, kind in spec.fields}
        except DecodeError as exc:
            failures.append((exc, False))
            continue
        try:
            reader.end()
        except DecodeError as exc:
            failures.append((exc, True))
            continue
        return spec.cls(**values), dialect
    # None fits. A schema that read all its fields and left bytes over is the shorter
    # shape: the error worth reporting is the first one found inside a field.
    raise next((exc for exc, trailing in failures if not trailing), failures[0][0])


def decode_request(payload: bytes | memoryview) -> Request:
    """A payload a hub receives, as its request message; DecodeError if malformed.

    Either dialect's names are read. A protocol name unknown as a request (including
    ``error``, which is a response only) is an :class:`UnknownProtocolError`.
    """
    return cast(Request, _decode(payload, Direction.REQUEST)[0])


def decode_request_with_dialect(payload: bytes | memoryview) -> tuple[Request, Dialect]:
    """:func:`decode_request`, and the dialect whose name the request came under
    (:attr:`Dialect.RELEASED` where both dialects name it alike): a hub answers in it."""
    request, dialect = _decode(payload, Direction.REQUEST)
    return cast(Request, request), dialect


def decode_response(payload: bytes | memoryview, expect: type[Any] | None = None) -> Response:
    """A payload a client receives, as its response message; DecodeError if malformed.

    ``expect``: the response class the client asked for (:data:`ANSWERED_WITH`), which
    settles the one ambiguous case of the seed's names (module docstring); an ``error``
    reply is read whatever is expected.
    """
    return cast(Response, _decode(payload, Direction.RESPONSE, expect)[0])


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
