"""The errors the authenticated channel raises.

Everything a peer can cause is a :class:`ChannelError` (a ``ValueError``): ``reason``
says what failed, ``kind`` the handshake message it failed in (None for a frame after
the handshake), ``frame`` the tagged frame's number in its direction (None in the
handshake). The core sees values, not bytes: where a field sits in a message is its
protocol's to say, so each protocol's adapter (``coordinator/links/auth.py``,
``ingress/connection.py``) raises its own error, with that offset, from this one.
A message out of order is :class:`~.states.UnexpectedMessageError`, beside its table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .states import MessageKind

__all__ = ["ChannelError", "ProofError", "TagError"]


class ChannelError(ValueError):
    """A peer failed the handshake or a frame's tag: the connection must close."""

    def __init__(
        self, reason: str, *, kind: MessageKind | None = None, frame: int | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind
        self.frame = frame

    def __reduce__(self) -> tuple[type[ChannelError], tuple[str], dict[str, object]]:
        # Picklable with its attributes (the default rebuilds it from the message alone).
        return (type(self), (self.reason,), {"kind": self.kind, "frame": self.frame})


class ProofError(ChannelError):
    """A handshake proof that does not match: the peer does not hold the secret, or it
    saw another transcript (another challenge, other labels)."""


class TagError(ChannelError):
    """A frame after the handshake that fails its tag (altered, dropped, replayed,
    reordered or injected), or is too short to carry one."""
