"""Authentication of links between coordinators, sans-IO: the handshake and the MACs.

Right after the ConnectPacket exchange, before a peer's hello or any call is decoded,
both ends prove they hold the cluster's secret ``S`` (challenge-response, HMAC-SHA256
over fresh nonces from both sides and both instance names). Each handshake message is a
flow frame to :data:`AUTH_TOKEN` with a fixed size; every integer is little-endian and
``H(x)`` is SHA-256::

    CHALLENGE  dialer -> acceptor  105 bytes:
        "AMBAUTH1" | 0x01 | dialer nonce (32) | H(dialer name) (32) | H(acceptor name) (32)
    RESPONSE   acceptor -> dialer   73 bytes:
        "AMBAUTH1" | 0x02 | acceptor nonce (32) | HMAC(S, "acceptor" | T) (32)
    CONFIRM    dialer -> acceptor   41 bytes:
        "AMBAUTH1" | 0x03 | HMAC(S, "dialer" | T) (32)

``T``, the transcript, is the whole CHALLENGE followed by the acceptor's nonce. The
labels differ, so a proof cannot be reflected back to the side that made it; the nonces
are fresh, so a recorded handshake cannot be replayed. The acceptor checks the name it
was dialed by before answering (``H(acceptor name)`` must be its own), the dialer checks
the acceptor's proof over the name it meant to dial: a listener without the secret
learns nothing and gets no output.

The rest of the connection is bound to the handshake: each direction has its own key,
``HMAC(S, "key dialer->acceptor" | T)`` and ``HMAC(S, "key acceptor->dialer" | T)``, and
every later frame's message ends in a 16-byte tag, the first half of
``HMAC-SHA256(key, u64 frame counter | token | payload)`` (counters from 0 per
direction). A frame injected, dropped, replayed or reordered on the connection fails its
tag. The link hello is the first such frame; its sender name must hash to the dialer's
name in the CHALLENGE, so the sender a hello names is the one that authenticated.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence

from ... import accel
from ...flow import WELL_KNOWN_FIRST, Token
from ...flow.constants import Buffer
from .protocol import LinkError

__all__ = [
    "AUTH_MAGIC",
    "AUTH_TOKEN",
    "CHALLENGE_SIZE",
    "CONFIRM_SIZE",
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
NONCE_SIZE = 32
DIGEST_SIZE = 32  # SHA-256 and HMAC-SHA256
TAG_SIZE = 16  # the per-frame tag: HMAC-SHA256 truncated to 128 bits (as RFC 4868)
_HEAD = len(AUTH_MAGIC) + 1
CHALLENGE_SIZE = _HEAD + NONCE_SIZE + 2 * DIGEST_SIZE  # 105
RESPONSE_SIZE = _HEAD + NONCE_SIZE + DIGEST_SIZE  # 73
CONFIRM_SIZE = _HEAD + DIGEST_SIZE  # 41

_ACCEPTOR_PROOF = b"ambrosia-link-v1 acceptor"
_DIALER_PROOF = b"ambrosia-link-v1 dialer"
_KEY_TO_ACCEPTOR = b"ambrosia-link-v1 key dialer->acceptor"
_KEY_TO_DIALER = b"ambrosia-link-v1 key acceptor->dialer"
_COUNTER = struct.Struct("<Q")


# The C twin of a small frame's flow and tag work (``_clink.c``: OpenSSL's HMAC and
# libxxhash's XXH3 called from C), or None.
_clink = accel.load("ambrosia_py.coordinator.links._clink")


class LinkAuthError(LinkError):
    """A peer failed the link handshake or a frame's tag: close the connection."""


class MessageKind(enum.IntEnum):
    """The byte after the magic in each handshake message."""

    CHALLENGE = 1
    RESPONSE = 2
    CONFIRM = 3


_SIZES = {
    MessageKind.CHALLENGE: CHALLENGE_SIZE,
    MessageKind.RESPONSE: RESPONSE_SIZE,
    MessageKind.CONFIRM: CONFIRM_SIZE,
}


class Role(enum.Enum):
    DIALER = "dialer"
    ACCEPTOR = "acceptor"


class HandshakeState(enum.Enum):
    """Where a handshake is. The dialer goes START → AWAIT_RESPONSE → DONE, the
    acceptor AWAIT_CHALLENGE → AWAIT_CONFIRM → DONE; either may end in FAILED."""

    START = "start"
    AWAIT_CHALLENGE = "await-challenge"
    AWAIT_RESPONSE = "await-response"
    AWAIT_CONFIRM = "await-confirm"
    DONE = "done"
    FAILED = "failed"


_S = HandshakeState

# What each state expects from the peer, and where it goes after it.
_EXPECT: dict[HandshakeState, tuple[MessageKind, HandshakeState]] = {
    _S.AWAIT_CHALLENGE: (MessageKind.CHALLENGE, _S.AWAIT_CONFIRM),
    _S.AWAIT_RESPONSE: (MessageKind.RESPONSE, _S.DONE),
    _S.AWAIT_CONFIRM: (MessageKind.CONFIRM, _S.DONE),
}


def name_digest(name: str) -> bytes:
    """SHA-256 of an instance name's UTF-8 bytes: how the handshake names instances."""
    return hashlib.sha256(name.encode()).digest()


def _mac(key: bytes, *parts: Buffer) -> bytes:
    """HMAC-SHA256 of the parts, as one message."""
    return KeyedMac(key).digest(*parts)


class KeyedMac:
    """HMAC-SHA256 under one key, for every frame of a link direction: the standard
    library's (OpenSSL's HMAC), keyed once here; each tag is then a copy of the keyed
    state and a few updates, where a one-shot ``hmac.digest`` would set the key up again
    on every call and need the parts joined first.
    """

    __slots__ = ("_keyed",)

    def __init__(self, key: bytes) -> None:
        self._keyed = hmac.new(key, digestmod=hashlib.sha256)

    def digest(self, *parts: Buffer) -> bytes:
        """HMAC-SHA256 of the parts, as one message."""
        mac = self._keyed.copy()
        for part in parts:
            mac.update(part)
        return mac.digest()


class LinkHandshake:
    """One side of the handshake: messages in, messages out; no I/O, no clock.

    The dialer knows both names (its own and the instance it dials); the acceptor knows
    its own, and learns the digest of the dialer's from the CHALLENGE. ``nonce`` is for
    tests; by default a fresh one is drawn from :mod:`secrets`.
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
        if len(secret) < 16:
            raise ValueError(f"a link secret of {len(secret)} bytes: at least 16 are needed")
        if role is Role.DIALER and peer_name is None:
            raise ValueError("the dialer must name the instance it dials")
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        if len(self._nonce) != NONCE_SIZE:
            raise ValueError(f"a nonce has {NONCE_SIZE} bytes, not {len(self._nonce)}")
        self.role = role
        self._secret = secret
        self._local = local_name
        self._peer_name = peer_name
        self._state = _S.START if role is Role.DIALER else _S.AWAIT_CHALLENGE
        self._transcript = b""
        self._peer_digest: bytes | None = None

    @property
    def state(self) -> HandshakeState:
        return self._state

    @property
    def done(self) -> bool:
        return self._state is _S.DONE

    @property
    def peer_digest(self) -> bytes | None:
        """SHA-256 of the peer's instance name: the dialer's, once its CHALLENGE arrived
        (the acceptor); the dialed instance's (the dialer)."""
        return self._peer_digest

    def start(self) -> bytes:
        """The dialer's CHALLENGE, the first handshake message."""
        if self._state is not _S.START:
            raise LinkAuthError(f"the handshake cannot start in state {self._state.name}")
        assert self._peer_name is not None
        self._peer_digest = name_digest(self._peer_name)
        challenge = (
            AUTH_MAGIC
            + bytes([MessageKind.CHALLENGE])
            + self._nonce
            + name_digest(self._local)
            + self._peer_digest
        )
        self._transcript = challenge
        self._state = _S.AWAIT_RESPONSE
        return challenge

    def receive(self, message: Buffer) -> bytes | None:
        """The peer's next handshake message; returns ours to send back, if any.

        Raises :class:`LinkAuthError` naming what was wrong (and the handshake stays
        failed): a message of the wrong kind, size or magic, a CHALLENGE for another
        instance, a proof that does not match (the peer does not hold the secret).
        """
        if self._state not in _EXPECT:
            raise LinkAuthError(f"a handshake message in state {self._state.name}")
        kind, after = _EXPECT[self._state]
        try:
            data = self._check(bytes(message), kind)
            reply = self._handle(kind, data)
        except LinkAuthError:
            self._state = _S.FAILED
            raise
        self._state = after
        return reply

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

    def _handle(self, kind: MessageKind, data: bytes) -> bytes | None:
        if kind is MessageKind.CHALLENGE:  # acceptor
            nonce_end = _HEAD + NONCE_SIZE
            self._peer_digest = data[nonce_end : nonce_end + DIGEST_SIZE]
            dialed = data[nonce_end + DIGEST_SIZE :]
            if not hmac.compare_digest(dialed, name_digest(self._local)):
                raise LinkAuthError(
                    f"the peer dialed another instance (name digest {dialed.hex()[:16]}...), "
                    f"but this is {self._local!r}",
                    offset=nonce_end + DIGEST_SIZE,
                )
            self._transcript = data + self._nonce
            proof = _mac(self._secret, _ACCEPTOR_PROOF, self._transcript)
            return AUTH_MAGIC + bytes([MessageKind.RESPONSE]) + self._nonce + proof
        if kind is MessageKind.RESPONSE:  # dialer
            nonce = data[_HEAD : _HEAD + NONCE_SIZE]
            self._transcript += nonce
            expected = _mac(self._secret, _ACCEPTOR_PROOF, self._transcript)
            if not hmac.compare_digest(data[_HEAD + NONCE_SIZE :], expected):
                raise LinkAuthError(
                    f"the acceptor's proof does not match: it does not hold this cluster's "
                    f"secret, or it is not {self._peer_name!r}",
                    offset=_HEAD + NONCE_SIZE,
                )
            proof = _mac(self._secret, _DIALER_PROOF, self._transcript)
            return AUTH_MAGIC + bytes([MessageKind.CONFIRM]) + proof
        # CONFIRM, acceptor
        expected = _mac(self._secret, _DIALER_PROOF, self._transcript)
        if not hmac.compare_digest(data[_HEAD:], expected):
            raise LinkAuthError(
                "the dialer's proof does not match: it does not hold this cluster's secret",
                offset=_HEAD,
            )
        return None

    def channel(self) -> LinkChannel:
        """The MACs for the rest of the connection; only once the handshake is done."""
        if self._state is not _S.DONE:
            raise LinkAuthError(f"no channel before the handshake is done ({self._state.name})")
        to_acceptor = _mac(self._secret, _KEY_TO_ACCEPTOR, self._transcript)
        to_dialer = _mac(self._secret, _KEY_TO_DIALER, self._transcript)
        if self.role is Role.DIALER:
            return LinkChannel(send_key=to_acceptor, receive_key=to_dialer)
        return LinkChannel(send_key=to_dialer, receive_key=to_acceptor)


class LinkChannel:
    """Tags for frames after the handshake: one key and one counter per direction."""

    def __init__(self, *, send_key: bytes, receive_key: bytes) -> None:
        self._send_mac = KeyedMac(send_key)
        self._receive_mac = KeyedMac(receive_key)
        self._sent = 0
        self._received = 0
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
            data, max_length, self._receive_state, self._received, token.first, token.second
        )
        if payload is not None:
            self._received += 1
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
            parts, max_length, self._send_state, self._sent, token.first, token.second
        )
        if frame is not None:
            self._sent += 1
        return frame

    def seal(self, token: Token, parts: Sequence[Buffer]) -> bytes:
        """The tag to append to the message made of ``parts``, sent next to ``token``."""
        tag = self._send_mac.digest(_COUNTER.pack(self._sent), token.encode(), *parts)
        self._sent += 1
        return tag[:TAG_SIZE]

    def open(self, token: Token, message: bytes) -> memoryview:
        """The payload of the next received frame's message, once its tag checks out."""
        if len(message) < TAG_SIZE:
            raise LinkAuthError(
                f"frame {self._received} on the link: {len(message)} bytes, too short for its "
                f"{TAG_SIZE}-byte tag"
            )
        view = memoryview(message)
        payload = view[: len(message) - TAG_SIZE]
        expected = self._receive_mac.digest(_COUNTER.pack(self._received), token.encode(), payload)
        if not hmac.compare_digest(view[len(message) - TAG_SIZE :], expected[:TAG_SIZE]):
            raise LinkAuthError(
                f"frame {self._received} on the link fails its tag: altered, replayed, "
                "reordered or injected"
            )
        self._received += 1
        return payload
