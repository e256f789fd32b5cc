"""ambrosia-py: AMBROSIA-style virtual resiliency for Python.

Subclass :class:`Immortal`, mark handlers with :func:`rpc`, run with ``ambrosia-py run``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .binding.immortal import Immortal, background, rpc

__all__ = ["Immortal", "background", "rpc"]


def __getattr__(name: str) -> Any:
    """The binding's names, imported on first use: every process of the package (the
    ``ambrosia-py`` program above all, ``cli/``) imports this module first, and the
    binding takes a good part of a second to import."""
    if name in __all__:
        from . import binding

        value = getattr(binding, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
