"""Both ends of an ingress connection, sans-IO: the handshake, the frame tags, the calls.

The handshake is the authenticated channel's (:mod:`ambrosia_py.auth`) with the server as
challenger and the client as responder (:data:`INGRESS_LABELS`); it proves the cluster
secret ``S`` (the links' secret, ``docs/security.md``) both ways, HMAC-SHA256 over fresh
nonces from both sides (``H`` is HMAC-SHA256)::

    HELLO    server -> client   "AMBINGR1" | Ns
    AUTH     client -> server   "AMBINGR1" | Nc | H(S, "ambrosia-ingress-v1 client" | T)
    WELCOME  server -> client   H(S, "ambrosia-ingress-v1 server" | T | info) | info

with ``T = "AMBINGR1" | Ns | Nc`` (the channel's ``head | Nc | context | Nr``, the head
being the magic and the context empty). The server sends nothing but HELLO (random
bytes) until AUTH checks out, and closes without another byte if it does not: a client
without the secret gets nothing and runs nothing, and nothing it sends is decoded past
the fixed-size AUTH. The client checks WELCOME's proof before it sends a call (its
arguments go only to a holder of the secret) and before it decodes anything the server
sends.

Then each direction has its key, ``K = H(S, "ambrosia-ingress-v1 key client->server" |
T)`` and ``"... key server->client"``, and every later frame's body ends in a 16-byte
tag: the first half of ``H(K, u64 counter | u8 kind | body)``, the counter numbering the
frames of that direction from 0. A frame injected, altered, dropped, replayed or
reordered fails its tag and closes the connection. The labels differ from the links'
(``ambrosia-link-v1``), so neither protocol's proofs are good for the other.
"""

from __future__ import annotations

import enum
from typing import Final

from ..auth import (
    MIN_SECRET_SIZE,
    TAG_SIZE,
    Challenge,
    Channel,
    ChannelError,
    Confirm,
    Handshake,
    HandshakeState,
    Labels,
    MessageKind,
    Response,
    Role,
)
from .errors import AuthenticationError, IngressProtocolError
from .frames import (
    DEFAULT_MAX_REPLY_FRAME,
    MAGIC,
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
    "INGRESS_LABELS",
    "MIN_SECRET_SIZE",
    "TAG_SIZE",
    "ClientConnection",
    "ConnectionState",
    "ServerConnection",
]

INGRESS_LABELS: Final = Labels(
    domain=b"ambrosia-ingress-v1",
    head=MAGIC,
    challenger="server",
    responder="client",
    frames="after the handshake",
)
"""The channel's labels on the ingress: the server challenges, the client responds."""


class ConnectionState(enum.Enum):
    """Where a connection is. The server goes AWAIT_AUTH -> OPEN, the client
    AWAIT_HELLO -> AWAIT_WELCOME -> OPEN; either may end FAILED (then it takes nothing)."""

    AWAIT_HELLO = "await-hello"
    AWAIT_AUTH = "await-auth"
    AWAIT_WELCOME = "await-welcome"
    OPEN = "open"
    FAILED = "failed"


# The channel's handshake states as each end of the ingress waits in them (the server
# never rests in START or RESPONDED, the client never in CHALLENGED).
_STATE: Final = {
    HandshakeState.START: ConnectionState.AWAIT_HELLO,
    HandshakeState.CHALLENGED: ConnectionState.AWAIT_AUTH,
    HandshakeState.RESPONDED: ConnectionState.AWAIT_WELCOME,
    HandshakeState.CONFIRMED: ConnectionState.OPEN,
    HandshakeState.FAILED: ConnectionState.FAILED,
}
_KIND_BYTE: Final = tuple(bytes([kind]) for kind in range(256))  # a tag's header: u8 kind


def _seal(channel: Channel, kind: FrameKind, parts: list[bytes]) -> bytes:
    """The whole frame: ``parts`` as its body, then the tag."""
    return encode_frame(kind, *parts, channel.tag(_KIND_BYTE[kind], parts))


def _open(channel: Channel, frame: RawFrame) -> int:
    """Check ``frame``'s tag; return where its body ends (where the tag starts)."""
    try:
        return len(channel.check(_KIND_BYTE[frame.kind], frame.body))
    except ChannelError as exc:
        raise IngressProtocolError(exc.reason, frame=frame.index, offset=frame.offset) from None


def _refused(exc: ChannelError, frame: RawFrame) -> AuthenticationError:
    return AuthenticationError(exc.reason, frame=frame.index, offset=frame.offset)


class ServerConnection:
    """The server's end: HELLO goes out at once; calls come in once AUTH checked out.

    Feed bytes to :meth:`receive_data` (it returns the calls they completed) and write
    :meth:`data_to_send` after each step. Any error leaves the connection FAILED: close it.
    """

    def __init__(self, secret: bytes, info: ServiceInfo, *, nonce: bytes | None = None) -> None:
        self._info = info
        self._handshake = Handshake(
            INGRESS_LABELS, Role.CHALLENGER, secret, nonce=nonce, info=encode_welcome_info(info)
        )
        hello = self._handshake.start()
        self._reader = FrameReader(PRE_AUTH_FRAME_LIMIT)
        self._out: list[bytes] = [encode_frame(FrameKind.HELLO, INGRESS_LABELS.head, hello.nonce)]
        self._channel: Channel | None = None
        self.state = _STATE[self._handshake.state]

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
                    calls.append(decode_call(frame, _open(self._channel, frame)))
        except IngressProtocolError:
            self.state = ConnectionState.FAILED
            self._out = []
            raise
        return calls

    def _authenticate(self, frame: RawFrame) -> None:
        """AUTH, the one frame the handshake's table lets the server receive (RESPONSE)."""
        nonce, proof = decode_auth(frame)
        try:
            welcome = self._handshake.receive(Response(nonce, proof))
        except ChannelError as exc:
            raise _refused(exc, frame) from None
        self._out.append(encode_frame(FrameKind.WELCOME, welcome.proof, welcome.info))
        self._channel = self._handshake.channel()
        self._reader.limit = self._info.max_call_frame
        self.state = _STATE[self._handshake.state]

    def reply(self, request_id: int, answer: Outcome | Refusal) -> None:
        """Queue the answer to call ``request_id``: its outcome, or a refusal."""
        if self._channel is None or self.state is not ConnectionState.OPEN:
            raise IngressProtocolError(f"no reply in state {self.state.name}")
        if isinstance(answer, Outcome):
            body = encode_reply_body(request_id, answer)
            self._out.append(_seal(self._channel, FrameKind.REPLY, body))
        else:
            body = encode_refused_body(request_id, answer)
            self._out.append(_seal(self._channel, FrameKind.REFUSED, body))


class ClientConnection:
    """The client's end: it answers HELLO, checks WELCOME, then sends calls."""

    def __init__(
        self,
        secret: bytes,
        *,
        nonce: bytes | None = None,
        max_reply_frame: int = DEFAULT_MAX_REPLY_FRAME,
    ) -> None:
        self._handshake = Handshake(INGRESS_LABELS, Role.RESPONDER, secret, nonce=nonce)
        self._max_reply_frame = max_reply_frame
        self._reader = FrameReader(PRE_AUTH_FRAME_LIMIT)
        self._out: list[bytes] = []
        self._channel: Channel | None = None
        self.info: ServiceInfo | None = None
        self.state = _STATE[self._handshake.state]

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
                if self._channel is None:
                    # HELLO or WELCOME: the one the handshake's table lets it receive now.
                    if self._handshake.expecting is MessageKind.CHALLENGE:
                        self._answer_hello(frame)
                    else:
                        events.append(self._welcome(frame))
                else:
                    end = _open(self._channel, frame)
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
        """HELLO (the CHALLENGE): AUTH (the RESPONSE) goes back."""
        try:
            auth = self._handshake.receive(Challenge(decode_hello(frame)))
        except ChannelError as exc:
            raise _refused(exc, frame) from None
        self._out.append(encode_frame(FrameKind.AUTH, INGRESS_LABELS.head, auth.nonce, auth.proof))
        self._reader.limit = WELCOME_FRAME_LIMIT
        self.state = _STATE[self._handshake.state]

    def _welcome(self, frame: RawFrame) -> ServiceInfo:
        """WELCOME (the CONFIRM): the server proved the secret, and says what it serves."""
        if frame.kind != FrameKind.WELCOME or len(frame.body) < PROOF_SIZE:
            raise AuthenticationError(
                f"expected WELCOME (kind {int(FrameKind.WELCOME)}, {PROOF_SIZE}+ bytes), got "
                f"kind {frame.kind} of {len(frame.body)} bytes",
                frame=frame.index,
                offset=frame.offset,
            )
        try:
            self._handshake.receive(Confirm(frame.body[:PROOF_SIZE], frame.body[PROOF_SIZE:]))
        except ChannelError as exc:
            raise _refused(exc, frame) from None
        welcomed = decode_welcome_info(frame, PROOF_SIZE)
        self._channel = self._handshake.channel()
        self._reader.limit = self._max_reply_frame
        self.info = welcomed
        self.state = _STATE[self._handshake.state]
        return welcomed

    def call(self, request_id: int, key: bytes, method_id: int, args: bytes) -> None:
        """Queue a CALL; only once the server proved the secret."""
        if self._channel is None or self.state is not ConnectionState.OPEN:
            raise IngressProtocolError(f"no call in state {self.state.name}")
        body = encode_call_body(request_id, key, method_id, args)
        self._out.append(_seal(self._channel, FrameKind.CALL, body))
