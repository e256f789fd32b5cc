"""One replication connection's bytes, sans-IO: the authenticated channel's handshake
(:mod:`ambrosia_py.auth`) between two replicas of one instance, then the replicated
log's frames (:mod:`..replication.messages`), each with its tag.

A connection carries messages one way only: from the replica that dialed it (the
*dialer*, the channel's challenger) to the one that accepted it (the *acceptor*, its
responder). The acceptor answers the handshake and sends nothing after it. Every
integer in the handshake is little-endian; ``H`` is SHA-256, ``HMAC`` HMAC-SHA256,
``S`` the cluster secret, and each handshake message goes in one frame whose length is
one byte (a uvarint below 128)::

    dialer -> acceptor   CHALLENGE  81 | "AMBREPL1" | 01 | Nd (32) | H(instance) (32)
                                         | u32 dialer replica | u32 acceptor replica
    acceptor -> dialer   RESPONSE   73 | "AMBREPL1" | 02 | Na (32)
                                         | HMAC(S, "ambrosia-replica-v1 acceptor" | T)
    dialer -> acceptor   CONFIRM    41 | "AMBREPL1" | 03
                                         | HMAC(S, "ambrosia-replica-v1 dialer" | T)
    dialer -> acceptor   then frames: replication frame | tag (16), again and again

``T``, the transcript, is the CHALLENGE's 81 bytes followed by ``Na``: the instance's
name and both replica numbers are in it, so both proofs cover them, and the sender
number the acceptor hands on with each message is the one the dialer proved. The
acceptor checks, before it answers, that the CHALLENGE names its own instance and its
own replica number, and a dialer number other than its own. The labels'
domain, ``"ambrosia-replica-v1"``, differs from the links' and the ingress's, so no
proof or key of theirs is good here, nor one of this channel's there.

A replication frame is exactly what :func:`~..replication.messages.encode_frame` makes
(``uvarint length | version | kind | fields``); its 16-byte tag follows it, outside the
length: the first half of ``HMAC(K, u64 counter | frame)``, the frame with its length
prefix, ``K = HMAC(S, "ambrosia-replica-v1 key dialer->acceptor" | T)``, the counter
numbering the connection's frames from 0. A frame altered, injected, dropped,
replayed or reordered fails its tag. The frame is decoded only once its tag checks out.

What a peer can make an end hold between two reads: before the handshake is done, part
of one handshake message (a length other than the expected message's is refused as
soon as its byte is in, and a read holding more than the handshake is refused as it is
taken); after it, part of one frame of at most ``max_frame`` bytes (a longer declared
length is refused as soon as its varint is in, before any of the frame is buffered).
"""

from __future__ import annotations

import enum
import hashlib
import struct
from typing import Final, NoReturn

from ...auth import (
    NONCE_SIZE,
    PROOF_SIZE,
    TAG_SIZE,
    Buffer,
    Challenge,
    Channel,
    ChannelError,
    Confirm,
    Handshake,
    HandshakeState,
    Labels,
    ProofError,
    Response,
    Role,
)
from ..replication.errors import ReplicationProtocolError
from ..replication.frames import frame_extent
from ..replication.messages import DEFAULT_MAX_FRAME, Message, decode_body

__all__ = [
    "CHALLENGE_SIZE",
    "CONFIRM_SIZE",
    "MAGIC",
    "MAX_REPLICA",
    "REPLICA_LABELS",
    "RESPONSE_SIZE",
    "TAG_SIZE",
    "Accepting",
    "Dialing",
    "HandshakeKind",
    "ReplicaAuthError",
    "instance_digest",
]

MAGIC = b"AMBREPL1"
MAX_REPLICA = 2**31 - 1  # the registry's bound on replica numbers
_HEAD = len(MAGIC) + 1
_DIGEST_SIZE = 32  # SHA-256 of the instance's name
_REPLICAS = struct.Struct("<II")  # the dialer's replica number, the acceptor's
CHALLENGE_SIZE: Final = _HEAD + NONCE_SIZE + _DIGEST_SIZE + _REPLICAS.size  # 81
RESPONSE_SIZE: Final = _HEAD + NONCE_SIZE + PROOF_SIZE  # 73
CONFIRM_SIZE: Final = _HEAD + PROOF_SIZE  # 41


class HandshakeKind(enum.IntEnum):
    """The byte after the magic in each handshake message."""

    CHALLENGE = 1
    RESPONSE = 2
    CONFIRM = 3


_SIZES: Final = {
    HandshakeKind.CHALLENGE: CHALLENGE_SIZE,
    HandshakeKind.RESPONSE: RESPONSE_SIZE,
    HandshakeKind.CONFIRM: CONFIRM_SIZE,
}

REPLICA_LABELS: Final = Labels(
    domain=b"ambrosia-replica-v1",
    head=MAGIC + bytes([HandshakeKind.CHALLENGE]),
    challenger="dialer",
    responder="acceptor",
    frames="on the replica connection",
)
"""The channel's labels between replicas: the dialer challenges, the acceptor responds."""


class ReplicaAuthError(ReplicationProtocolError):
    """A peer failed the handshake or a frame's tag: the connection must close.
    ``offset`` counts the bytes that peer sent on the connection before the fault."""


def instance_digest(instance: str) -> bytes:
    """SHA-256 of an instance's name (UTF-8): how the CHALLENGE names the instance."""
    return hashlib.sha256(instance.encode()).digest()


def _check_replica(replica: int, what: str) -> None:
    if not 0 <= replica <= MAX_REPLICA:
        raise ValueError(f"{what} {replica} is not in 0..{MAX_REPLICA}")


def _framed(kind: HandshakeKind, *fields: bytes) -> bytes:
    """A handshake message in its frame: the one-byte length, the magic, the kind."""
    body = b"".join((MAGIC, bytes([kind]), *fields))
    assert len(body) == _SIZES[kind]
    return bytes([len(body)]) + body


class _End:
    """What both ends share: the bytes received and not yet taken, where they start in
    the stream, and the handshake messages cut from them."""

    def __init__(self, handshake: Handshake) -> None:
        self._handshake = handshake
        self._buf = bytearray()
        self._consumed = 0  # stream offset of self._buf[0]
        self._out: list[bytes] = []
        self._broken: ReplicationProtocolError | None = None

    def data_to_send(self) -> bytes:
        """What this end has to send now (handshake messages); empty when nothing."""
        out, self._out = b"".join(self._out), []
        return out

    def _fail(self, exc: ReplicationProtocolError) -> ReplicationProtocolError:
        self._broken = exc
        self._handshake.fail()
        self._out = []
        return exc

    def _feed(self, data: Buffer) -> None:
        if self._broken is not None:
            raise self._broken
        self._buf += data

    def _message(self, kind: HandshakeKind) -> bytes | None:
        """The next handshake message, which must be a ``kind``, once all of it is in."""
        buf = self._buf
        if not buf:
            return None
        size = _SIZES[kind]
        if buf[0] != size:
            declared = "over 127" if buf[0] & 0x80 else str(buf[0])
            raise ReplicaAuthError(
                f"a handshake {kind.name} of {declared} bytes, not {size}: not a replica "
                "connection, or a peer out of turn",
                offset=self._consumed,
            )
        if len(buf) <= size:
            return None
        message = bytes(buf[1 : size + 1])
        at = self._consumed + 1
        del buf[: size + 1]
        self._consumed += size + 1
        if message[:_HEAD] != MAGIC + bytes([kind]):
            raise ReplicaAuthError(
                f"expected a replica handshake {kind.name} ({MAGIC!r} then {int(kind)}), got "
                f"{message[:_HEAD]!r}: not a replica connection, or a peer out of turn",
                offset=at,
            )
        return message

    def _refused(self, exc: ChannelError, kind: HandshakeKind, at: int, hint: str = "") -> NoReturn:
        """Raise the handshake core's refusal of the ``kind`` message just taken, at its
        offset (``at``: where its proof starts in it)."""
        offset = self._consumed - _SIZES[kind] + (at if isinstance(exc, ProofError) else 0)
        raise ReplicaAuthError(exc.reason + hint, offset=offset) from None


class Accepting(_End):
    """The acceptor's end of one connection: bytes in, messages out.

    :meth:`receive_data` takes what arrived and returns the messages it completed (none
    before the handshake is done); :meth:`data_to_send` is the RESPONSE to write back.
    ``peer`` is the dialer's replica number once it proved the secret. Any error
    (:class:`ReplicaAuthError` for the handshake and tags, a
    :class:`~..replication.errors.ReplicationProtocolError` for a frame too long or one
    that does not decode) leaves the end refusing everything: close the connection.
    """

    def __init__(
        self,
        secret: bytes,
        instance: str,
        replica: int,
        *,
        max_frame: int = DEFAULT_MAX_FRAME,
        nonce: bytes | None = None,
    ) -> None:
        _check_replica(replica, "replica number")
        super().__init__(Handshake(REPLICA_LABELS, Role.RESPONDER, secret, nonce=nonce))
        self.instance = instance
        self.replica = replica
        self.max_frame = max_frame
        self.peer: int | None = None  # the dialer's number, once it proved the secret
        self._claimed: int | None = None  # the number its CHALLENGE gave
        self._digest = instance_digest(instance)
        self._channel: Channel | None = None

    @property
    def authenticated(self) -> bool:
        return self._channel is not None

    def receive_data(self, data: Buffer) -> list[Message]:
        """The messages ``data`` completes, in order."""
        self._feed(data)
        try:
            if self._channel is None and not self._authenticate():
                return []
            return self._frames()
        except ReplicationProtocolError as exc:
            raise self._fail(exc) from None

    def _authenticate(self) -> bool:
        """Take the handshake messages that are in; True once the dialer proved itself."""
        while self._channel is None:
            kind = (
                HandshakeKind.CHALLENGE
                if self._handshake.state is HandshakeState.START
                else HandshakeKind.CONFIRM
            )
            message = self._message(kind)
            if message is None:
                return False
            if kind is HandshakeKind.CHALLENGE:
                self._out.append(self._answer(message))
            else:
                try:
                    self._handshake.receive(Confirm(message[_HEAD:]))
                except ChannelError as exc:
                    self._refused(exc, kind, _HEAD)
                self._channel = self._handshake.channel()
                self.peer = self._claimed
        return True

    def _answer(self, challenge: bytes) -> bytes:
        """The RESPONSE to a CHALLENGE that names this instance and replica."""
        nonce_end = _HEAD + NONCE_SIZE
        digest = challenge[nonce_end : nonce_end + _DIGEST_SIZE]
        at = self._consumed - CHALLENGE_SIZE
        if digest != self._digest:
            raise ReplicaAuthError(
                f"the peer dialed another instance (name digest {digest.hex()[:16]}...), "
                f"not {self.instance!r}",
                offset=at + nonce_end,
            )
        dialer, acceptor = _REPLICAS.unpack_from(challenge, nonce_end + _DIGEST_SIZE)
        replicas_at = at + nonce_end + _DIGEST_SIZE
        if acceptor != self.replica:
            raise ReplicaAuthError(
                f"the peer dialed replica {acceptor} of {self.instance!r}, but this is "
                f"replica {self.replica}",
                offset=replicas_at + 4,
            )
        if dialer == self.replica or dialer > MAX_REPLICA:
            raise ReplicaAuthError(
                f"the peer claims replica number {dialer}, which no other replica of "
                f"{self.instance!r} can have (this is replica {self.replica})",
                offset=replicas_at,
            )
        try:
            response = self._handshake.receive(
                Challenge(challenge[_HEAD:nonce_end], challenge[nonce_end:])
            )
        except ChannelError as exc:
            self._refused(exc, HandshakeKind.CHALLENGE, 0)
        self._claimed = dialer
        return _framed(HandshakeKind.RESPONSE, response.nonce, response.proof)

    def _frames(self) -> list[Message]:
        """Every whole frame in the buffer, its tag checked, decoded."""
        channel = self._channel
        assert channel is not None
        buf = self._buf
        out: list[Message] = []
        while buf:
            name = f"frame {channel.received}"
            extent = frame_extent(buf, self._consumed, self.max_frame, name, TAG_SIZE)
            if extent is None:
                break
            pos, end = extent
            unit = bytes(buf[:end])  # the one copy: a message's records are views of it
            base = self._consumed
            del buf[:end]
            self._consumed += end
            try:
                frame = channel.check(b"", unit)
            except ChannelError as exc:
                raise ReplicaAuthError(exc.reason, offset=base) from None
            out.append(decode_body(frame[pos:], base + pos))
        return out


class Dialing(_End):
    """The dialer's end of one connection: :meth:`start` is the CHALLENGE, the
    acceptor's RESPONSE goes to :meth:`receive_data`, and :meth:`data_to_send` is then
    the CONFIRM. Once :attr:`authenticated`, :meth:`seal` tags each frame sent, and any
    byte the acceptor sends is refused."""

    def __init__(
        self, secret: bytes, instance: str, replica: int, peer: int, *, nonce: bytes | None = None
    ) -> None:
        _check_replica(replica, "replica number")
        _check_replica(peer, "destination replica number")
        if peer == replica:
            raise ValueError(f"replica {replica} does not dial itself")
        super().__init__(Handshake(REPLICA_LABELS, Role.CHALLENGER, secret, nonce=nonce))
        self.instance = instance
        self.replica = replica
        self.peer = peer
        self._channel: Channel | None = None

    @property
    def authenticated(self) -> bool:
        return self._channel is not None

    def start(self) -> bytes:
        """The CHALLENGE, naming the instance and both replicas."""
        context = instance_digest(self.instance) + _REPLICAS.pack(self.replica, self.peer)
        challenge = self._handshake.start(context)
        return _framed(HandshakeKind.CHALLENGE, challenge.nonce, challenge.context)

    def receive_data(self, data: Buffer) -> list[Message]:
        """The acceptor's RESPONSE (the CONFIRM is then :meth:`data_to_send`); no
        messages ever come this way. Raises :class:`ReplicaAuthError` for anything
        else, or for a proof that does not match: the acceptor does not hold the
        secret, or saw another CHALLENGE."""
        self._feed(data)
        try:
            if self._buf and self._channel is not None:
                raise ReplicaAuthError(
                    f"the acceptor sent {len(self._buf)} bytes after the handshake; it "
                    "sends nothing on a replica connection",
                    offset=self._consumed,
                )
            message = None if self._channel else self._message(HandshakeKind.RESPONSE)
            if message is not None:
                self._confirm(message)
        except ReplicationProtocolError as exc:
            raise self._fail(exc) from None
        return []

    def _confirm(self, response: bytes) -> None:
        """Check the RESPONSE's proof; queue the CONFIRM."""
        if self._buf:
            raise ReplicaAuthError(
                f"the acceptor sent {len(self._buf)} bytes after its RESPONSE",
                offset=self._consumed,
            )
        nonce_end = _HEAD + NONCE_SIZE
        try:
            confirm = self._handshake.receive(
                Response(response[_HEAD:nonce_end], response[nonce_end:])
            )
        except ChannelError as exc:
            hint = f", or it is not replica {self.peer} of {self.instance!r}"
            self._refused(exc, HandshakeKind.RESPONSE, nonce_end, hint)
        self._out.append(_framed(HandshakeKind.CONFIRM, confirm.proof))
        self._channel = self._handshake.channel()

    def seal(self, frame: bytes) -> bytes:
        """The tag to send right after ``frame`` (a whole replication frame)."""
        assert self._channel is not None, "frames are sent only after the handshake"
        return self._channel.tag(b"", (frame,))
