"""The language binding: Immortal, @rpc, proxies, deterministic dispatch, checkpoints.

The public names (``__all__``) are what a service's code uses (``docs/api.md``). The
machinery that runs a service (the dispatcher, its socket loop, checkpoints) is imported
from its modules by the commands and the test runner; the two names re-exported here
besides (``Dispatcher``, ``load_service``) stay importable from the package for the code
that imports them so, and are not public.
"""

from .dispatcher import Dispatcher as Dispatcher
from .errors import (
    BindingError,
    CheckpointFormatError,
    DeterminismError,
    ImpulseDuringRecoveryError,
    MethodIdCollisionError,
    RemoteError,
    UnknownMethodError,
)
from .immortal import Immortal, background, method_id_for, rpc
from .loading import load_service as load_service

__all__ = [
    "BindingError",
    "CheckpointFormatError",
    "DeterminismError",
    "Immortal",
    "ImpulseDuringRecoveryError",
    "MethodIdCollisionError",
    "RemoteError",
    "UnknownMethodError",
    "background",
    "method_id_for",
    "rpc",
]
