"""Push frames on a fixed route: the hot path of a stream, without the generic tables.

A pipelined publisher sends thousands of pushes that differ only in request id and data:
same onward route (the stream worker), same return route (one address per batch). The
generic path (:func:`~.routing.decode_message`, :func:`~.codec.decode_request`, attrs
values, :func:`~.codec.encode`) costs tens of microseconds a frame in Python, which caps
a hub or a client far below what the durable log can take. This module reads and writes
exactly the same bytes with less work:

- a TransportMessage is its routing header (version, onward route, return route) and
  then its payload as BARE ``data``. BARE is self-delimiting, so a frame that *starts
  with* the bytes of a header already decoded has that header: the routes are known
  without decoding them again, and only the payload is read (``read_*_at``);
- a ``stream_push`` request or confirm is its protocol name, then one ``data`` holding
  the fields in schema order (request id and data; request id, status and index).

The readers accept only what the strict decoder accepts (minimal varints below 2**64,
lengths that end exactly where the frame ends); for anything else they return ``None``
and the caller takes the generic path, which decides, and reports what is wrong.
``tests/test_ockam_pushes.py`` checks every function against the generic codec.
"""

from __future__ import annotations

from typing import Final

from . import bare, codec
from .codec import PushConfirm, PushRequest, Status
from .routing import VERSION, Route, TransportMessage, encode_message

__all__ = [
    "confirm_payload",
    "header",
    "push_payload",
    "read_confirm_at",
    "read_push_at",
]

_PROTOCOL: Final = bare.string(str(codec.PROTOCOLS[PushRequest]))
assert codec.PROTOCOLS[PushConfirm] == codec.PROTOCOLS[PushRequest]
_OK: Final = bare.uint(int(Status.OK))


def header(onward_route: Route, return_route: Route) -> bytes:
    """The bytes of a TransportMessage with these routes, up to its payload."""
    empty = encode_message(TransportMessage(VERSION, onward_route, return_route, b""))
    return empty[:-1]  # an empty ``data`` is its one-byte length, 0


def _uint(buf: bytes, pos: int) -> tuple[int, int]:
    """A ``uint`` at ``pos`` and the position after it, or (-1, pos) if the bytes there
    are not one the strict decoder accepts (:func:`.bare.uint_at`): the caller then
    leaves the frame to the generic decoder, which reports it."""
    try:
        return bare.uint_at(buf, pos, len(buf))
    except ValueError:
        return -1, pos


def _fields_at(message: bytes, start: int) -> int:
    """Where the fields of a ``stream_push`` payload begin, if ``message[start:]`` is
    exactly one such payload as ``data`` (lengths that end where the message ends);
    -1 otherwise."""
    size, pos = _uint(message, start)
    if size < 0 or pos + size != len(message) or not message.startswith(_PROTOCOL, pos):
        return -1
    size, pos = _uint(message, pos + len(_PROTOCOL))
    if size < 0 or pos + size != len(message):
        return -1
    return pos


def read_push_at(message: bytes, start: int) -> tuple[int, bytes] | None:
    """(request id, data) if ``message[start:]`` is a push request's payload; else None.

    ``start`` is where the payload's ``data`` begins (after the routing header). None
    means "not recognised here": the generic decoder decides what the frame is.
    """
    pos = _fields_at(message, start)
    if pos < 0:
        return None
    request_id, pos = _uint(message, pos)
    size, pos = _uint(message, pos)
    if request_id < 0 or size < 0 or pos + size != len(message):
        return None
    return request_id, message[pos:]


def confirm_payload(request_id: int, index: int) -> bytes:
    """``codec.encode(PushConfirm(request_id, Status.OK, index))``, directly."""
    inner = bare.uint(request_id) + _OK + bare.uint(index)
    return _PROTOCOL + bare.uint(len(inner)) + inner


def read_confirm_at(message: bytes, start: int) -> tuple[int, int, int] | None:
    """(request id, status, index) if ``message[start:]`` is a push confirm's payload.

    None means "not recognised here" (see :func:`read_push_at`). The status is a
    number in the schema's range; the caller decides what a refusal means.
    """
    pos = _fields_at(message, start)
    if pos < 0:
        return None
    request_id, pos = _uint(message, pos)
    status, pos = _uint(message, pos)
    index, pos = _uint(message, pos)
    if request_id < 0 or not 0 <= status < len(Status) or index < 0 or pos != len(message):
        return None
    return request_id, status, index


def push_payload(request_id: int, data: bytes) -> bytes:
    """``codec.encode(PushRequest(request_id, data))``, directly."""
    inner = bare.uint(request_id) + bare.uint(len(data)) + data
    return _PROTOCOL + bare.uint(len(inner)) + inner
