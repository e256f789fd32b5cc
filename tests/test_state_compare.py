"""Comparing immortals' states by value (``replay --verify``'s judge)."""

from __future__ import annotations

import math
import pickle
from typing import Any

import attrs

from ambrosia_py.binding.state_compare import compare_states


class Order:
    def __init__(self, lines: list[int]) -> None:
        self.lines = lines


@attrs.define
class Account:
    owner: str
    tags: set[int]


class Cached:
    """Equal when ``value`` is: ``cache`` is not part of what the class calls equal."""

    def __init__(self, value: int, cache: int) -> None:
        self.value = value
        self.cache = cache

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Cached) and other.value == self.value

    __hash__ = None  # type: ignore[assignment]


def _reordered_set(n: int) -> tuple[set[int], set[int]]:
    """Two sets of the same members that iterate in different orders. Ints, whose hashes
    no hash seed salts (strings' would make this depend on the run's seed): multiples of
    8 collide in a small table, so a set rebuilt by unpickling and then extended places
    them otherwise than one grown by adds."""
    for size in range(n, n + 200):
        grown: set[int] = set()
        for i in range(size):
            grown.add(i * 8)
        rebuilt = pickle.loads(pickle.dumps(grown))
        rebuilt.update(range(1, 400, 8))
        grown.update(range(1, 400, 8))
        if list(grown) != list(rebuilt):
            return grown, rebuilt
    raise AssertionError("no size gave two orders")


def test_equal_sets_in_another_order_are_equal_with_a_hazard() -> None:
    grown, rebuilt = _reordered_set(500)
    result = compare_states({"seen": grown}, {"seen": rebuilt})
    assert result.equal
    assert [(h.path, h.kind, h.size) for h in result.hazards] == [("seen", "set", len(grown))]
    assert result.hazards[0].fix == "iterate sorted(self.seen)"


def test_a_dict_in_another_key_order_is_equal_with_a_hazard() -> None:
    result = compare_states({"d": {"a": 1, "b": 2}}, {"d": {"b": 2, "a": 1}})
    assert result.equal and [h.path for h in result.hazards] == ["d"]


def test_same_order_has_no_hazard() -> None:
    result = compare_states({"s": {1, 2, 3}, "d": {"a": [1]}}, {"s": {1, 2, 3}, "d": {"a": [1]}})
    assert result.equal and not result.hazards


def test_the_path_names_the_value_that_differs() -> None:
    a = {"orders": {"a": Order([1, 2, 3])}}
    b = {"orders": {"a": Order([1, 2, 4])}}
    result = compare_states(a, b)
    assert [str(d) for d in result.differences] == ["orders['a'].lines[2]: 3 vs 4"]


def test_sets_that_differ_name_their_members() -> None:
    result = compare_states({"s": {"a", "b", "c"}}, {"s": {"a", "d"}})
    assert result.describe() == (
        "s: 3 members vs 2: 2 members only in the first ('b', 'c'); "
        "1 members only in the second ('d')"
    )


def test_missing_attribute_and_other_type() -> None:
    result = compare_states({"a": 1, "b": 1}, {"a": 1.0})
    assert [str(d) for d in result.differences] == [
        "a: a int vs a float (1 vs 1.0)",
        "b: only in the first state",
    ]


def test_floats_compare_as_a_handler_sees_them() -> None:
    assert compare_states({"x": math.nan}, {"x": math.nan}).equal
    assert not compare_states({"x": 0.0}, {"x": -0.0}).equal
    assert compare_states({"x": 0.5}, {"x": 0.5}).equal


def test_attrs_classes_are_walked() -> None:
    grown, rebuilt = _reordered_set(300)
    result = compare_states({"acct": Account("ann", grown)}, {"acct": Account("ann", rebuilt)})
    assert result.equal and [h.path for h in result.hazards] == ["acct.tags"]
    other = compare_states({"acct": Account("ann", set())}, {"acct": Account("bob", set())})
    assert [str(d) for d in other.differences] == ["acct.owner: 'ann' vs 'bob'"]


def test_a_class_that_defines_equality_is_trusted() -> None:
    assert compare_states({"c": Cached(1, 10)}, {"c": Cached(1, 20)}).equal
    result = compare_states({"c": Cached(1, 10)}, {"c": Cached(2, 10)})
    assert [d.path for d in result.differences] == ["c.value"]


def test_values_without_equality_compare_by_their_bytes() -> None:
    def f(x: int) -> int:
        return x + 1

    def g(x: int) -> int:
        return x + 2

    assert compare_states({"fn": f}, {"fn": f}).equal
    assert not compare_states({"fn": f}, {"fn": g}).equal


def test_cycles_end() -> None:
    a: list[Any] = [1]
    a.append(a)
    b: list[Any] = [1]
    b.append(b)
    assert compare_states({"loop": a}, {"loop": b}).equal


class WithCache:
    """Pickles without its cache, as a checkpoint holds it."""

    def __init__(self, total: int, cache: dict[str, int]) -> None:
        self.total = total
        self._cache = cache

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_cache"]
        return state


def test_what_a_class_pickles_is_its_state() -> None:
    assert compare_states({"w": WithCache(1, {"a": 1})}, {"w": WithCache(1, {})}).equal
    result = compare_states({"w": WithCache(1, {})}, {"w": WithCache(2, {})})
    assert [str(d) for d in result.differences] == ["w.total: 1 vs 2"]
