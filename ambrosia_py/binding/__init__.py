"""The language binding: Immortal, @rpc, proxies, deterministic dispatch, checkpoints."""

from .client import connect, serve
from .dispatcher import Dispatcher, Mode
from .errors import (
    BindingError,
    CheckpointFormatError,
    DeterminismError,
    ImpulseDuringRecoveryError,
    MethodIdCollisionError,
    RemoteError,
    UnknownMethodError,
)
from .immortal import CallFuture, Immortal, MethodSpec, Proxy, background, method_id_for, rpc
from .loading import load_service

__all__ = [
    "BindingError",
    "CallFuture",
    "CheckpointFormatError",
    "DeterminismError",
    "Dispatcher",
    "Immortal",
    "ImpulseDuringRecoveryError",
    "MethodIdCollisionError",
    "MethodSpec",
    "Mode",
    "Proxy",
    "RemoteError",
    "UnknownMethodError",
    "background",
    "connect",
    "load_service",
    "method_id_for",
    "rpc",
    "serve",
]
