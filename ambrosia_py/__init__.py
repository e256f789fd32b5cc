"""ambrosia-py: AMBROSIA-style virtual resiliency for Python.

Subclass :class:`Immortal`, mark handlers with :func:`rpc`, run with ``ambrosia-py run``.
"""

from .binding import Immortal, background, rpc

__all__ = ["Immortal", "background", "rpc"]
