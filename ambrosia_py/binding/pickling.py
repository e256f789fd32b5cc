"""Which part of a value cannot be pickled: for errors that name the attribute or argument.

``pickle`` says *what* it cannot pickle (``cannot pickle '_thread.lock' object``) but not
*where* it sits, and in a service's state or a call's arguments the where is what the
author needs: ``conns['a'].sock``. :func:`find_unpicklable` takes the value apart
(containers, and objects' attributes) and returns the deepest part that still fails.
Only called once pickling has failed, so its cost does not matter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import attrs
import cloudpickle

__all__ = ["Unpicklable", "find_unpicklable", "pickle_error"]

_MAX_DEPTH = 8


@attrs.frozen
class Unpicklable:
    """The part of a value that cannot be pickled: where it is, what it is, and why."""

    root: str  # the name the search started from: an attribute, an argument
    path: str  # the part that fails, from the root: "conns['a'].sock"
    type_name: str
    error: str

    def describe(self, what: str) -> str:
        """``what`` (e.g. "state attribute", "argument") named and explained in a phrase."""
        if self.path == self.root:
            return (
                f"{what} {self.root!r} (of type {self.type_name}) cannot be pickled: {self.error}"
            )
        return (
            f"{what} {self.root!r} cannot be pickled: its part {self.path} "
            f"(of type {self.type_name}): {self.error}"
        )


def pickle_error(value: Any, dumps: Callable[[Any], bytes] = cloudpickle.dumps) -> str | None:
    """Why ``value`` cannot be pickled, or None if it can."""
    try:
        dumps(value)
    except Exception as exc:  # pickling raises TypeError, PicklingError, AttributeError...
        return f"{type(exc).__name__}: {exc}"
    return None


def _parts(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield f"{path}[{key!r}]", item
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield f"{path}[{i}]", item
    elif isinstance(value, set | frozenset):
        for item in value:
            yield f"{path} (an element {type(item).__name__})", item
    else:
        attributes = getattr(value, "__dict__", None)
        if isinstance(attributes, dict):
            for key, item in attributes.items():
                yield f"{path}.{key}", item


def find_unpicklable(
    value: Any, name: str, dumps: Callable[[Any], bytes] = cloudpickle.dumps
) -> Unpicklable | None:
    """The deepest part of ``value`` (called ``name``) that cannot be pickled, or None."""
    error = pickle_error(value, dumps)
    if error is None:
        return None
    found = Unpicklable(name, name, type(value).__name__, error)
    for _ in range(_MAX_DEPTH):
        for part_path, part in _parts(value, found.path):
            part_error = pickle_error(part, dumps)
            if part_error is not None:
                value, found = part, Unpicklable(name, part_path, type(part).__name__, part_error)
                break
        else:
            return found
    return found
