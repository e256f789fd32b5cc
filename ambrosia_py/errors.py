"""The errors a service's code and a client program catch, in one place.

    from ambrosia_py.errors import CallTimeoutError, DeterminismError

Each is defined once, in the package that raises it (``binding/errors.py``,
``ingress/errors.py``), and importable from there too; the classes are the same objects.
They are pickled by those modules' names (a handler's exception travels to its caller
pickled), so they stay defined there. ``docs/api.md`` lists them with what raises each.
Nothing in the framework imports this module: it is for users.
"""

from .binding.errors import (
    BindingError,
    DeterminismError,
    ImpulseDuringRecoveryError,
    MethodIdCollisionError,
    RemoteError,
    UnknownMethodError,
)
from .ingress.errors import (
    AuthenticationError,
    CallRefusedError,
    CallTimeoutError,
    ClientClosedError,
    IngressError,
    IngressProtocolError,
    KeyReusedError,
    ServiceUnreachableError,
)

__all__ = [
    "AuthenticationError",
    "BindingError",
    "CallRefusedError",
    "CallTimeoutError",
    "ClientClosedError",
    "DeterminismError",
    "ImpulseDuringRecoveryError",
    "IngressError",
    "IngressProtocolError",
    "KeyReusedError",
    "MethodIdCollisionError",
    "RemoteError",
    "ServiceUnreachableError",
    "UnknownMethodError",
]
