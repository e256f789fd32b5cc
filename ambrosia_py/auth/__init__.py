"""The one authenticated channel, sans-IO, that the links between coordinators and the
ingress both run: a nonce challenge, proofs of a shared secret over the transcript, a
key per direction, and a counter tag on every later frame (:mod:`.channel`), in the
order :mod:`.states`' table gives. Each protocol supplies its :class:`Labels` and the
wire form of the three messages (``coordinator/links/auth.py``,
``ingress/connection.py``); ``docs/security.md`` has both, byte by byte.

A floor of its own beside ``wire/`` and ``flow/``: it imports nothing of the project.
"""

from .channel import (
    MIN_SECRET_SIZE,
    NONCE_SIZE,
    PROOF_SIZE,
    TAG_SIZE,
    Buffer,
    Challenge,
    Channel,
    Confirm,
    Handshake,
    KeyedMac,
    Labels,
    Response,
    same_digest,
)
from .errors import ChannelError, ProofError, TagError
from .states import (
    EXPECTED,
    SENDERS,
    TABLE,
    TRANSITIONS,
    Direction,
    HandshakeState,
    MessageKind,
    Role,
    UnexpectedMessageError,
    step,
)

__all__ = [
    "EXPECTED",
    "MIN_SECRET_SIZE",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "SENDERS",
    "TABLE",
    "TAG_SIZE",
    "TRANSITIONS",
    "Buffer",
    "Challenge",
    "Channel",
    "ChannelError",
    "Confirm",
    "Direction",
    "Handshake",
    "HandshakeState",
    "KeyedMac",
    "Labels",
    "MessageKind",
    "ProofError",
    "Response",
    "Role",
    "TagError",
    "UnexpectedMessageError",
    "same_digest",
    "step",
]
