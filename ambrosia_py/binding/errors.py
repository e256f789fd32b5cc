"""Errors of the language binding."""

from __future__ import annotations

__all__ = [
    "BindingError",
    "CheckpointFormatError",
    "DeterminismError",
    "ImpulseDuringRecoveryError",
    "MethodIdCollisionError",
    "RemoteError",
    "UnknownMethodError",
]


class BindingError(Exception):
    """Something the binding cannot go on from."""


class DeterminismError(BindingError):
    """A handler did something replay could not repeat (the message says what)."""


class ImpulseDuringRecoveryError(DeterminismError):
    """An impulse was sent while the immortal was replaying (seed 002: not allowed)."""


class MethodIdCollisionError(TypeError):
    """Two @rpc methods of one class have the same method id."""


class UnknownMethodError(BindingError):
    """An incoming call for a method id the immortal does not have."""


class CheckpointFormatError(BindingError):
    """A checkpoint blob that is not in this binding's format."""


class RemoteError(Exception):
    """A remote handler raised something that could not travel back as itself."""
