"""The MESSAGE fast path gives exactly what the general decoder gives, or steps aside.

``decode_tagged`` reads a well-formed MESSAGE with one struct and builds it without
validators; anything else goes down the general path. Both are held to each other here:
on every message either dialect can carry, and on every mutation of one.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from immortals.wallaroo import Dialect, Message, MessageFlags, encode
from immortals.wallaroo import primitives as p
from immortals.wallaroo.codec import _BY_TAG, _MESSAGE_TAG, DIALECTS, _fast_message, decode_tagged
from immortals.wallaroo.errors import ProtocolError
from tests.strategies_wallaroo import draft_messages, v3_messages


def general(data: bytes, dialect: Dialect) -> Message:
    """The general path alone: the row's decoder over a cursor."""
    row = _BY_TAG[dialect][data[0]]
    spec = DIALECTS[dialect]
    m = row.decode(p.Cursor(data, 0, spec, row.cls.__name__), spec)
    assert isinstance(m, Message)
    return m


def same(a: Message, b: Message) -> bool:
    """Equal field by field, with the same types (flags an IntFlag, bytes as bytes)."""
    return a == b and type(a.flags) is type(b.flags) and type(a.payload) is type(b.payload)


@settings(max_examples=300)
@given(
    st.sampled_from(list(Dialect)).flatmap(
        lambda d: st.tuples(st.just(d), draft_messages() if d is Dialect.DRAFT else v3_messages)
    )
)
def test_every_message_reads_the_same_both_ways(case: tuple[Dialect, Message]) -> None:
    dialect, m = case
    tagged = encode(m, dialect)[4:]
    fast = _fast_message(tagged, dialect)
    assert fast is not None and same(fast, general(tagged, dialect)) and fast == m
    assert fast.flags == m.flags and isinstance(fast.flags, MessageFlags)


@settings(max_examples=400)
@given(
    st.sampled_from(list(Dialect)),
    st.binary(min_size=0, max_size=40),
)
def test_any_bytes_after_the_tag_agree_with_the_general_path(dialect: Dialect, body: bytes) -> None:
    """Short, reserved or contradictory flags, bytes after a boundary: the fast path
    steps aside and the general path raises (or both read the same message)."""
    tagged = bytes([_MESSAGE_TAG[dialect]]) + body
    fast = _fast_message(tagged, dialect)
    try:
        slow = general(tagged, dialect)
    except ProtocolError:
        assert fast is None
        with pytest.raises(ProtocolError):
            decode_tagged(tagged, dialect)
        return
    assert fast is None or same(fast, slow)
    assert same(decode_tagged(tagged, dialect), slow)  # type: ignore[arg-type]
