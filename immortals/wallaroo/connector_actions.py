"""What passes between the connector's core and its edge, and the edge's fast paths.

The core (:mod:`.connector_core`) is told its :class:`ConnectorConfig` and answers every
event with :class:`Actions`: frames to write (:class:`Write`, marked when they cost a
credit), connections to dial or close, and orders for the source readers (:class:`Go`,
:class:`Stop`, :class:`Halt`), each a frozen value. The edge (:mod:`.connector`) carries
them out. Two helpers serve the edge without judging anything: :func:`granted` reads
the credits a frame from the worker grants, and :class:`MessageEncoder` writes MESSAGE
frames at a fraction of the codec's cost, byte for byte as the codec does.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, Literal, TypeAlias

import attrs

from .codec import (
    DEFAULT_MAX_FRAME_BYTES,
    DIALECTS,
    LENGTH_PREFIX_BYTES,
    Dialect,
    decode_tagged,
    encode,
    stream_id_for,
)
from .errors import ProtocolError
from .frames import Ack, Message, Nack, Ok

__all__ = [
    "Action",
    "Actions",
    "Close",
    "Commit",
    "ConnectorConfig",
    "Dial",
    "Go",
    "Halt",
    "MessageEncoder",
    "RetryLater",
    "Stop",
    "Write",
    "format_address",
    "granted",
    "parse_address",
]


def format_address(host: str, port: int) -> str:
    """``host:port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 in brackets) as a pair; ValueError naming the text otherwise."""
    host, colon, port = text.rpartition(":")
    if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def _address(inst: object, attribute: attrs.Attribute[str], value: str) -> None:
    parse_address(value)


def _to_names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _names(inst: object, attribute: attrs.Attribute[tuple[str, ...]], value: Any) -> None:
    ids: dict[int, str] = {}
    for name in value:
        other = ids.setdefault(stream_id_for(name), name)
        if other != name:
            raise ValueError(f"streams {other!r} and {name!r} have the same stream id")


@attrs.frozen
class ConnectorConfig:
    """What the connector is told at start (logged in the ``start`` impulse)."""

    worker: str = attrs.field(validator=_address)
    """``HOST:PORT`` of the worker to connect to first."""
    streams: tuple[str, ...] = attrs.field(converter=_to_names, validator=_names)
    """The source's stream names; each stream's id is :func:`.codec.stream_id_for` of it."""
    cookie: bytes = b""
    dialect: Dialect = attrs.field(default=Dialect.DRAFT, converter=Dialect)
    program_name: str = "ambrosia-py"
    instance_name: str = ""
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES


# --- what handlers return -----------------------------------------------------------------


@attrs.frozen
class Dial:
    """Connect to ``address``; report ``connected(dial, conn, address)`` once done.
    ``attempt``: sessions in a row that ended before OK (the edge's back-off).
    ``others``: addresses to try in turn when ``address`` does not answer (the old and
    new worker of a migration that did not finish, seed 001, *Notes*); ``connected``
    names the one that did."""

    dial: int
    address: str
    attempt: int
    others: tuple[str, ...] = ()


@attrs.frozen
class Write:
    """Frames for ``conn``, in order. ``charged``: each costs a credit (every frame after
    OK but ERROR does, reference) so the edge holds them until it has credits (see
    :func:`granted`)."""

    conn: str
    frames: tuple[bytes, ...]
    charged: bool = True


@attrs.frozen
class Close:
    """Close ``conn``; the core has forgotten it (no ``closed`` report is needed)."""

    conn: str


@attrs.frozen
class Go:
    """Read stream ``name`` from the source after point ``start`` (None: the source's
    origin) and send its records on ``conn`` while credits allow, replacing any reader of
    that stream; report ``halted(..., end=True)`` at the end of the source. ``lead``: a
    frame (a NOTIFY) to write, for a credit, once the source's first read from ``start``
    succeeded and before any record: if it fails, ``failed`` is reported and the frame is
    never sent (seed 000, D5: a connector that cannot resume from a NACK's point sends an
    error, not a NOTIFY)."""

    conn: str
    stream_id: int
    name: str
    generation: int
    start: int | None
    lead: bytes = b""


@attrs.frozen
class Stop:
    """Stop reading ``stream_id`` on ``conn``; nothing to report (a NACK came)."""

    conn: str
    stream_id: int


@attrs.frozen
class Halt:
    """Stop reading ``stream_id`` on ``conn`` and report the last point sent with
    ``halted(conn, stream_id, generation, point, end=False)`` (a MIGRATE came)."""

    conn: str
    stream_id: int
    name: str
    generation: int


@attrs.frozen
class Commit:
    """The worker acknowledged ``name`` up to ``point``: the source may record it (the
    Ockam source saves it with the index service)."""

    name: str
    point: int


@attrs.frozen
class RetryLater:
    """After a back-off for ``attempt``, report ``retry(conn, stream_id)``."""

    conn: str
    stream_id: int
    attempt: int


Action: TypeAlias = Dial | Write | Close | Go | Stop | Halt | Commit | RetryLater


@attrs.frozen
class Actions:
    """What a handler decided, in order, and problems worth logging."""

    actions: tuple[Action, ...] = ()
    problems: tuple[str, ...] = ()


# --- credits -------------------------------------------------------------------------------

_GRANTS: Final = {Ok: "initial_credits", Ack: "credits", Nack: "credits"}


def granted(raw: bytes, dialect: Dialect) -> int:
    """The credits a frame from the worker (its tag and body) grants: OK's initial
    credits, an ACK's or a NACK's credits; 0 for any other frame or one that does not
    decode (the core judges it, in logged order).

    Credits are back-pressure on one live connection, never durable progress, so the
    edge counts them itself and takes a grant the moment its frame arrives, without
    waiting for the frame to be logged: a refill would otherwise wait for the worker's
    log and then the connector's. The core decides only which frames cost one
    (:attr:`Write.charged`).
    """
    if not raw:
        return 0
    cls = DIALECTS[dialect].classes.get(raw[0])
    field = _GRANTS.get(cls) if cls is not None else None
    if field is None:
        return 0
    try:
        frame = decode_tagged(raw, dialect)
    except ProtocolError:
        return 0
    return int(getattr(frame, field))


# --- MESSAGE frames, fast ----------------------------------------------------------------


class MessageEncoder:
    """MESSAGE frames of one stream, as :func:`.codec.encode` writes them, at a fraction
    of its cost: the reader sends every record through here (seed 000, *Streaming*).

    The layout is not written down again: the encoder asks the codec for a frame with
    message id 0 and one with id 2^64-1 and keeps the bytes around the eight that differ,
    so it follows the dialect's table. What the fast path cannot write (v3's empty payload,
    which v3 sends as a boundary; a frame over the limit, an EncodeError) goes through
    the codec. v3's event time is 0 (the sources have none) and it has no key.
    """

    __slots__ = ("_dialect", "_head", "_limit", "_order", "_stream_id", "_tail", "_v3")

    def __init__(self, dialect: Dialect | str, stream_id: int, max_frame_bytes: int) -> None:
        d = Dialect(dialect)
        self._dialect, self._stream_id, self._limit = d, stream_id, max_frame_bytes
        self._v3 = d is Dialect.V3
        self._order: Literal["little", "big"] = "big" if self._v3 else "little"
        lo = self._slow(0, b"\x00")
        hi = self._slow(2**64 - 1, b"\x00")
        at = [i for i, (a, b) in enumerate(zip(lo, hi, strict=True)) if a != b]
        if len(at) != 8 or at[-1] - at[0] != 7 or lo[:LENGTH_PREFIX_BYTES] != hi[:4]:
            raise AssertionError(f"{d} MESSAGE layout: the message id is not 8 bytes in place")
        self._head = lo[LENGTH_PREFIX_BYTES : at[0]]
        self._tail = lo[at[0] + 8 : -1]

    def _slow(self, message_id: int, payload: bytes) -> bytes:
        if self._v3:
            message = Message(self._stream_id, message_id, payload or None, event_time=0)
        else:
            message = Message(self._stream_id, message_id, payload)
        return encode(message, self._dialect, max_frame_bytes=self._limit)

    def __call__(self, message_id: int, payload: bytes) -> bytes:
        """The MESSAGE frame (length prefix included) of record ``message_id``."""
        size = len(self._head) + 8 + len(self._tail) + len(payload)
        if size > self._limit or not payload or not 0 <= message_id < 2**64:
            return self._slow(message_id, payload)
        order = self._order
        return b"".join(
            (
                size.to_bytes(LENGTH_PREFIX_BYTES, order),
                self._head,
                message_id.to_bytes(8, order),
                self._tail,
                payload,
            )
        )
