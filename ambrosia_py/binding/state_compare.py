"""Comparing two states of an immortal by value, and finding where their order differs.

``replay --verify`` asks two questions of two states: are they equal, and would a handler
that iterates them see the same order? The first is a comparison by value, structure by
structure, so that two sets with the same members are equal whatever their pickled
bytes (a set rebuilt by unpickling and then extended lays out its members differently
from one grown by adds). The second is separate: a set, or a dict, with equal members in
another order is not a difference of state, but a handler that iterates it can act
differently after a recovery than without one. Each is reported with the path to it
(``orders['a'].lines[2]``).

The walk knows the built-in containers, attrs and plain objects (their attributes, or
what their own ``__getstate__`` says their state is, as a checkpoint holds it); other
values are compared with their own ``==`` when it gives a truth value, else by
their pickled bytes. Floats compare as the handler would see them: ``-0.0`` differs from
``0.0``, and a NaN equals a NaN.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable
from typing import Any

import attrs
import cloudpickle

__all__ = ["Comparison", "Difference", "OrderHazard", "compare_states", "short_repr"]

_MAX_DIFFERENCES = 8  # reported; the walk stops there
_SHOWN = 3  # members named per difference
_SCALARS = (type(None), bool, int, str, bytes, complex, range)
_IDENTITY_EQ: Any = object.__eq__  # a class that keeps it compares by identity
_DEFAULT_GETSTATE: Any = object.__getstate__  # a class that keeps it pickles its __dict__
_UNSET: Any = object()  # an attribute one of two objects does not have


@attrs.frozen
class Difference:
    """Two values at ``path`` that are not equal."""

    path: str
    details: str

    def __str__(self) -> str:
        return f"{self.path}: {self.details}"


@attrs.frozen
class OrderHazard:
    """A set or dict at ``path`` with equal members that iterates in another order."""

    path: str
    kind: str  # "set", "frozenset", "dict", ...
    size: int

    @property
    def fix(self) -> str:
        return f"iterate sorted(self.{self.path})"

    def __str__(self) -> str:
        return f"{self.path} (a {self.kind} of {self.size:,} members) iterates in another order"


@attrs.frozen
class Comparison:
    differences: tuple[Difference, ...]
    hazards: tuple[OrderHazard, ...]

    @property
    def equal(self) -> bool:
        return not self.differences

    def describe(self) -> str:
        return "; ".join(str(d) for d in self.differences)


def compare_states(a: dict[str, Any], b: dict[str, Any]) -> Comparison:
    """Compare two immortals' states (attribute name -> value) by value."""
    walk = _Walk()
    for key in sorted(set(a) | set(b)):
        if key not in a or key not in b:
            walk.differ(key, f"only in {'the first' if key in a else 'the second'} state")
        else:
            walk.values(a[key], b[key], key)
    return Comparison(tuple(walk.differences), tuple(walk.hazards))


class _Walk:
    def __init__(self) -> None:
        self.differences: list[Difference] = []
        self.hazards: list[OrderHazard] = []
        self._seen: set[tuple[int, int]] = set()

    def differ(self, path: str, details: str) -> None:
        if len(self.differences) < _MAX_DIFFERENCES:
            self.differences.append(Difference(path, details))

    def values(self, a: Any, b: Any, path: str) -> None:
        if len(self.differences) >= _MAX_DIFFERENCES:
            return
        ta, tb = type(a), type(b)
        if ta is not tb:
            values = f"{short_repr(a)} vs {short_repr(b)}"
            self.differ(path, f"a {ta.__name__} vs a {tb.__name__} ({values})")
            return
        if ta in _SCALARS:
            if a != b:
                self.differ(path, f"{short_repr(a)} vs {short_repr(b)}")
            return
        if ta is float:
            if not _same_float(a, b):
                self.differ(path, f"{a!r} vs {b!r}")
            return
        pair = (id(a), id(b))
        if pair in self._seen:  # a cycle, or a value shared by two attributes
            return
        self._seen.add(pair)
        if isinstance(a, dict):
            self._mapping(a, b, path)
        elif isinstance(a, set | frozenset):
            self._set(a, b, path)
        elif isinstance(a, list | tuple | collections.deque):
            self._sequence(a, b, path)
        else:
            self._object(a, b, path)

    def _mapping(self, a: dict[Any, Any], b: dict[Any, Any], path: str) -> None:
        only_a = [k for k in a if k not in b]
        only_b = [k for k in b if k not in a]
        if only_a or only_b:
            self.differ(path, _members_apart("keys", only_a, only_b, len(a), len(b)))
            return
        for key in a:
            self.values(a[key], b[key], f"{path}[{key!r}]")
        if list(a) != list(b):
            self.hazards.append(OrderHazard(path, type(a).__name__, len(a)))

    def _set(self, a: set[Any] | frozenset[Any], b: set[Any] | frozenset[Any], path: str) -> None:
        if a != b:
            only_a, only_b = list(a - b), list(b - a)
            self.differ(path, _members_apart("members", only_a, only_b, len(a), len(b)))
        elif list(a) != list(b):
            self.hazards.append(OrderHazard(path, type(a).__name__, len(a)))

    def _sequence(self, a: Iterable[Any], b: Iterable[Any], path: str) -> None:
        la, lb = list(a), list(b)
        if len(la) != len(lb):
            values = f"{short_repr(a)} vs {short_repr(b)}"
            self.differ(path, f"{len(la):,} items vs {len(lb):,} ({values})")
            return
        for i, (x, y) in enumerate(zip(la, lb, strict=True)):
            self.values(x, y, f"{path}[{i}]")

    def _object(self, a: Any, b: Any, path: str) -> None:
        pairs = _pickled_state(a, b)
        if pairs is None:
            fields = _fields(a)
            if fields is None:  # no attributes to walk: the value's own equality, or bytes
                if not _opaque_equal(a, b):
                    self.differ(path, f"{short_repr(a)} vs {short_repr(b)}")
                return
            pairs = {name: (getattr(a, name, _UNSET), getattr(b, name, _UNSET)) for name in fields}
        before = len(self.differences)
        for name, (x, y) in pairs.items():
            if x is _UNSET or y is _UNSET:
                if x is not y:
                    self.differ(f"{path}.{name}", "set in only one state")
                continue
            self.values(x, y, f"{path}.{name}")
        if type(a).__eq__ is not _IDENTITY_EQ:
            # The class says what equal means (a cache it leaves out, say): trust it.
            equal = _opaque_equal(a, b)
            if equal and len(self.differences) > before:
                del self.differences[before:]
            elif not equal and len(self.differences) == before:
                self.differ(path, f"{short_repr(a)} vs {short_repr(b)}")


def _pickled_state(a: Any, b: Any) -> dict[str, tuple[Any, Any]] | None:
    """What a class that says what its state is (its own ``__getstate__``) pickles, as
    name -> (value in a, value in b); None for a class that leaves it to the default.
    A cache it leaves out of its checkpoints is not compared either."""
    if type(a).__getstate__ is _DEFAULT_GETSTATE:
        return None
    try:
        sa, sb = a.__getstate__(), b.__getstate__()
    except Exception:  # a __getstate__ that needs more than it has: walk the attributes
        return None
    if not (isinstance(sa, dict) and isinstance(sb, dict)):
        return {"__getstate__()": (sa, sb)}
    return {
        str(k): (sa.get(k, _UNSET), sb.get(k, _UNSET))
        for k in [*sa, *(k for k in sb if k not in sa)]
    }


def _fields(value: Any) -> list[str] | None:
    """The attribute names of a plain or attrs object, or None for anything else."""
    cls = type(value)
    if attrs.has(cls):
        return [f.name for f in attrs.fields(cls)]
    names: list[str] = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        names.extend([slots] if isinstance(slots, str) else list(slots))
    names = [n for n in names if n not in ("__dict__", "__weakref__")]
    state = getattr(value, "__dict__", None)
    if isinstance(state, dict) and cls.__module__ != "builtins":
        names.extend(k for k in state if k not in names)
    elif not names:
        return None
    return names


def _opaque_equal(a: Any, b: Any) -> bool:
    if type(a).__eq__ is not _IDENTITY_EQ:  # identity would call two copies unequal
        try:
            return bool(a == b)
        except Exception:  # no truth value (an array's ==), or a raising __eq__
            pass
    try:
        return bool(cloudpickle.dumps(a) == cloudpickle.dumps(b))
    except Exception:
        return False


def _same_float(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def _members_apart(what: str, only_a: list[Any], only_b: list[Any], na: int, nb: int) -> str:
    parts = []
    for side, only in (("first", only_a), ("second", only_b)):
        if only:
            shown = ", ".join(short_repr(m) for m in _sorted(only)[:_SHOWN])
            more = f" and {len(only) - _SHOWN:,} more" if len(only) > _SHOWN else ""
            parts.append(f"{len(only):,} {what} only in the {side} ({shown}{more})")
    return f"{na:,} {what} vs {nb:,}: " + "; ".join(parts)


def _sorted(values: list[Any]) -> list[Any]:
    try:
        return sorted(values)
    except TypeError:
        return sorted(values, key=repr)


def short_repr(value: Any) -> str:
    """``repr(value)``, cut to 80 characters for a report line."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
