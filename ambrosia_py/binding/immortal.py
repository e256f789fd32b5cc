"""The programming model: subclass :class:`Immortal`, mark handlers with :func:`rpc`.

An immortal's attributes are its state; checkpoints hold them and replay rebuilds them.
Handlers see only logged input and talk to the outside world only through
:meth:`Immortal.effect`; code that needs clocks, sockets or files runs in methods marked
:func:`background`, which start once the immortal is primary and feed it through
impulses (``self.impulse.method(...)``). ``docs/binding.md`` explains the boundary.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, overload

import attrs
import xxhash

from .codec import CodecName, signature_of
from .errors import MethodIdCollisionError

if TYPE_CHECKING:
    from .dispatcher import Dispatcher

__all__ = [
    "CallFuture",
    "Immortal",
    "MethodSpec",
    "Proxy",
    "background",
    "method_id_for",
    "rpc",
    "rpc_spec",
]

F = TypeVar("F", bound=Callable[..., Any])
_SPEC_ATTR = "__ambrosia_rpc__"
_BACKGROUND_ATTR = "__ambrosia_background__"


def method_id_for(name: str) -> int:
    """The default method id: a stable 31-bit hash of the name (negative ids are reserved)."""
    return int(xxhash.xxh32_intdigest(name.encode())) & 0x7FFFFFFF


@attrs.frozen
class MethodSpec:
    """One @rpc method: its name, wire id, codec and signature (without ``self``)."""

    name: str
    id: int
    codec: CodecName
    is_async: bool
    signature: inspect.Signature = attrs.field(eq=False)


@overload
def rpc(fn: F, /) -> F: ...
@overload
def rpc(*, id: int | None = None, codec: CodecName = "pickle") -> Callable[[F], F]: ...
def rpc(
    fn: F | None = None, /, *, id: int | None = None, codec: CodecName = "pickle"
) -> F | Callable[[F], F]:
    """Mark a method as a handler other immortals (and this one) can call.

    ``id`` fixes the method id (default: derived from the name, stable across restarts
    and code changes); ``codec`` is ``"pickle"`` or ``"json"`` (the released Node
    binding's format, for calls across languages).
    """
    if codec not in ("pickle", "json"):
        raise ValueError(f"unknown codec {codec!r}")
    if id is not None and not 0 <= id <= 0x7FFFFFFF:
        raise ValueError(f"method id {id} outside 0..2**31-1 (negative ids are reserved)")

    def mark(f: F) -> F:
        spec = MethodSpec(
            f.__name__,
            method_id_for(f.__name__) if id is None else id,
            codec,
            inspect.iscoroutinefunction(f),
            signature_of(f),
        )
        setattr(f, _SPEC_ATTR, spec)
        return f

    return mark(fn) if fn is not None else mark


def rpc_spec(fn: Callable[..., Any]) -> MethodSpec | None:
    """The :class:`MethodSpec` of a method marked with :func:`rpc` (``Service.method``),
    or None for anything else."""
    spec = getattr(fn, _SPEC_ATTR, None)
    return spec if isinstance(spec, MethodSpec) else None


BACKGROUND_POLICIES = ("stop", "restart")  # binding/background_tasks.py: BackgroundFailure


@overload
def background(fn: F, /) -> F: ...


@overload
def background(*, on_failure: str) -> Callable[[F], F]: ...


def background(fn: F | None = None, /, *, on_failure: str | None = None) -> F | Callable[[F], F]:
    """Mark an ``async def`` method to run on the real event loop once primary.

    ``@background(on_failure="restart")`` (or ``"stop"``) sets what this task's failure
    does, whatever ``run --background-failure`` says for the others: a feed that may
    retry its connection can restart while a front end whose loss must stop the service
    stops it (``binding/background_tasks.py``)."""
    if on_failure is not None and on_failure not in BACKGROUND_POLICIES:
        raise ValueError(
            f"@background(on_failure={on_failure!r}): it takes one of {BACKGROUND_POLICIES}"
        )

    def mark(method: F) -> F:
        if not inspect.iscoroutinefunction(method):
            raise TypeError(f"@background needs an async def method, not {method!r}")
        setattr(method, _BACKGROUND_ATTR, on_failure or True)
        return method

    return mark if fn is None else mark(fn)


def background_policy(method: Callable[..., Any]) -> str | None:
    """The ``on_failure`` a ``@background`` method was given, or None (run's policy)."""
    policy = getattr(method, _BACKGROUND_ATTR, None)
    return policy if isinstance(policy, str) else None


class CallFuture:
    """What ``await proxy.method(...)`` waits on: the reply to call ``call_seq``.

    ``callee`` is the instance the call went to: the only sender whose reply is taken.
    """

    __slots__ = ("call_seq", "callee", "method")

    def __init__(self, call_seq: int, method: MethodSpec, callee: str) -> None:
        self.call_seq = call_seq
        self.method = method
        self.callee = callee

    def __await__(self) -> Generator[CallFuture, Any, Any]:
        return (yield self)


class _MethodRef:
    def __init__(self, proxy: Proxy, spec: MethodSpec) -> None:
        self._proxy = proxy
        self._spec = spec

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        """An async/await call: ``await`` it for the value (or the remote exception)."""
        return self._proxy._dispatcher.call(self._proxy._destination, self._spec, args, kwargs)

    def fork(self, *args: Any, **kwargs: Any) -> None:
        """A fire-and-forget call."""
        self._proxy._dispatcher.fork(self._proxy._destination, self._spec, args, kwargs)


class Proxy:
    """Calls to one immortal instance whose handlers are those of ``target``."""

    def __init__(self, dispatcher: Dispatcher, destination: str, target: type[Immortal]) -> None:
        self._dispatcher = dispatcher
        self._destination = destination
        self._target = target

    def __getattr__(self, name: str) -> _MethodRef:
        spec = self._target.rpc_methods_by_name().get(name)
        if spec is None:
            raise AttributeError(f"{self._target.__name__} has no @rpc method {name!r}")
        ref = self.__dict__[name] = _MethodRef(self, spec)  # found directly next time
        return ref


class _ImpulseMethod:
    def __init__(self, immortal: Immortal, spec: MethodSpec) -> None:
        self._immortal = immortal
        self._spec = spec

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self._immortal._dispatcher().impulse(self._spec, args, kwargs)


class _Impulses:
    def __init__(self, immortal: Immortal) -> None:
        self._immortal = immortal

    def __getattr__(self, name: str) -> _ImpulseMethod:
        spec = type(self._immortal).rpc_methods_by_name().get(name)
        if spec is None:
            raise AttributeError(f"{type(self._immortal).__name__} has no @rpc method {name!r}")
        return _ImpulseMethod(self._immortal, spec)


class Immortal:
    """Base class of immortal services. Attributes are state; see the module docstring.

    ``version`` numbers the shape of the state; a class that changes it defines
    :meth:`upgrade_state` to convert the previous version's state (used by the
    coordinator's ``--upgrade-version`` and by ``ambrosia-py debug --test-upgrade``).
    """

    version: ClassVar[int] = 0
    _rpc_by_id: ClassVar[dict[int, MethodSpec]] = {}
    _rpc_by_name: ClassVar[dict[str, MethodSpec]] = {}
    # The synchronous handlers with pickled arguments, by method id: their names (the
    # dispatcher runs these on its shortest path).
    _plain_by_id: ClassVar[dict[int, str]] = {}
    # Whether any handler is ``async def``: only those can be suspended at a checkpoint,
    # so without one the dispatcher never needs a base for a checkpoint's tail.
    _any_async: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        by_id: dict[int, MethodSpec] = {}
        by_name: dict[str, MethodSpec] = {}
        for klass in reversed(cls.__mro__):
            for name, value in vars(klass).items():
                spec = getattr(value, _SPEC_ATTR, None)
                if isinstance(spec, MethodSpec):
                    by_name[name] = spec
        for spec in by_name.values():
            other = by_id.get(spec.id)
            if other is not None:
                raise MethodIdCollisionError(
                    f"{cls.__name__}: @rpc methods {other.name!r} and {spec.name!r} both have "
                    f"method id {spec.id}; give one of them @rpc(id=...)"
                )
            by_id[spec.id] = spec
        cls._rpc_by_id = by_id
        cls._rpc_by_name = by_name
        cls._plain_by_id = {
            i: spec.name
            for i, spec in by_id.items()
            if not spec.is_async and spec.codec == "pickle"
        }
        cls._any_async = any(spec.is_async for spec in by_id.values())

    @classmethod
    def rpc_methods(cls) -> dict[int, MethodSpec]:
        """The handlers by method id."""
        return cls._rpc_by_id

    @classmethod
    def rpc_methods_by_name(cls) -> dict[str, MethodSpec]:
        return cls._rpc_by_name

    @classmethod
    def background_methods(cls) -> list[str]:
        return [
            name for name in dir(cls) if getattr(getattr(cls, name, None), _BACKGROUND_ATTR, False)
        ]

    @classmethod
    def option_fields(cls) -> list[tuple[str, type, Any]]:
        """The service options: the annotated fields of a nested ``Options`` class."""
        options = getattr(cls, "Options", None)
        if options is None:
            return []
        hints = typing.get_type_hints(options)
        return [(name, hints[name], getattr(options, name, None)) for name in hints]

    @classmethod
    def make_options(cls, **values: Any) -> Any:
        """An ``Options`` instance: the declared defaults, overridden by ``values``."""
        options_cls = getattr(cls, "Options", None)
        if options_cls is None:
            if values:
                raise TypeError(f"{cls.__name__} declares no options, got {sorted(values)}")
            return None
        fields = {name for name, _, _ in cls.option_fields()}
        unknown = set(values) - fields
        if unknown:
            raise TypeError(f"{cls.__name__} has no option {sorted(unknown)}")
        options = options_cls()
        for name in fields:
            setattr(options, name, values.get(name, getattr(options_cls, name, None)))
        return options

    @classmethod
    def upgrade_state(cls, state: dict[str, Any], from_version: int) -> dict[str, Any]:
        """Convert the state of an older version of this class; default: unchanged."""
        return state

    def on_first_start(self) -> None:
        """Runs once, deterministically, on first start, before the first checkpoint."""

    # -- talking to immortals ------------------------------------------------------------

    def _dispatcher(self) -> Dispatcher:
        d: Dispatcher | None = self.__dict__.get("_ambrosia_dispatcher")
        if d is None:
            raise RuntimeError(f"{type(self).__name__} is not running under a binding")
        return d

    @property
    def me(self) -> Proxy:
        """A proxy for this immortal itself (self-calls)."""
        d = self._dispatcher()
        if d.me is None or d.me._target is not type(self):  # made anew after an upgrade
            d.me = Proxy(d, "", type(self))
        return d.me

    def proxy(self, instance: str, target: type[Immortal]) -> Proxy:
        """A proxy for the immortal ``instance``, whose handlers are ``target``'s."""
        return Proxy(self._dispatcher(), instance, target)

    @property
    def impulse(self) -> _Impulses:
        """Impulses to this immortal, from background tasks only (input from outside)."""
        return _Impulses(self)

    @property
    def instance_name(self) -> str:
        return self._dispatcher().instance

    @property
    def local(self) -> types.SimpleNamespace:
        """This incarnation's own things: the servers, connections and clients its
        ``@background`` tasks open and its effects use. Never checkpointed nor compared,
        and empty again in every new process; a handler must not read it (it is not
        logged input), only hand it to an effect: ``self.effect(self.send, reply)`` with
        ``send`` reading ``self.local``."""
        local: types.SimpleNamespace | None = self.__dict__.get("_ambrosia_local")
        if local is None:  # the framework's prefix: left out of the state (dispatch_state)
            local = self.__dict__["_ambrosia_local"] = types.SimpleNamespace()
        return local

    @property
    def options(self) -> Any:
        """The service options this incarnation was started with (see ``option_fields``).

        Options configure the outside world (ports, paths) for background tasks; they are
        not state and not checkpointed, so handlers must not let them change outcomes.
        """
        return self._dispatcher().options

    def effect(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` in the outside world after this handler, unless replaying.

        Effects belong to the incarnation that handles a message for the first time:
        replay suppresses them, so an effect runs at most once per logged message.
        """
        self._dispatcher().effect(fn, args)
