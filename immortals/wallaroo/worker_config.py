"""What the worker is told at start, and what it judges a HELLO by.

:class:`WorkerConfig` is the worker's configuration (logged with each start, so replay
sees what each frame was handled with); :func:`load_app` finds the application it names;
:func:`hello_refusal` is the one rule for a HELLO, shared by the core
(:mod:`.worker_core`) and the edge that screens a connection's first frame before
anything of it is logged (:mod:`.worker_transport`). Sans-IO, as the core is.
"""

from __future__ import annotations

import hmac
import importlib
from collections.abc import Callable
from typing import Any, Final

import attrs

from .codec import DEFAULT_MAX_FRAME_BYTES, DRAFT_VERSION, V3_VERSION, Dialect
from .frames import Hello

__all__ = ["App", "WorkerConfig", "hello_refusal", "load_app"]

App = Callable[[dict[str, Any], bytes], None]
"""The application: called once per message, in log order, with the worker's app state."""

_U32: Final = 2**32 - 1


def load_app(spec: str) -> App | None:
    """The function ``module:function`` names; None for ``""`` (no application).

    ValueError naming the spec for anything else.
    """
    if not spec:
        return None
    module_name, colon, name = spec.partition(":")
    if not colon or not module_name or not name:
        raise ValueError(f"--app {spec!r} is not module:function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"--app {spec!r}: cannot import {module_name}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"--app {spec!r}: {module_name} has no function {name!r}")
    return fn  # type: ignore[no-any-return]


def hello_refusal(hello: Hello, config: WorkerConfig) -> str | None:
    """Why the worker refuses ``hello`` (its ERROR's reason), or None: one rule for the
    core and for the edge, which refuses before anything is logged (:mod:`.worker_transport`)."""
    version = DRAFT_VERSION if config.dialect is Dialect.DRAFT else V3_VERSION
    if hello.version != version:
        shown = hex(hello.version) if isinstance(hello.version, int) else hello.version
        return f"Unknown protocol version: {shown}"
    if not hmac.compare_digest(hello.cookie, config.cookie):
        return "Bad cookie"
    return None


def _positive(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
    if not 1 <= value <= _U32:
        raise ValueError(f"{attribute.name} {value} must be 1..{_U32}")


@attrs.frozen
class WorkerConfig:
    """What the worker is told at start (logged, so replay sees the same)."""

    cookie: bytes = b""
    dialect: Dialect = attrs.field(default=Dialect.DRAFT, converter=Dialect)
    max_credits: int = attrs.field(default=1000, validator=_positive)
    """Credits granted by OK and topped up to by each refill."""
    refill_credits: int = attrs.field(default=500)
    """A refill is due once a connection's credits have fallen to this."""
    max_frame_bytes: int = attrs.field(default=DEFAULT_MAX_FRAME_BYTES, validator=_positive)
    app: str = ""
    """``module:function`` of the application; empty: messages are only tracked."""
    adopt_points: bool = False
    """A stream never seen here starts from the point its NOTIFY carries (a migration
    target: the state of seed 001's step 5 travels through the connector)."""

    @refill_credits.validator
    def _refill_below_max(self, attribute: attrs.Attribute[int], value: int) -> None:
        if not 0 <= value < self.max_credits:
            raise ValueError(f"refill_credits {value} must be 0..max_credits-1")
