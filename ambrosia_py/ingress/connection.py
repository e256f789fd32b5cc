"""Both ends of an ingress connection, sans-IO: the handshake, the frame tags, the calls.

The handshake proves the cluster secret ``S`` (the links' secret, ``docs/security.md``)
both ways, HMAC-SHA256 over fresh nonces from both sides (``H`` is HMAC-SHA256)::

    HELLO    server -> client   "AMBINGR1" | Ns
    AUTH     client -> server   "AMBINGR1" | Nc | H(S, "ambrosia-ingress-v1 client" | T)
    WELCOME  server -> client   H(S, "ambrosia-ingress-v1 server" | T | info) | info

with ``T = "AMBINGR1" | Ns | Nc``. The server sends nothing but HELLO (random bytes)
until AUTH checks out, and closes without another byte if it does not: a client without
the secret gets nothing and runs nothing, and nothing it sends is decoded past the
fixed-size AUTH. The client checks WELCOME's proof before it sends a call (its arguments
go only to a holder of the secret) and before it decodes anything the server sends.

Then each direction has its key, ``K = H(S, "ambrosia-ingress-v1 key client->server" |
T)`` and ``"... key server->client"``, and every later frame's body ends in a 16-byte
tag: the first half of ``H(K, u64 counter | u8 kind | body)``, the counter numbering the
frames of that direction from 0. A frame injected, altered, dropped, replayed or
reordered fails its tag and closes the connection. The labels differ from the links'
(``ambrosia-link-v1``), so neither protocol's proofs are good for the other.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct

from .errors import AuthenticationError, IngressProtocolError
from .frames import (
    DEFAULT_MAX_REPLY_FRAME,
    MAGIC,
    NONCE_SIZE,
    PRE_AUTH_FRAME_LIMIT,
    PROOF_SIZE,
    WELCOME_FRAME_LIMIT,
    Call,
    FrameKind,
    FrameReader,
    Outcome,
    RawFrame,
    Refusal,
    Reply,
    ServiceInfo,
    decode_auth,
    decode_call,
    decode_hello,
    decode_refused,
    decode_reply,
    decode_welcome_info,
    encode_call_body,
    encode_frame,
    encode_refused_body,
    encode_reply_body,
    encode_welcome_info,
)

__all__ = [
    "MIN_SECRET_SIZE",
    "TAG_SIZE",
    "ClientConnection",
    "ConnectionState",
    "ServerConnection",
]

TAG_SIZE = 16  # HMAC-SHA256 truncated to 128 bits (as RFC 4868), as on links
MIN_SECRET_SIZE = 16
_CLIENT_PROOF = b"ambrosia-ingress-v1 client"
_SERVER_PROOF = b"ambrosia-ingress-v1 server"
_KEY_TO_SERVER = b"ambrosia-ingress-v1 key client->server"
_KEY_TO_CLIENT = b"ambrosia-ingress-v1 key server->client"
_COUNTER = struct.Struct("<Q")


def _mac(key: bytes, *parts: bytes | memoryview) -> bytes:
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(part)
    return h.digest()


def _check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_SIZE:
        raise ValueError(f"a secret of {len(secret)} bytes: at least {MIN_SECRET_SIZE} are needed")


class ConnectionState(enum.Enum):
    """Where a connection is. The server goes AWAIT_AUTH -> OPEN, the client
    AWAIT_HELLO -> AWAIT_WELCOME -> OPEN; either may end FAILED (then it takes nothing)."""

    AWAIT_HELLO = "await-hello"
    AWAIT_AUTH = "await-auth"
    AWAIT_WELCOME = "await-welcome"
    OPEN = "open"
    FAILED = "failed"


class _Channel:
    """Tags after the handshake: one key and one frame counter per direction.

    Each direction's HMAC is keyed once and copied per frame: a copy costs about half
    of keying a new one, which is most of a small call's cost.
    """

    def __init__(self, send_key: bytes, receive_key: bytes) -> None:
        self._send = hmac.new(send_key, digestmod=hashlib.sha256)
        self._receive = hmac.new(receive_key, digestmod=hashlib.sha256)
        self._sent = 0
        self._received = 0

    def seal(self, kind: FrameKind, parts: list[bytes]) -> bytes:
        """The whole frame: ``parts`` as its body, then the tag."""
        h = self._send.copy()
        h.update(_COUNTER.pack(self._sent) + bytes([kind]))
        for part in parts:
            h.update(part)
        self._sent += 1
        return encode_frame(kind, *parts, h.digest()[:TAG_SIZE])

    def open(self, frame: RawFrame) -> int:
        """Check ``frame``'s tag; return where its body ends (where the tag starts)."""
        end = len(frame.body) - TAG_SIZE
        if end < 0:
            raise IngressProtocolError(
                f"a frame of {len(frame.body)} bytes is too short for its {TAG_SIZE}-byte tag",
                frame=frame.index,
                offset=frame.offset,
            )
        body = memoryview(frame.body)
        h = self._receive.copy()
        h.update(_COUNTER.pack(self._received) + bytes([frame.kind]))
        h.update(body[:end])
        if not hmac.compare_digest(body[end:], h.digest()[:TAG_SIZE]):
            raise IngressProtocolError(
                f"frame {self._received} after the handshake fails its tag: altered, replayed, "
                "reordered or injected",
                frame=frame.index,
                offset=frame.offset,
            )
        self._received += 1
        return end


def _keys(secret: bytes, transcript: bytes) -> tuple[bytes, bytes]:
    """(client->server, server->client) keys."""
    return _mac(secret, _KEY_TO_SERVER, transcript), _mac(secret, _KEY_TO_CLIENT, transcript)


class ServerConnection:
    """The server's end: HELLO goes out at once; calls come in once AUTH checked out.

    Feed bytes to :meth:`receive_data` (it returns the calls they completed) and write
    :meth:`data_to_send` after each step. Any error leaves the connection FAILED: close it.
    """

    def __init__(self, secret: bytes, info: ServiceInfo, *, nonce: bytes | None = None) -> None:
        _check_secret(secret)
        nonce = secrets.token_bytes(NONCE_SIZE) if nonce is None else nonce
        if len(nonce) != NONCE_SIZE:
            raise ValueError(f"a nonce has {NONCE_SIZE} bytes, not {len(nonce)}")
        self._secret = secret
        self._info = info
        self._hello = MAGIC + nonce
        self._reader = FrameReader(PRE_AUTH_FRAME_LIMIT)
        self._out: list[bytes] = [encode_frame(FrameKind.HELLO, self._hello)]
        self._channel: _Channel | None = None
        self.state = ConnectionState.AWAIT_AUTH

    def data_to_send(self) -> bytes:
        out, self._out = b"".join(self._out), []
        return out

    def receive_data(self, data: bytes) -> list[Call]:
        """The calls ``data`` completes; raises :class:`IngressProtocolError` (or
        :class:`AuthenticationError`) naming the frame and offset of bad input."""
        if self.state is ConnectionState.FAILED:
            raise IngressProtocolError("the connection failed already")
        self._reader.feed(data)
        calls = []
        try:
            while (frame := self._reader.next_frame()) is not None:
                if self._channel is None:
                    self._authenticate(frame)
                else:
                    calls.append(decode_call(frame, self._channel.open(frame)))
        except IngressProtocolError:
            self.state = ConnectionState.FAILED
            self._out = []
            raise
        return calls

    def _authenticate(self, frame: RawFrame) -> None:
        nonce, proof = decode_auth(frame)
        transcript = self._hello + nonce
        if not hmac.compare_digest(proof, _mac(self._secret, _CLIENT_PROOF, transcript)):
            raise AuthenticationError(
                "the client's proof does not match: it does not hold this cluster's secret",
                frame=frame.index,
                offset=frame.offset,
            )
        info = encode_welcome_info(self._info)
        self._out.append(
            encode_frame(
                FrameKind.WELCOME, _mac(self._secret, _SERVER_PROOF, transcript, info), info
            )
        )
        to_server, to_client = _keys(self._secret, transcript)
        self._channel = _Channel(send_key=to_client, receive_key=to_server)
        self._reader.limit = self._info.max_call_frame
        self.state = ConnectionState.OPEN

    def reply(self, request_id: int, answer: Outcome | Refusal) -> None:
        """Queue the answer to call ``request_id``: its outcome, or a refusal."""
        if self._channel is None or self.state is not ConnectionState.OPEN:
            raise IngressProtocolError(f"no reply in state {self.state.name}")
        if isinstance(answer, Outcome):
            self._out.append(
                self._channel.seal(FrameKind.REPLY, encode_reply_body(request_id, answer))
            )
        else:
            self._out.append(
                self._channel.seal(FrameKind.REFUSED, encode_refused_body(request_id, answer))
            )


class ClientConnection:
    """The client's end: it answers HELLO, checks WELCOME, then sends calls."""

    def __init__(
        self,
        secret: bytes,
        *,
        nonce: bytes | None = None,
        max_reply_frame: int = DEFAULT_MAX_REPLY_FRAME,
    ) -> None:
        _check_secret(secret)
        self._nonce = secrets.token_bytes(NONCE_SIZE) if nonce is None else nonce
        if len(self._nonce) != NONCE_SIZE:
            raise ValueError(f"a nonce has {NONCE_SIZE} bytes, not {len(self._nonce)}")
        self._secret = secret
        self._max_reply_frame = max_reply_frame
        self._reader = FrameReader(PRE_AUTH_FRAME_LIMIT)
        self._out: list[bytes] = []
        self._transcript = b""
        self._channel: _Channel | None = None
        self.info: ServiceInfo | None = None
        self.state = ConnectionState.AWAIT_HELLO

    def data_to_send(self) -> bytes:
        out, self._out = b"".join(self._out), []
        return out

    def receive_data(self, data: bytes) -> list[ServiceInfo | Reply]:
        """What ``data`` completes: once the server proved the secret, its
        :class:`ServiceInfo` (once), then replies and refusals."""
        if self.state is ConnectionState.FAILED:
            raise IngressProtocolError("the connection failed already")
        self._reader.feed(data)
        events: list[ServiceInfo | Reply] = []
        try:
            while (frame := self._reader.next_frame()) is not None:
                if self.state is ConnectionState.AWAIT_HELLO:
                    self._answer_hello(frame)
                elif self.state is ConnectionState.AWAIT_WELCOME:
                    events.append(self._welcome(frame))
                else:
                    assert self._channel is not None
                    end = self._channel.open(frame)
                    if frame.kind == FrameKind.REFUSED:
                        events.append(decode_refused(frame, end))
                    else:
                        events.append(decode_reply(frame, end))
        except IngressProtocolError:
            self.state = ConnectionState.FAILED
            self._out = []
            raise
        return events

    def _answer_hello(self, frame: RawFrame) -> None:
        server_nonce = decode_hello(frame)
        self._transcript = MAGIC + server_nonce + self._nonce
        proof = _mac(self._secret, _CLIENT_PROOF, self._transcript)
        self._out.append(encode_frame(FrameKind.AUTH, MAGIC, self._nonce, proof))
        self._reader.limit = WELCOME_FRAME_LIMIT
        self.state = ConnectionState.AWAIT_WELCOME

    def _welcome(self, frame: RawFrame) -> ServiceInfo:
        if frame.kind != FrameKind.WELCOME or len(frame.body) < PROOF_SIZE:
            raise AuthenticationError(
                f"expected WELCOME (kind {int(FrameKind.WELCOME)}, {PROOF_SIZE}+ bytes), got "
                f"kind {frame.kind} of {len(frame.body)} bytes",
                frame=frame.index,
                offset=frame.offset,
            )
        proof, info = frame.body[:PROOF_SIZE], frame.body[PROOF_SIZE:]
        expected = _mac(self._secret, _SERVER_PROOF, self._transcript, info)
        if not hmac.compare_digest(proof, expected):
            raise AuthenticationError(
                "the server's proof does not match: it does not hold this cluster's secret",
                frame=frame.index,
                offset=frame.offset,
            )
        welcomed = decode_welcome_info(frame, PROOF_SIZE)
        to_server, to_client = _keys(self._secret, self._transcript)
        self._channel = _Channel(send_key=to_server, receive_key=to_client)
        self._reader.limit = self._max_reply_frame
        self.info = welcomed
        self.state = ConnectionState.OPEN
        return welcomed

    def call(self, request_id: int, key: bytes, method_id: int, args: bytes) -> None:
        """Queue a CALL; only once the server proved the secret."""
        if self._channel is None or self.state is not ConnectionState.OPEN:
            raise IngressProtocolError(f"no call in state {self.state.name}")
        self._out.append(
            self._channel.seal(FrameKind.CALL, encode_call_body(request_id, key, method_id, args))
        )
