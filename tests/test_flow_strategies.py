"""Hypothesis strategies for the flow transport tests (``tests/test_flow_*.py``).

Kept in a ``test_flow_`` module of their own (imported by the other flow tests); the few
tests at the bottom check that the strategies make what the codecs accept.
"""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.flow import (
    MIN_FULL_CONNECT_PACKET_VERSION,
    PROTOCOL_VERSION,
    VERSION_FLAGS_MASK,
    ConnectPacket,
    Token,
)

U16 = st.integers(0, 0xFFFF)
U32 = st.integers(0, 0xFFFF_FFFF)
U64 = st.integers(0, 0xFFFF_FFFF_FFFF_FFFF)
_VERSION_MAX = 0x0FFF_FFFF_FFFF_FFFF  # flags clear

tokens = st.builds(Token, U64, U64)
messages = st.binary(max_size=300)
frames = st.lists(st.tuples(tokens, messages), max_size=8)


@st.composite
def protocol_versions(draw: st.DrawFn, *, full: bool | None = None) -> int:
    """A u64 protocol version, flags included; ``full`` picks a side of the 6.3 boundary."""
    flags = draw(st.integers(0, 15)) << 60
    if full is None:
        full = draw(st.booleans())
    if full:
        version = draw(st.integers(MIN_FULL_CONNECT_PACKET_VERSION, _VERSION_MAX))
    else:
        version = draw(st.integers(0, MIN_FULL_CONNECT_PACKET_VERSION - 1))
    return flags | version


@st.composite
def connect_packets(draw: st.DrawFn, *, version: int | None = None) -> ConnectPacket:
    """Any valid ConnectPacket (a legacy one has no flags and no IPv6 address)."""
    v = draw(protocol_versions()) if version is None else version
    full = v & ~VERSION_FLAGS_MASK >= MIN_FULL_CONNECT_PACKET_VERSION
    return ConnectPacket(
        protocol_version=v,
        canonical_port=draw(U16),
        connection_id=draw(U64),
        canonical_ipv4=draw(U32),
        flags=draw(U16) if full else 0,
        ipv6=draw(st.binary(min_size=16, max_size=16)) if full else bytes(16),
    )


@st.composite
def peer_packets(draw: st.DrawFn) -> ConnectPacket:
    """A ConnectPacket compatible with ours: any flags, any low 16 bits."""
    flags = draw(st.integers(0, 15)) << 60
    version = flags | PROTOCOL_VERSION & ~0xFFFF | draw(U16)
    return draw(connect_packets(version=version))


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """``data`` cut into chunks at arbitrary points (empty chunks left out)."""
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=12)))
    bounds = [0, *cuts, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds) if b > a]


@given(connect_packets())
def test_connect_packets_are_valid(packet: ConnectPacket) -> None:
    assert len(packet.encode()) in (26, 44)


@given(st.data(), st.binary(max_size=50))
def test_splits_rejoin(data: st.DataObject, stream: bytes) -> None:
    chunks = data.draw(splits(stream))
    assert b"".join(chunks) == stream
    assert all(chunks)
