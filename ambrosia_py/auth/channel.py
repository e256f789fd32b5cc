"""The authenticated channel, sans-IO: the handshake and the frame tags that the links
between coordinators and the ingress both run, each with its own :class:`Labels`.

Both ends hold a secret ``S``. ``H(K, x)`` is HMAC-SHA256, ``|`` concatenation, and
``D`` the labels' domain (``"ambrosia-link-v1"``, ``"ambrosia-ingress-v1"``); the two
sides are named by the labels too (links: the dialer challenges, the acceptor
responds; the ingress: the server challenges, the client responds)::

    CHALLENGE  challenger -> responder   Nc, context
    RESPONSE   responder -> challenger   Nr, H(S, D " " responder | T)
    CONFIRM    challenger -> responder   H(S, D " " challenger | T | info), info

    T = head | Nc | context | Nr        (the transcript)

``head`` is the labels' (the bytes a CHALLENGE starts with), ``Nc`` and ``Nr`` are 32
fresh random bytes per connection and side, ``context`` is what the challenger binds
into the transcript beside its nonce (links: both instance names' SHA-256), ``info``
what it says under its proof (the ingress: the service's description). The responder
proves the secret first, so a challenger without it learns nothing but a nonce; the
challenger's proof covers the responder's nonce, so it cannot be replayed; the two
proofs carry different labels, so neither can be reflected to its maker; the domain
differs per protocol, so no proof or key of one is good for the other.

Then each direction has its own key, ``H(S, D " key " sender "->" receiver | T)``, and
every later frame ends in a tag: the first 16 bytes of ``H(K, u64le counter | header |
payload)``, the counter numbering that direction's frames from 0 and ``header`` what
the protocol binds in beside the payload (links: the flow token; the ingress: the frame
kind). A frame altered, injected, dropped, replayed or reordered fails its tag.

The wire form of each message is its protocol's (``coordinator/links/auth.py``,
``ingress/connection.py``): they encode and decode, this module computes and checks.
Every digest comes from OpenSSL through :mod:`hmac`; every check of one is
:func:`same_digest`. The order of the messages is :mod:`.states`' table.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Final, overload

import attrs

from .errors import ChannelError, ProofError, TagError
from .states import (
    EXPECTED,
    TABLE,
    Direction,
    HandshakeState,
    MessageKind,
    Role,
    UnexpectedMessageError,
)

__all__ = [
    "MIN_SECRET_SIZE",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "TAG_SIZE",
    "Buffer",
    "Challenge",
    "Channel",
    "Confirm",
    "Handshake",
    "KeyedMac",
    "Labels",
    "Response",
    "same_digest",
]

Buffer = bytes | bytearray | memoryview

NONCE_SIZE = 32
PROOF_SIZE = 32  # HMAC-SHA256
TAG_SIZE = 16  # a frame's tag: HMAC-SHA256 truncated to 128 bits (as RFC 4868)
MIN_SECRET_SIZE = 16
_COUNTER = struct.Struct("<Q")

_PEER: Final = MappingProxyType({Role.CHALLENGER: Role.RESPONDER, Role.RESPONDER: Role.CHALLENGER})

same_digest: Final[Callable[[Buffer, Buffer], bool]] = hmac.compare_digest
"""Whether two digests are equal, in a time that does not depend on where they differ:
the one comparison the channel makes of a proof or a tag."""


@attrs.frozen
class Labels:
    """What differs between two uses of the channel: every label its HMACs start with,
    the bytes its transcript starts with, and the names its errors give.

    ``domain`` starts every label; ``head`` starts the transcript (the CHALLENGE's bytes
    before the challenger's nonce, as its protocol sends them); ``challenger`` and
    ``responder`` name the two sides in the labels and in errors; ``frames`` says, in an
    error, where a tagged frame is (``"frame 3 on the link"``). Derived from them:
    ``proofs``, what each side's proof starts with (``D " " side``), and ``keys``, what
    the key of each side's direction starts with (``D " key " side "->" other side``).
    """

    domain: bytes
    head: bytes
    challenger: str
    responder: str
    frames: str
    proofs: Mapping[Role, bytes] = attrs.field(init=False, repr=False, eq=False)
    keys: Mapping[Role, bytes] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        names = {Role.CHALLENGER: self.challenger, Role.RESPONDER: self.responder}
        proofs = {role: b"%s %s" % (self.domain, name.encode()) for role, name in names.items()}
        keys = {
            sender: b"%s key %s->%s"
            % (self.domain, names[sender].encode(), names[_PEER[sender]].encode())
            for sender in Role
        }
        object.__setattr__(self, "proofs", MappingProxyType(proofs))
        object.__setattr__(self, "keys", MappingProxyType(keys))

    def name(self, role: Role) -> str:
        """The protocol's name for ``role``: ``"dialer"``, ``"client"``, ..."""
        return self.challenger if role is Role.CHALLENGER else self.responder


@attrs.frozen
class Challenge:
    """The challenger's nonce, and what it binds into the transcript beside it."""

    nonce: bytes
    context: bytes = b""


@attrs.frozen
class Response:
    """The responder's nonce and its proof over the transcript."""

    nonce: bytes
    proof: bytes


@attrs.frozen
class Confirm:
    """The challenger's proof over the transcript and ``info``, and ``info`` itself."""

    proof: bytes
    info: bytes = b""


Message = Challenge | Response | Confirm
_KIND: Final[Mapping[type[Message], MessageKind]] = MappingProxyType(
    {Challenge: MessageKind.CHALLENGE, Response: MessageKind.RESPONSE, Confirm: MessageKind.CONFIRM}
)


class KeyedMac:
    """HMAC-SHA256 under one key: the standard library's (OpenSSL's HMAC), keyed once
    here; each digest is then a copy of the keyed state and a few updates, where a
    one-shot ``hmac.digest`` would set the key up again on every call and need the parts
    joined first. One serves every frame of a direction, or every proof under a secret.
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


class Handshake:
    """One side of the handshake: message values in, message values out; no I/O, no
    clock. :meth:`start` (the challenger) and :meth:`receive` move it through
    :mod:`.states`' table; :meth:`channel` is the rest of the connection's tags.

    Any refused message leaves it FAILED, and it takes nothing more. ``nonce`` is for
    tests; by default a fresh one is drawn from :mod:`secrets`. ``info`` is what the
    challenger's CONFIRM carries under its proof.
    """

    __slots__ = ("_secret", "_transcript", "info", "labels", "nonce", "role", "state")

    def __init__(
        self,
        labels: Labels,
        role: Role,
        secret: bytes,
        *,
        nonce: bytes | None = None,
        info: bytes = b"",
    ) -> None:
        if len(secret) < MIN_SECRET_SIZE:
            raise ValueError(
                f"a secret of {len(secret)} bytes: at least {MIN_SECRET_SIZE} are needed"
            )
        self.nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_SIZE)
        if len(self.nonce) != NONCE_SIZE:
            raise ValueError(f"a nonce has {NONCE_SIZE} bytes, not {len(self.nonce)}")
        if info and role is not Role.CHALLENGER:
            raise ValueError(f"only the {labels.challenger}'s CONFIRM carries info")
        self.labels = labels
        self.role = role
        self.info = info
        self.state = HandshakeState.START
        self._secret = KeyedMac(secret)
        self._transcript = b""

    @property
    def done(self) -> bool:
        return self.state is HandshakeState.CONFIRMED

    @property
    def expecting(self) -> MessageKind | None:
        """The kind of message this side may receive now (:data:`~.states.EXPECTED`);
        None while it is its turn to send, and once the handshake is over or failed."""
        return EXPECTED.get((self.role, self.state))

    def fail(self) -> None:
        """Refuse the handshake: its protocol found the message it received bad before
        it got here (its layout, or what only the protocol checks). It takes nothing
        more."""
        self.state = HandshakeState.FAILED

    def _move(self, kind: MessageKind, direction: Direction) -> None:
        """One step of :mod:`.states`' table (its :func:`~.states.step`, inline: every
        message of every handshake passes here); FAILED where the table has none."""
        after = TABLE.get((self.role, self.state, kind, direction))
        if after is None:
            error = UnexpectedMessageError(self.role, self.state, kind, direction)
            self.state = HandshakeState.FAILED
            raise error
        self.state = after

    def start(self, context: bytes = b"") -> Challenge:
        """The challenger's CHALLENGE, binding ``context`` into the transcript."""
        self._move(MessageKind.CHALLENGE, Direction.SEND)
        self._transcript = self.labels.head + self.nonce + context
        return Challenge(self.nonce, context)

    @overload
    def receive(self, message: Challenge) -> Response: ...
    @overload
    def receive(self, message: Response) -> Confirm: ...
    @overload
    def receive(self, message: Confirm) -> None: ...
    def receive(self, message: Message) -> Response | Confirm | None:
        """The peer's next message; returns this side's answer, if any.

        Raises :class:`~.states.UnexpectedMessageError` for a message out of turn,
        :class:`ProofError` for a proof that does not match, :class:`ChannelError` for
        a nonce or proof of the wrong size; the handshake is then FAILED.
        """
        self._move(_KIND[type(message)], Direction.RECEIVE)
        reply: Response | Confirm | None
        try:  # the table said this side may receive it here: what it does with it
            match message:
                case Challenge():
                    reply = self._on_challenge(message)
                case Response():
                    reply = self._on_response(message)
                case Confirm():
                    self._on_confirm(message)
                    reply = None
        except ChannelError:
            self.state = HandshakeState.FAILED
            raise
        if reply is not None:
            self._move(_KIND[type(reply)], Direction.SEND)
        return reply

    def _proof(self, role: Role, *extra: bytes) -> bytes:
        return self._secret.digest(self.labels.proofs[role], self._transcript, *extra)

    def _check_size(self, kind: MessageKind, what: str, value: bytes, size: int) -> None:
        if len(value) != size:
            raise ChannelError(
                f"a {kind.name} whose {what} has {len(value)} bytes, not {size}", kind=kind
            )

    def _check_proof(self, kind: MessageKind, proof: bytes, *extra: bytes) -> None:
        self._check_size(kind, "proof", proof, PROOF_SIZE)
        peer = _PEER[self.role]
        if not same_digest(proof, self._proof(peer, *extra)):
            raise ProofError(
                f"the {self.labels.name(peer)}'s proof does not match: it does not hold "
                "this cluster's secret",
                kind=kind,
            )

    def _on_challenge(self, challenge: Challenge) -> Response:  # the responder
        self._check_size(MessageKind.CHALLENGE, "nonce", challenge.nonce, NONCE_SIZE)
        self._transcript = self.labels.head + challenge.nonce + challenge.context + self.nonce
        return Response(self.nonce, self._proof(Role.RESPONDER))

    def _on_response(self, response: Response) -> Confirm:  # the challenger
        self._check_size(MessageKind.RESPONSE, "nonce", response.nonce, NONCE_SIZE)
        self._transcript += response.nonce
        self._check_proof(MessageKind.RESPONSE, response.proof)
        return Confirm(self._proof(Role.CHALLENGER, self.info), self.info)

    def _on_confirm(self, confirm: Confirm) -> None:  # the responder
        self._check_proof(MessageKind.CONFIRM, confirm.proof, confirm.info)

    def keys(self) -> tuple[bytes, bytes]:
        """This side's (send, receive) keys; only once the handshake is done."""
        if self.state is not HandshakeState.CONFIRMED:
            raise ChannelError(f"no channel before the handshake is done ({self.state.name})")
        keys, transcript = self.labels.keys, self._transcript
        ours = self._secret.digest(keys[self.role], transcript)
        theirs = self._secret.digest(keys[_PEER[self.role]], transcript)
        return ours, theirs

    def channel(self) -> Channel:
        """The tags for the rest of the connection; only once the handshake is done."""
        send_key, receive_key = self.keys()
        return Channel(self.labels, send_key=send_key, receive_key=receive_key)


class Channel:
    """Tags for the frames after the handshake: one key and one counter per direction.

    ``sent`` and ``received`` count the frames each direction has tagged (the next
    one's counter). A protocol that tags a frame elsewhere (the links' C twin, which
    builds or checks a whole small frame in one call) reads them, and advances them
    when it did.

    Each direction's HMAC is keyed once and copied per frame, as :class:`KeyedMac`
    does; here the copy is made inline, with the counter and header as one update: this
    runs for every frame, and each Python call saved shows on a small one.
    """

    __slots__ = ("_frames", "_receive", "_send", "received", "sent")

    def __init__(self, labels: Labels, *, send_key: bytes, receive_key: bytes) -> None:
        self._frames = labels.frames
        self._send = hmac.new(send_key, digestmod=hashlib.sha256)
        self._receive = hmac.new(receive_key, digestmod=hashlib.sha256)
        self.sent = 0
        self.received = 0

    def tag(self, header: bytes, parts: Iterable[Buffer]) -> bytes:
        """The tag of the next frame sent: ``header`` and the payload made of ``parts``."""
        mac = self._send.copy()
        mac.update(_COUNTER.pack(self.sent) + header)
        for part in parts:
            mac.update(part)
        self.sent += 1
        return mac.digest()[:TAG_SIZE]

    def check(self, header: bytes, message: Buffer) -> memoryview:
        """The payload of the next received frame's ``message`` (payload | tag), once
        its tag checks out with ``header``. Raises :class:`TagError` naming the frame."""
        end = len(message) - TAG_SIZE
        if end < 0:
            raise TagError(
                f"frame {self.received} {self._frames}: {len(message)} bytes, too short for "
                f"its {TAG_SIZE}-byte tag",
                frame=self.received,
            )
        view = memoryview(message)
        payload = view[:end]
        mac = self._receive.copy()
        mac.update(_COUNTER.pack(self.received) + header)
        mac.update(payload)
        if not same_digest(view[end:], mac.digest()[:TAG_SIZE]):
            raise TagError(
                f"frame {self.received} {self._frames} fails its tag: altered, replayed, "
                "reordered or injected",
                frame=self.received,
            )
        self.received += 1
        return payload
