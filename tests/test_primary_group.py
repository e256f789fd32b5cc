"""An instance's replica group in the registry's store, in both backends (etcd, a real
one started for the module, and a SQLite file): stored once, changed in two steps, and
a term begins only in the group its candidate read. Then the stored value read
strictly."""

from __future__ import annotations

import pytest

from ambrosia_py.coordinator.registry.groups import decode_group, encode_group
from ambrosia_py.coordinator.registry.interface import RegistryError
from ambrosia_py.coordinator.replication import Group
from tests.etcd_server import etcd_server
from tests.test_primary_election import NAME, Elect, elect
from tests.test_registry_backends import backend

__all__ = ["backend", "elect", "etcd_server"]  # fixtures, used through their names

THREE = Group.of({0, 1, 2}, 2)


def test_the_group_is_stored_once_by_whichever_replica_starts_first(elect: Elect) -> None:
    one, two = elect(1), elect(2)
    assert one.group(NAME) is None
    stored = one.found_group(NAME, THREE)
    assert (stored.replicas, stored.k, stored.previous) == (THREE.replicas, 2, None)
    assert stored.version > 0
    # Another start, with other flags: the stored group stands.
    assert two.found_group(NAME, Group.of({0, 1, 2, 3, 4}, 3)) == stored
    assert two.group(NAME) == stored


def test_a_term_begins_only_in_the_group_its_candidate_read(elect: Elect) -> None:
    one, two = elect(1), elect(2)
    stored = one.found_group(NAME, THREE)
    assert one.campaign(NAME, 1, 0, group_version=0) is None  # read before it was stored
    term = one.campaign(NAME, 1, 0, group_version=stored.version)
    assert term is not None
    changing = two.change_group(NAME, frozenset({0, 1, 2, 3}), None, from_version=stored.version)
    one.resign(term)
    assert two.campaign(NAME, 2, 0, group_version=stored.version) is None
    taken = two.campaign(NAME, 2, 0, group_version=changing.version)
    assert taken is not None and taken.epoch > term.epoch
    # A take-over from that term, by a replica that read the group before the change.
    assert one.take_over(NAME, 1, taken, 0, group_version=stored.version) is None
    two.resign(taken)
    assert one.campaign(NAME, 1, 0, group_version=stored.version) is None
    assert one.campaign(NAME, 1, 0, group_version=changing.version) is not None


def test_a_change_begins_from_the_group_read_and_one_at_a_time(elect: Elect) -> None:
    one = elect(1)
    stored = one.found_group(NAME, THREE)
    with pytest.raises(RegistryError, match="changed meanwhile"):
        one.change_group(NAME, frozenset({0, 1, 2, 3}), 3, from_version=stored.version - 1)
    with pytest.raises(RegistryError, match="is replicas 0,1,2 committing on 2 already"):
        one.change_group(NAME, frozenset({0, 1, 2}), None, from_version=stored.version)
    with pytest.raises(RegistryError, match=r"replication ack 4 is not in 1\.\.3"):
        one.change_group(NAME, frozenset({0, 1, 3}), 4, from_version=stored.version)
    changing = one.change_group(NAME, frozenset({0, 1, 3}), None, from_version=stored.version)
    assert changing.version > stored.version
    assert changing == Group.of(
        {0, 1, 3}, 2, version=changing.version, previous=Group.of(THREE.replicas, 2)
    )
    assert one.group(NAME) == changing
    with pytest.raises(RegistryError, match="a change of the group of 'svc' is under way"):
        one.change_group(NAME, frozenset({0, 1}), None, from_version=changing.version)


def test_the_primary_of_a_term_of_the_change_settles_it(elect: Elect) -> None:
    one, two = elect(1), elect(2)
    stored = one.found_group(NAME, THREE)
    changing = one.change_group(NAME, frozenset({1, 2}), None, from_version=stored.version)
    term = one.campaign(NAME, 1, 0, group_version=changing.version)
    assert term is not None
    assert two.settle_group(term, changing) is None  # not its term
    assert one.settle_group(term, stored) is None  # not the stored group
    settled = one.settle_group(term, changing)
    assert settled is not None and settled.version > changing.version
    assert (settled.replicas, settled.k, settled.previous) == (frozenset({1, 2}), 2, None)
    assert two.group(NAME) == settled
    assert one.settle_group(term, changing) is None  # once
    # A term begun before the settlement is over once another begins: it settles nothing.
    one.resign(term)
    again = one.change_group(NAME, frozenset({1, 2, 3}), None, from_version=settled.version)
    later = two.campaign(NAME, 2, 0, group_version=again.version)
    assert later is not None
    assert one.settle_group(term, again) is None


def test_the_primary_renews_its_term_in_the_changed_group(elect: Elect) -> None:
    one, two = elect(1), elect(2)
    stored = one.found_group(NAME, THREE)
    term = one.campaign(NAME, 1, 0, group_version=stored.version)
    assert term is not None
    changing = two.change_group(NAME, frozenset({1, 2, 3}), None, from_version=stored.version)
    assert one.renew(term, 40, group_version=stored.version) is None  # the group moved on
    assert two.renew(term, 40, group_version=changing.version) is None  # not its term
    renewed = one.renew(term, 40, group_version=changing.version)
    assert renewed is not None
    assert (renewed.replica, renewed.log_position) == (1, 40) and renewed.epoch > term.epoch
    assert two.current(NAME) == renewed and one.still_primary(renewed)
    assert not one.still_primary(term)
    assert one.renew(term, 41, group_version=changing.version) is None  # once
    assert one.settle_group(renewed, changing) is not None
    one.resign(renewed)
    assert two.current(NAME) is None


def test_the_stored_value_round_trips_with_the_stores_version() -> None:
    changing = Group.of({0, 1, 3}, 2, version=9, previous=Group.of({0, 1, 2}, 2))
    raw = encode_group(changing)
    assert raw == (
        b'{"ack":2,"previous":{"ack":2,"replicas":[0,1,2]},"replicas":[0,1,3]}'
    )  # fmt: skip
    assert decode_group(raw, 9, "here") == changing


@pytest.mark.parametrize(
    ("raw", "words"),
    [
        (b"not json", "here: the value is not JSON"),
        (b"[1]", "here: the value is not a JSON object"),
        (b'{"replicas":[0],"ack":1}', "here: field 'previous' is missing"),
        (b'{"replicas":[0],"ack":1,"previous":null,"x":1}', "here: field 'x' is not known"),
        (b'{"replicas":[1,0],"ack":1,"previous":null}', "not 1 to 255 replica numbers in"),
        (b'{"replicas":[],"ack":1,"previous":null}', "field 'replicas' is []"),
        (b'{"replicas":[0,true],"ack":1,"previous":null}', "field 'replicas' is [0, True]"),
        (b'{"replicas":[0,1],"ack":3,"previous":null}', "field 'ack' is 3, not in 1..2"),
        (b'{"replicas":[0],"ack":1,"previous":{"replicas":[0]}}', "'previous': field 'ack'"),
        (b'{"replicas":[0],"ack":1,"ack":1,"previous":null}', "field 'ack' appears twice"),
        (b'{"replicas":[0],"ack":NaN,"previous":null}', "NaN is not a number JSON allows"),
    ],
)
def test_a_stored_value_not_a_group_is_refused_naming_where(raw: bytes, words: str) -> None:
    with pytest.raises(RegistryError, match=r"^here\b") as caught:
        decode_group(raw, 1, "here")
    assert words in str(caught.value)
