"""Hypothesis strategies for the Wallaroo connector codec: every frame of each dialect,
and a way to cut bytes into arbitrary chunks.

``frames(dialect)`` draws only frames the dialect can express (see the codec's module
docstring): no NACK, MIGRATE or MIGRATION_ACK, flags, absent event times or empty keys
and payloads in v3; no EOS_MESSAGE, keys or boundaries with an event time in the draft.
Numbers cover their whole width but lean to small values and the edges. Text never holds
lone surrogates (``st.text`` excludes them), so every string encodes as UTF-8.
"""

from __future__ import annotations

import functools
import itertools
import operator

from hypothesis import strategies as st

from immortals.wallaroo import (
    Ack,
    Dialect,
    EosMessage,
    Error,
    Frame,
    Hello,
    Message,
    MessageFlags,
    Migrate,
    MigrationAck,
    Nack,
    Notify,
    NotifyAck,
    Ok,
    Restart,
)


def _uints(bits: int) -> st.SearchStrategy[int]:
    top = 2**bits - 1
    return st.one_of(st.integers(0, 300), st.sampled_from([0, top, top - 1]), st.integers(0, top))


u16s = _uints(16)
u32s = _uints(32)
u64s = _uints(64)
u128s = _uints(128)
i64s = st.one_of(
    st.integers(-300, 300),
    st.sampled_from([-(2**63), 2**63 - 1]),
    st.integers(-(2**63), 2**63 - 1),
)
names = st.text(max_size=20)
blobs = st.binary(max_size=64)
nonempty_blobs = st.binary(min_size=1, max_size=64)
pairs = st.lists(st.tuples(u64s, u64s), max_size=4).map(tuple)
sender_flags = st.sampled_from(
    [MessageFlags.EPHEMERAL, MessageFlags.EOS, MessageFlags.UNSTABLE_REFERENCE]
)
flag_sets = st.sets(sender_flags).map(
    lambda fs: functools.reduce(operator.or_, fs, MessageFlags(0))
)


@st.composite
def draft_messages(draw: st.DrawFn) -> Message:
    """A MESSAGE the draft can carry: a payload (maybe an event time) or a boundary."""
    payload = draw(st.none() | blobs)
    event_time = None if payload is None else draw(st.none() | u64s)
    return Message(draw(u64s), draw(u64s), payload, draw(flag_sets), event_time)


v3_messages = st.builds(
    Message,
    u64s,
    u64s,
    st.none() | nonempty_blobs,
    event_time=i64s,
    key=st.none() | st.binary(min_size=1, max_size=16),
)

_COMMON = (
    st.builds(Error, names),
    st.builds(Notify, u64s, names, u64s),
    st.builds(NotifyAck, st.booleans(), u64s, u64s),
    st.builds(Ack, u32s, pairs),
    st.builds(Restart, names),
)

draft_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Hello, u128s, blobs, names, names),
    st.builds(Ok, u32s, pairs),
    *_COMMON,
    draft_messages(),
    st.builds(Nack, u32s, u64s, u64s),
    st.builds(Migrate, names, u16s),
    st.just(MigrationAck()),
)

v3_frames: st.SearchStrategy[Frame] = st.one_of(
    st.builds(Hello, names, blobs, names, names),
    st.builds(Ok, u32s),
    *_COMMON,
    v3_messages,
    st.builds(EosMessage, u64s),
)


def frames(dialect: Dialect) -> st.SearchStrategy[Frame]:
    """Every frame ``dialect`` can express."""
    return draft_frames if dialect is Dialect.DRAFT else v3_frames


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points (empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
