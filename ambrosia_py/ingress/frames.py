"""The ingress protocol's frames, sans-IO: bytes in, frozen values out, and back.

Every frame is ``u32 length | u8 kind | body``: the length counts the kind byte and the
body; integers are little-endian. After the handshake every body ends in a 16-byte tag
(``connection.py``). The bodies (``docs/ingress.md`` has the same table)::

    HELLO    server -> client   "AMBINGR1" | server nonce (32)
    AUTH     client -> server   "AMBINGR1" | client nonce (32) | client proof (32)
    WELCOME  server -> client   server proof (32) | u8 n | instance (n) | u8 m | service (m)
                                | u32 largest CALL frame the server takes
    CALL     client -> server   u32 request id | u8 k | key (k, 1..255) | i32 method id | args
    REPLY    server -> client   u32 request id | u8 outcome | value
    REFUSED  server -> client   u32 request id | u8 reason | UTF-8 message

A reader refuses a declared length over its current limit as soon as the 4 length bytes
are in, before buffering any of the frame: before authentication the limit is the
largest handshake frame, so an unauthenticated peer can make the server hold 128 bytes.
"""

from __future__ import annotations

import enum
import struct

import attrs

from .errors import IngressProtocolError

__all__ = [
    "DEFAULT_MAX_CALL_FRAME",
    "DEFAULT_MAX_REPLY_FRAME",
    "HEADER",
    "MAGIC",
    "MAX_KEY_SIZE",
    "NONCE_SIZE",
    "PRE_AUTH_FRAME_LIMIT",
    "PROOF_SIZE",
    "WELCOME_FRAME_LIMIT",
    "Call",
    "FrameKind",
    "FrameReader",
    "Outcome",
    "OutcomeKind",
    "RawFrame",
    "Refusal",
    "RefusalReason",
    "Reply",
    "ServiceInfo",
    "decode_auth",
    "decode_call",
    "decode_hello",
    "decode_refused",
    "decode_reply",
    "decode_welcome_info",
    "call_frame_length",
    "encode_call_body",
    "encode_frame",
    "encode_refused_body",
    "encode_reply_body",
    "encode_welcome_info",
]

MAGIC = b"AMBINGR1"
NONCE_SIZE = 32
PROOF_SIZE = 32  # HMAC-SHA256
MAX_KEY_SIZE = 255
HEADER = struct.Struct("<IB")  # length (kind + body), kind
_U32 = struct.Struct("<I")
_CALL_HEAD = struct.Struct("<IB")  # request id, key length
_METHOD = struct.Struct("<i")
_REPLY_HEAD = struct.Struct("<IB")  # request id, outcome or reason
HELLO_BODY = len(MAGIC) + NONCE_SIZE  # 40
AUTH_BODY = len(MAGIC) + NONCE_SIZE + PROOF_SIZE  # 72
# Before the client has proved the secret the server takes one frame of at most this
# length (AUTH is 73 with its kind byte); the client takes a WELCOME of at most this.
PRE_AUTH_FRAME_LIMIT = 128
WELCOME_FRAME_LIMIT = 1 + PROOF_SIZE + 2 * (1 + 255) + _U32.size
DEFAULT_MAX_CALL_FRAME = 16 * 1024 * 1024  # a call's arguments, from an authenticated client
DEFAULT_MAX_REPLY_FRAME = 256 * 1024 * 1024  # a result, from a server that proved the secret


class FrameKind(enum.IntEnum):
    HELLO = 1
    AUTH = 2
    WELCOME = 3
    CALL = 16
    REPLY = 17
    REFUSED = 18


class OutcomeKind(enum.IntEnum):
    """How a call ended (the numbers of AMBROSIA's return types); the value is in the
    method's codec (``binding/codec.py``)."""

    VALUE = 1
    NO_VALUE = 2  # the handler returned None: no bytes
    EXCEPTION = 3


class RefusalReason(enum.IntEnum):
    """Why a call was refused without running (a refusal is never stored)."""

    UNKNOWN_METHOD = 1  # the service has no @rpc method with that id
    KEY_REUSED = 2  # the key names a call of another method


_KINDS = frozenset(int(k) for k in FrameKind)
_OUTCOMES = frozenset(int(k) for k in OutcomeKind)
_REASONS = frozenset(int(r) for r in RefusalReason)


@attrs.frozen
class Outcome:
    """A finished call's result as the client gets it: also what the key table keeps."""

    kind: OutcomeKind
    value: bytes = b""


@attrs.frozen
class Refusal:
    reason: RefusalReason
    message: str


@attrs.frozen
class ServiceInfo:
    """What WELCOME tells an authenticated client about the service."""

    instance: str
    service: str
    max_call_frame: int = DEFAULT_MAX_CALL_FRAME


@attrs.frozen
class RawFrame:
    """A frame as read: its kind byte, body, number on the connection and stream offset."""

    kind: int
    body: bytes
    index: int
    offset: int


@attrs.frozen
class Call:
    request_id: int
    key: bytes
    method_id: int
    args: bytes


@attrs.frozen
class Reply:
    request_id: int
    answer: Outcome | Refusal


def encode_frame(kind: FrameKind, *parts: bytes) -> bytes:
    """``u32 length | u8 kind | parts...``."""
    size = 1 + sum(len(p) for p in parts)
    return HEADER.pack(size, kind) + b"".join(parts)


class FrameReader:
    """Splits a byte stream into frames; ``limit`` bounds a frame's declared length."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._offset = 0  # stream offset of _buf[0]
        self._frames = 0

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes) -> None:
        self._buf += data

    def next_frame(self) -> RawFrame | None:
        """The next whole frame, or None until more bytes come.

        Raises :class:`IngressProtocolError` for a length of 0 or over :attr:`limit`.
        """
        buf = self._buf
        if len(buf) < 4:
            return None
        (size,) = _U32.unpack_from(buf)
        if size == 0 or size > self.limit:
            raise IngressProtocolError(
                f"a frame of declared length {size}: the limit here is 1 to {self.limit}",
                frame=self._frames,
                offset=self._offset,
            )
        if len(buf) < 4 + size:
            return None
        frame = RawFrame(buf[4], bytes(buf[5 : 4 + size]), self._frames, self._offset)
        del buf[: 4 + size]
        self._offset += 4 + size
        self._frames += 1
        return frame


def _error(frame: RawFrame, what: str, at: int = 0) -> IngressProtocolError:
    """An error in ``frame``'s body at body offset ``at`` (stream offset computed)."""
    return IngressProtocolError(what, frame=frame.index, offset=frame.offset + HEADER.size + at)


def _expect(frame: RawFrame, kind: FrameKind) -> None:
    if frame.kind != kind:
        name = FrameKind(frame.kind).name if frame.kind in _KINDS else str(frame.kind)
        raise IngressProtocolError(
            f"expected a {kind.name} frame (kind {int(kind)}), got kind {name}",
            frame=frame.index,
            offset=frame.offset + 4,
        )


def _magic(frame: RawFrame, kind: FrameKind, size: int) -> None:
    _expect(frame, kind)
    if frame.body[: len(MAGIC)] != MAGIC:
        raise _error(
            frame, f"{kind.name} starts with {frame.body[:8]!r}, not {MAGIC!r}: not an ingress"
        )
    if len(frame.body) != size:
        raise _error(frame, f"a {kind.name} body of {len(frame.body)} bytes, not {size}")


def decode_hello(frame: RawFrame) -> bytes:
    """The server's nonce."""
    _magic(frame, FrameKind.HELLO, HELLO_BODY)
    return frame.body[len(MAGIC) :]


def decode_auth(frame: RawFrame) -> tuple[bytes, bytes]:
    """The client's nonce and proof."""
    _magic(frame, FrameKind.AUTH, AUTH_BODY)
    nonce_end = len(MAGIC) + NONCE_SIZE
    return frame.body[len(MAGIC) : nonce_end], frame.body[nonce_end:]


def encode_welcome_info(info: ServiceInfo) -> bytes:
    """The part of WELCOME after the server's proof (the proof covers it)."""
    out = bytearray()
    for name, what in ((info.instance, "instance"), (info.service, "service")):
        raw = name.encode()
        if len(raw) > 255:
            raise ValueError(f"the {what} name {name!r} is longer than 255 bytes")
        out += bytes([len(raw)]) + raw
    return bytes(out + _U32.pack(info.max_call_frame))


def decode_welcome_info(frame: RawFrame, at: int) -> ServiceInfo:
    """The service's description in a WELCOME body, from body offset ``at``."""
    body = frame.body
    names = []
    for what in ("instance", "service"):
        if at >= len(body):
            raise _error(frame, f"WELCOME ends before the {what} name's length", at)
        n = body[at]
        raw = body[at + 1 : at + 1 + n]
        if len(raw) != n:
            raise _error(frame, f"WELCOME's {what} name runs past the frame ({n} bytes)", at)
        try:
            names.append(raw.decode())
        except UnicodeDecodeError as exc:
            raise _error(frame, f"WELCOME's {what} name is not UTF-8 ({exc.reason})", at) from None
        at += 1 + n
    if len(body) - at != _U32.size:
        raise _error(frame, f"WELCOME has {len(body) - at} bytes after the names, not 4", at)
    (limit,) = _U32.unpack_from(body, at)
    return ServiceInfo(names[0], names[1], limit)


def call_frame_length(key_size: int, args_size: int, tag_size: int) -> int:
    """The length field of a CALL frame with this key, these arguments and a tag."""
    return 1 + _CALL_HEAD.size + key_size + _METHOD.size + args_size + tag_size


def encode_call_body(request_id: int, key: bytes, method_id: int, args: bytes) -> list[bytes]:
    if not 1 <= len(key) <= MAX_KEY_SIZE:
        raise ValueError(f"an idempotency key of {len(key)} bytes: it needs 1 to {MAX_KEY_SIZE}")
    return [_CALL_HEAD.pack(request_id, len(key)), key, _METHOD.pack(method_id), args]


def decode_call(frame: RawFrame, body_end: int) -> Call:
    """A CALL whose body (without its tag) is ``frame.body[:body_end]``."""
    _expect(frame, FrameKind.CALL)
    body = frame.body
    if body_end < _CALL_HEAD.size:
        raise _error(frame, f"a CALL of {body_end} bytes is too short for its request id and key")
    request_id, key_size = _CALL_HEAD.unpack_from(body)
    if key_size == 0:
        raise _error(frame, "a CALL with an empty idempotency key", 4)
    method_at = _CALL_HEAD.size + key_size
    if body_end < method_at + _METHOD.size:
        raise _error(
            frame, f"a CALL of {body_end} bytes ends inside its {key_size}-byte key or method id", 4
        )
    (method_id,) = _METHOD.unpack_from(body, method_at)
    return Call(
        request_id,
        body[_CALL_HEAD.size : method_at],
        method_id,
        body[method_at + _METHOD.size : body_end],
    )


def encode_reply_body(request_id: int, outcome: Outcome) -> list[bytes]:
    return [_REPLY_HEAD.pack(request_id, outcome.kind), outcome.value]


def decode_reply(frame: RawFrame, body_end: int) -> Reply:
    _expect(frame, FrameKind.REPLY)
    if body_end < _REPLY_HEAD.size:
        raise _error(frame, f"a REPLY of {body_end} bytes is too short for its head")
    request_id, kind = _REPLY_HEAD.unpack_from(frame.body)
    if kind not in _OUTCOMES:
        raise _error(frame, f"a REPLY with outcome {kind}: not one of {sorted(_OUTCOMES)}", 4)
    value = frame.body[_REPLY_HEAD.size : body_end]
    if kind == OutcomeKind.NO_VALUE and value:
        raise _error(frame, f"a NO_VALUE REPLY carries {len(value)} bytes", _REPLY_HEAD.size)
    return Reply(request_id, Outcome(OutcomeKind(kind), value))


def encode_refused_body(request_id: int, refusal: Refusal) -> list[bytes]:
    return [_REPLY_HEAD.pack(request_id, refusal.reason), refusal.message.encode()]


def decode_refused(frame: RawFrame, body_end: int) -> Reply:
    _expect(frame, FrameKind.REFUSED)
    if body_end < _REPLY_HEAD.size:
        raise _error(frame, f"a REFUSED of {body_end} bytes is too short for its head")
    request_id, reason = _REPLY_HEAD.unpack_from(frame.body)
    if reason not in _REASONS:
        raise _error(frame, f"a REFUSED with unknown reason {reason}", 4)
    try:
        message = frame.body[_REPLY_HEAD.size : body_end].decode()
    except UnicodeDecodeError as exc:
        raise _error(frame, f"a REFUSED message that is not UTF-8 ({exc.reason})", 5) from None
    return Reply(request_id, Refusal(RefusalReason(reason), message))
