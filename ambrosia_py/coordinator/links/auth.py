"""Authentication of links between coordinators: the wire form of the authenticated
channel (:mod:`ambrosia_py.auth`) on a link, and the C twin of a small frame's tag.

Right after the ConnectPacket exchange, before a peer's hello or any call is decoded,
both ends prove they hold the cluster's secret ``S``: the channel's handshake with the
dialer as challenger and the acceptor as responder (:data:`LINK_LABELS`). Each message
is a flow frame to :data:`AUTH_TOKEN` with a fixed size; every integer is little-endian
and ``H(x)`` is SHA-256::

    CHALLENGE  dialer -> acceptor  105 bytes:
        "AMBAUTH1" | 0x01 | dialer nonce (32) | H(dialer name) (32) | H(acceptor name) (32)
    RESPONSE   acceptor -> dialer   73 bytes:
        "AMBAUTH1" | 0x02 | acceptor nonce (32) | HMAC(S, "ambrosia-link-v1 acceptor" | T)
    CONFIRM    dialer -> acceptor   41 bytes:
        "AMBAUTH1" | 0x03 | HMAC(S, "ambrosia-link-v1 dialer" | T)

``T``, the transcript, is the whole CHALLENGE followed by the acceptor's nonce: the
channel's ``head | Nc | context | Nr`` with the head ``"AMBAUTH1" | 0x01`` and both
names' digests as the context. The acceptor checks the name it was dialed by before
answering (``H(acceptor name)`` must be its own), the dialer checks the acceptor's proof
over the name it meant to dial: a listener without the secret learns nothing and gets
no output.

The rest of the connection is bound to the handshake: each direction has its own key,
``HMAC(S, "ambrosia-link-v1 key dialer->acceptor" | T)`` and ``"... key
acceptor->dialer"``, and every later frame's message ends in a 16-byte tag, the first
half of ``HMAC-SHA256(key, u64 frame counter | token | payload)`` (counters from 0 per
direction). A frame injected, dropped, replayed or reordered on the connection fails its
tag. The link hello is the first such frame; its sender name must hash to the dialer's
name in the CHALLENGE, so the sender a hello names is the one that authenticated.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Sequence
from typing import Final

from ... import accel
from ...auth import (
    NONCE_SIZE,
    PROOF_SIZE,
    TAG_SIZE,
    Challenge,
    Channel,
    ChannelError,
    Confirm,
    Handshake,
    HandshakeState,
    KeyedMac,
    Labels,
    ProofError,
    Response,
    same_digest,
)
from ...auth import Role as _Side
from ...flow import WELL_KNOWN_FIRST, Token
from ...flow.constants import Buffer
from .protocol import LinkError

__all__ = [
    "AUTH_MAGIC",
    "AUTH_TOKEN",
    "CHALLENGE_SIZE",
    "CONFIRM_SIZE",
    "LINK_LABELS",
    "NONCE_SIZE",
    "RESPONSE_SIZE",
    "TAG_SIZE",
    "HandshakeState",
    "KeyedMac",
    "LinkAuthError",
    "LinkChannel",
    "LinkHandshake",
    "MessageKind",
    "Role",
    "name_digest",
]

AUTH_MAGIC = b"AMBAUTH1"
# The flow endpoint handshake messages go to: well-known, next to the link endpoint.
AUTH_TOKEN = Token(WELL_KNOWN_FIRST, 0x414D_4241)  # "AMBA"
DIGEST_SIZE = 32  # SHA-256, of an instance name
_HEAD = len(AUTH_MAGIC) + 1
CHALLENGE_SIZE = _HEAD + NONCE_SIZE + 2 * DIGEST_SIZE  # 105
RESPONSE_SIZE = _HEAD + NONCE_SIZE + PROOF_SIZE  # 73
CONFIRM_SIZE = _HEAD + PROOF_SIZE  # 41


class MessageKind(enum.IntEnum):
    """The byte after the magic in each handshake message."""

    CHALLENGE = 1
    RESPONSE = 2
    CONFIRM = 3


LINK_LABELS: Final = Labels(
    domain=b"ambrosia-link-v1",
    head=AUTH_MAGIC + bytes([MessageKind.CHALLENGE]),
    challenger="dialer",
    responder="acceptor",
    frames="on the link",
)
"""The channel's labels on a link: the dialer challenges, the acceptor responds."""

_SIZES: Final = {
    MessageKind.CHALLENGE: CHALLENGE_SIZE,
    MessageKind.RESPONSE: RESPONSE_SIZE,
    MessageKind.CONFIRM: CONFIRM_SIZE,
}
# Where each message's proof starts: what a ProofError's offset names.
_PROOF_AT: Final = {MessageKind.RESPONSE: _HEAD + NONCE_SIZE, MessageKind.CONFIRM: _HEAD}

# The C twin of a small frame's flow and tag work (``_clink.c``: OpenSSL's HMAC and
# libxxhash's XXH3 called from C), or None.
_clink = accel.load("ambrosia_py.coordinator.links._clink")


class LinkAuthError(LinkError):
    """A peer failed the link handshake or a frame's tag: close the connection."""


class Role(enum.Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


_SIDE: Final = {Role.DIALER: _Side.CHALLENGER, Role.ACCEPTOR: _Side.RESPONDER}


def name_digest(name: str) -> bytes:
    """SHA-256 of an instance name's UTF-8 bytes: how the handshake names instances."""
    return hashlib.sha256(name.encode()).digest()


def _encode(message: Challenge | Response | Confirm) -> bytes:
    """A handshake message as the link sends it (see the module)."""
    match message:
        case Challenge():
            return LINK_LABELS.head + message.nonce + message.context
        case Response():
            return AUTH_MAGIC + bytes([MessageKind.RESPONSE]) + message.nonce + message.proof
        case Confirm():
            return AUTH_MAGIC + bytes([MessageKind.CONFIRM]) + message.proof


class LinkHandshake:
    """One side of the link handshake: messages in, messages out; no I/O, no clock.

    The dialer knows both names (its own and the instance it dials); the acceptor knows
    its own, and learns the digest of the dialer's from the CHALLENGE. ``nonce`` is for
    tests; by default a fresh one is drawn from :mod:`secrets`. The order of the
    messages is the channel's table (:mod:`ambrosia_py.auth.states`); this checks their
    layout and the dialed name, and the channel the proofs.
    """

    def __init__(
        self,
        role: Role,
        secret: bytes,
        local_name: str,
        peer_name: str | None = None,
        *,
        nonce: bytes | None = None,
    ) -> None:
        if role is Role.DIALER and peer_name is None:
            raise ValueError("the dialer must name the instance it dials")
        self.role = role
        self._core = Handshake(LINK_LABELS, _SIDE[role], secret, nonce=nonce)
        self._local = local_name
        self._peer_name = peer_name
        self._peer_digest: bytes | None = None

    @property
    def state(self) -> HandshakeState:
        return self._core.state

    @property
    def done(self) -> bool:
        return self._core.done

    @property
    def peer_digest(self) -> bytes | None:
        """SHA-256 of the peer's instance name: the dialer's, once its CHALLENGE arrived
        (the acceptor); the dialed instance's (the dialer)."""
        return self._peer_digest

    def start(self) -> bytes:
        """The dialer's CHALLENGE, the first handshake message."""
        if self._peer_name is None:
            raise LinkAuthError(f"the {self.role.value} does not send the CHALLENGE")
        peer_digest = name_digest(self._peer_name)
        try:
            challenge = self._core.start(name_digest(self._local) + peer_digest)
        except ChannelError as exc:
            raise LinkAuthError(f"the handshake cannot start: {exc.reason}") from None
        self._peer_digest = peer_digest
        return _encode(challenge)

    def receive(self, message: Buffer) -> bytes | None:
        """The peer's next handshake message; returns ours to send back, if any.

        Raises :class:`LinkAuthError` naming what was wrong (and the handshake stays
        failed): a message of the wrong kind, size or magic, a CHALLENGE for another
        instance, a proof that does not match (the peer does not hold the secret).
        """
        step = self._core.expecting
        if step is None:
            raise LinkAuthError(f"a handshake message in state {self._core.state.name}")
        kind = MessageKind[step.name]
        try:
            data = self._check(bytes(message), kind)
            reply = self._core.receive(self._decode(kind, data))
        except LinkAuthError:
            self._core.fail()
            raise
        except ProofError as exc:
            reason = exc.reason
            if kind is MessageKind.RESPONSE:
                reason += f", or it is not {self._peer_name!r}"
            raise LinkAuthError(reason, offset=_PROOF_AT[kind]) from None
        except ChannelError as exc:
            raise LinkAuthError(exc.reason) from None
        return None if reply is None else _encode(reply)

    def _check(self, data: bytes, kind: MessageKind) -> bytes:
        if data[: len(AUTH_MAGIC)] != AUTH_MAGIC:
            raise LinkAuthError(
                f"expected a link handshake {kind.name}, got {data[:8]!r}...: wrong magic",
                offset=0,
            )
        if len(data) < _HEAD or data[len(AUTH_MAGIC)] != kind:
            got = data[len(AUTH_MAGIC)] if len(data) >= _HEAD else None
            raise LinkAuthError(
                f"expected a link handshake {kind.name} (kind {int(kind)}), got kind {got}",
                offset=len(AUTH_MAGIC),
            )
        if len(data) != _SIZES[kind]:
            raise LinkAuthError(
                f"a link handshake {kind.name} of {len(data)} bytes, not {_SIZES[kind]}",
                offset=0,
            )
        return data

    def _decode(self, kind: MessageKind, data: bytes) -> Challenge | Response | Confirm:
        nonce_end = _HEAD + NONCE_SIZE
        if kind is MessageKind.CHALLENGE:  # the acceptor's: was it dialed by its name?
            dialed = data[nonce_end + DIGEST_SIZE :]
            if not same_digest(dialed, name_digest(self._local)):
                raise LinkAuthError(
                    f"the peer dialed another instance (name digest {dialed.hex()[:16]}...), "
                    f"but this is {self._local!r}",
                    offset=nonce_end + DIGEST_SIZE,
                )
            self._peer_digest = data[nonce_end : nonce_end + DIGEST_SIZE]
            return Challenge(data[_HEAD:nonce_end], data[nonce_end:])
        if kind is MessageKind.RESPONSE:
            return Response(data[_HEAD:nonce_end], data[nonce_end:])
        return Confirm(data[_HEAD:])

    def channel(self) -> LinkChannel:
        """The MACs for the rest of the connection; only once the handshake is done."""
        try:
            send_key, receive_key = self._core.keys()
        except ChannelError as exc:
            raise LinkAuthError(exc.reason) from None
        return LinkChannel(send_key=send_key, receive_key=receive_key)


class LinkChannel(Channel):
    """The channel's tags on a link, the flow token bound into each (its 16 bytes are
    the tag's header), with the C twin of a small frame's whole flow and tag work."""

    def __init__(self, *, send_key: bytes, receive_key: bytes) -> None:
        super().__init__(LINK_LABELS, send_key=send_key, receive_key=receive_key)
        # The keyed contexts of the C twin of the frame work (open_frame, seal_frame).
        self._send_state = _clink.mac_state(send_key) if _clink is not None else None
        self._receive_state = _clink.mac_state(receive_key) if _clink is not None else None

    def open_frame(self, data: bytes, token: Token, max_length: int) -> bytes | None:
        """The payload of ``data`` when ``data`` is exactly one whole checksummed flow
        frame (its length at most ``max_length``) to ``token`` whose tag is the next one
        due; None, having changed nothing, for anything else (or without the C twin).

        The fast path of a small frame's receipt, in C: the flow reader and :meth:`open`
        then read whatever it does not take, and raise what is wrong with it.
        """
        if self._receive_state is None:
            return None
        assert _clink is not None
        payload: bytes | None = _clink.open_frame(
            data, max_length, self._receive_state, self.received, token.first, token.second
        )
        if payload is not None:
            self.received += 1
        return payload

    def seal_frame(self, token: Token, parts: tuple[bytes, ...], max_length: int) -> bytes | None:
        """The whole checksummed flow frame of the message ``parts`` and its tag, to
        ``token``; None, having changed nothing, where the C twin is not built or the
        frame would be longer than ``max_length`` (then :meth:`seal` and the flow's
        ``send``, which raise that). The same bytes as those two."""
        if self._send_state is None or not max_length:
            return None
        assert _clink is not None
        frame: bytes | None = _clink.seal_frame(
            parts, max_length, self._send_state, self.sent, token.first, token.second
        )
        if frame is not None:
            self.sent += 1
        return frame

    def seal(self, token: Token, parts: Sequence[Buffer]) -> bytes:
        """The tag to append to the message made of ``parts``, sent next to ``token``."""
        return self.tag(token.encode(), parts)

    def open(self, token: Token, message: bytes) -> memoryview:
        """The payload of the next received frame's message, once its tag checks out."""
        try:
            return self.check(token.encode(), message)
        except ChannelError as exc:
            raise LinkAuthError(exc.reason) from None
