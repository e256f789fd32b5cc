"""Hypothesis strategies for the Ockam codecs: every stream-service message, addresses,
routes and TransportMessages, and a way to cut bytes into arbitrary chunks.

Numbers cover the whole 64-bit ``uint`` range but lean towards small values, where the
one-byte varint fast path and the length boundaries (127/128) live. Text never holds
lone surrogates (``st.text`` excludes them), so every string encodes as UTF-8.
"""

from __future__ import annotations

import itertools

from hypothesis import strategies as st

from immortals.ockam import (
    Address,
    CreatePartitionedRequest,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionedInit,
    PartitionIndex,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    Status,
    StreamMessage,
    TransportMessage,
)
from immortals.ockam.bare import MAX_UINT

uints = st.one_of(
    st.integers(0, 300), st.sampled_from([127, 128, 2**63, MAX_UINT]), st.integers(0, MAX_UINT)
)
ints64 = st.integers(-(2**63), 2**63 - 1)
names = st.text(max_size=20)
blobs = st.binary(max_size=64)
opt_names = st.none() | names
opt_uints = st.none() | uints

stream_messages = st.builds(StreamMessage, uints, blobs)

requests = st.one_of(
    st.builds(CreateStreamRequest, opt_names),
    st.builds(CreatePartitionedRequest, opt_names, uints),
    st.builds(PushRequest, uints, blobs),
    st.builds(PullRequest, uints, uints, uints),
    st.builds(GetIndex, names, names),
    st.builds(SaveIndex, names, names, uints),
    st.builds(GetPartitionIndex, names, names, uints),
    st.builds(SavePartitionIndex, names, names, uints, uints),
)

responses = st.one_of(
    st.builds(Init, names),
    st.builds(PartitionedInit, names, uints),
    st.builds(PushConfirm, uints, st.sampled_from(Status), uints),
    st.builds(PullResponse, uints, st.lists(stream_messages, max_size=5).map(tuple)),
    st.builds(Index, names, names, opt_uints),
    st.builds(PartitionIndex, names, names, uints, opt_uints),
    st.builds(Error, names),
)

addresses = st.one_of(
    st.builds(Address.local, names),
    st.builds(
        Address.tcp, st.sampled_from(["127.0.0.1", "localhost", "::1"]), st.integers(0, 65535)
    ),
    st.builds(Address, st.integers(0, 255), st.binary(max_size=16)),
)
routes = st.lists(addresses, max_size=4).map(tuple)
transport_messages = st.builds(TransportMessage, st.just(1), routes, routes, blobs)


@st.composite
def chunked(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut at arbitrary points (empty chunks included)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=8)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]
