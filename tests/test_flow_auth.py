"""The link handshake and frame tags (coordinator/links/auth.py), byte by byte, and every
decoder a peer reaches before it has authenticated, fuzzed: the ConnectPacket parser,
the frame header reader at the pre-auth limit, and the handshake messages."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.coordinator.links.auth import (
    AUTH_TOKEN,
    TAG_SIZE,
    HandshakeState,
    KeyedMac,
    LinkAuthError,
    LinkChannel,
    LinkHandshake,
    Role,
)
from ambrosia_py.coordinator.links.config import PRE_AUTH_FRAME_LIMIT
from ambrosia_py.coordinator.links.protocol import LINK_TOKEN
from ambrosia_py.flow import (
    FRAME_HEADER_LENGTH,
    ConnectPacket,
    FlowConnection,
    FlowError,
    FrameLengthError,
    FrameReceived,
    frame_checksum,
)

SECRET = bytes(range(100, 132))
N_DIALER = bytes(range(32))
N_ACCEPTOR = bytes(range(32, 64))


def sha(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def pair(
    dialer_secret: bytes = SECRET, acceptor_secret: bytes = SECRET, dest: str = "server"
) -> tuple[LinkHandshake, LinkHandshake]:
    dialer = LinkHandshake(Role.DIALER, dialer_secret, "client", dest, nonce=N_DIALER)
    acceptor = LinkHandshake(Role.ACCEPTOR, acceptor_secret, "server", nonce=N_ACCEPTOR)
    return dialer, acceptor


def test_the_handshake_byte_by_byte() -> None:
    dialer, acceptor = pair()
    challenge = dialer.start()
    assert challenge == b"AMBAUTH1" + b"\x01" + N_DIALER + sha("client") + sha("server")
    assert len(challenge) == 105
    response = acceptor.receive(challenge)
    transcript = challenge + N_ACCEPTOR
    assert response == b"AMBAUTH1\x02" + N_ACCEPTOR + mac(
        SECRET, b"ambrosia-link-v1 acceptor", transcript
    )
    assert response is not None and len(response) == 73
    confirm = dialer.receive(response)
    assert confirm == b"AMBAUTH1\x03" + mac(SECRET, b"ambrosia-link-v1 dialer", transcript)
    assert confirm is not None and len(confirm) == 41
    assert acceptor.receive(confirm) is None
    assert dialer.done and acceptor.done
    assert acceptor.peer_digest == sha("client")
    # The tags: HMAC-SHA256(direction key, u64 counter | token | payload), first 16 bytes.
    to_acceptor = mac(SECRET, b"ambrosia-link-v1 key dialer->acceptor", transcript)
    to_dialer = mac(SECRET, b"ambrosia-link-v1 key acceptor->dialer", transcript)
    out, back = dialer.channel(), acceptor.channel()
    tag = out.seal(LINK_TOKEN, [b"hel", b"lo"])
    assert tag == mac(to_acceptor, struct.pack("<Q", 0), LINK_TOKEN.encode(), b"hello")[:16]
    assert bytes(back.open(LINK_TOKEN, b"hello" + tag)) == b"hello"
    tag = back.seal(LINK_TOKEN, [b"x"])
    assert tag == mac(to_dialer, struct.pack("<Q", 0), LINK_TOKEN.encode(), b"x")[:16]
    assert bytes(out.open(LINK_TOKEN, b"x" + tag)) == b"x"


def test_tags_refuse_tampering_replay_reordering_and_another_token() -> None:
    dialer, acceptor = pair()
    acceptor.receive(dialer.receive(acceptor.receive(dialer.start()) or b"") or b"")
    out, back = dialer.channel(), acceptor.channel()
    first = b"one" + out.seal(LINK_TOKEN, [b"one"])
    second = b"two" + out.seal(LINK_TOKEN, [b"two"])
    with pytest.raises(LinkAuthError, match="frame 0 on the link fails its tag"):
        back.open(LINK_TOKEN, second)  # reordered
    with pytest.raises(LinkAuthError, match="fails its tag"):
        back.open(LINK_TOKEN, b"onf" + first[3:])  # altered
    with pytest.raises(LinkAuthError, match="fails its tag"):
        back.open(AUTH_TOKEN, first)  # to another endpoint
    with pytest.raises(LinkAuthError, match="too short"):
        back.open(LINK_TOKEN, b"short")
    assert bytes(back.open(LINK_TOKEN, first)) == b"one"
    with pytest.raises(LinkAuthError, match="frame 1 on the link fails its tag"):
        back.open(LINK_TOKEN, first)  # replayed
    assert bytes(back.open(LINK_TOKEN, second)) == b"two"


def test_a_wrong_secret_fails_on_either_side() -> None:
    dialer, acceptor = pair(acceptor_secret=b"another secret, 32 bytes long!!!")
    with pytest.raises(LinkAuthError, match="the acceptor's proof does not match"):
        dialer.receive(acceptor.receive(dialer.start()) or b"")
    assert dialer.state is HandshakeState.FAILED
    with pytest.raises(LinkAuthError, match="in state FAILED"):
        dialer.receive(b"")
    with pytest.raises(LinkAuthError, match="no channel"):
        dialer.channel()
    # A dialer without the secret is caught by the acceptor: its CONFIRM is wrong.
    dialer, acceptor = pair(dialer_secret=b"another secret, 32 bytes long!!!")
    response = acceptor.receive(dialer.start())
    assert response is not None
    forged = b"AMBAUTH1\x03" + mac(b"guess" * 8, b"ambrosia-link-v1 dialer", b"")
    with pytest.raises(LinkAuthError, match="the dialer's proof does not match"):
        acceptor.receive(forged)


def test_a_challenge_for_another_instance_is_refused_before_any_proof() -> None:
    dialer, acceptor = pair(dest="elsewhere")
    with pytest.raises(LinkAuthError, match=r"dialed another instance.*this is 'server'"):
        acceptor.receive(dialer.start())


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (b"", "wrong magic"),
        (b"AMBAUTH2" + bytes(97), "wrong magic"),
        (b"AMBAUTH1", "got kind None"),
        (b"AMBAUTH1\x03" + bytes(32), "CHALLENGE \\(kind 1\\), got kind 3"),
        (b"AMBAUTH1\x01" + bytes(95), "CHALLENGE of 104 bytes, not 105"),
        (b"AMBAUTH1\x01" + bytes(97), "CHALLENGE of 106 bytes, not 105"),
    ],
)
def test_malformed_handshake_messages_say_what(message: bytes, reason: str) -> None:
    acceptor = LinkHandshake(Role.ACCEPTOR, SECRET, "server")
    with pytest.raises(LinkAuthError, match=reason):
        acceptor.receive(message)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.binary(max_size=200))
def test_handshake_fuzz_only_documented_errors(first: bytes, second: bytes) -> None:
    acceptor = LinkHandshake(Role.ACCEPTOR, SECRET, "server")
    dialer = LinkHandshake(Role.DIALER, SECRET, "client", "server")
    dialer.start()
    for side, data in ((acceptor, first), (dialer, second), (acceptor, second)):
        with contextlib.suppress(LinkAuthError):
            side.receive(data)
    assert not dialer.done and not acceptor.done


def _connect_bytes() -> bytes:
    return ConnectPacket.current(canonical_port=1, connection_id=7, canonical_ipv4=1).encode()


@settings(max_examples=300)
@given(
    st.one_of(
        st.binary(max_size=3000),
        st.binary(max_size=3000).map(lambda b: _connect_bytes() + b),
        st.tuples(st.integers(0, 2**32 - 1), st.binary(max_size=2000)).map(
            lambda t: _connect_bytes() + struct.pack("<I", t[0]) + t[1]
        ),
    ),
    st.lists(st.integers(1, 700), min_size=1, max_size=20),
    st.booleans(),
)
def test_pre_auth_readers_fuzz_bounded_and_only_documented_errors(
    stream: bytes, cuts: list[int], checksum: bool
) -> None:
    conn = FlowConnection(
        ConnectPacket.current(canonical_port=2, connection_id=1, canonical_ipv4=1),
        dialer=False,
        max_frame_length=PRE_AUTH_FRAME_LIMIT,
        checksum=checksum,
    )
    pos = 0
    try:
        while pos < len(stream):
            n = cuts[pos % len(cuts)]
            for event in conn.receive_data(stream[pos : pos + n]):
                if isinstance(event, FrameReceived):
                    assert len(event.message) <= PRE_AUTH_FRAME_LIMIT - 16
            pos += n
            # Never more held than one ConnectPacket, or one frame at the limit.
            assert conn.buffered < FRAME_HEADER_LENGTH + PRE_AUTH_FRAME_LIMIT
    except FlowError:
        pass


def test_a_huge_declared_frame_is_refused_at_its_header() -> None:
    conn = FlowConnection(
        ConnectPacket.current(canonical_port=2, connection_id=1, canonical_ipv4=1),
        dialer=False,
        max_frame_length=PRE_AUTH_FRAME_LIMIT,
    )
    conn.receive_data(_connect_bytes())
    with pytest.raises(FrameLengthError, match="frame length 104857600 exceeds the limit 1024"):
        conn.receive_data(struct.pack("<I", 100 * 1024 * 1024))
    # Raised once authenticated: the same header is now read on.
    conn = FlowConnection(
        ConnectPacket.current(canonical_port=2, connection_id=1, canonical_ipv4=1),
        dialer=False,
        max_frame_length=PRE_AUTH_FRAME_LIMIT,
    )
    conn.receive_data(_connect_bytes())
    conn.max_frame_length = 200 * 1024 * 1024
    assert conn.receive_data(struct.pack("<I", 100 * 1024 * 1024)) == []


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=4),
    frames_before=st.integers(0, 3),
)
def test_tags_are_the_hmac_of_counter_token_and_message_whatever_its_size(
    sizes: list[int], frames_before: int
) -> None:
    """Every tag is HMAC-SHA256(key, counter | token | message), cut to 16 bytes, whatever
    the message's size and however many parts it is sent in."""
    key = bytes(range(32))
    channel = LinkChannel(send_key=key, receive_key=key)
    for _ in range(frames_before):
        channel.open(LINK_TOKEN, b"" + channel.seal(LINK_TOKEN, []))
    parts = [bytes([n % 251]) * n for n in sizes]
    tag = channel.seal(LINK_TOKEN, parts)
    counter = struct.pack("<Q", frames_before)
    assert tag == mac(key, counter, LINK_TOKEN.encode(), *parts)[:TAG_SIZE]
    assert bytes(channel.open(LINK_TOKEN, b"".join([*parts, tag]))) == b"".join(parts)


@given(key=st.binary(max_size=150), parts=st.lists(st.binary(max_size=300), max_size=4))
def test_a_keyed_mac_is_hmac_sha256_for_any_key_and_parts(key: bytes, parts: list[bytes]) -> None:
    """Keyed once, it gives the one-shot HMAC: keys shorter than SHA-256's block, as long,
    and longer, messages in any number of parts; and the same object gives it again for
    the next message."""
    keyed = KeyedMac(key)
    assert keyed.digest(*parts) == hmac.digest(key, b"".join(parts), "sha256")
    assert keyed.digest(b"next", *parts) == hmac.digest(key, b"".join([b"next", *parts]), "sha256")


@settings(max_examples=60, deadline=None)
@given(size=st.integers(0, 9000))
def test_frame_checksums_are_xxh3_of_token_and_message_whatever_its_size(size: int) -> None:
    token = LINK_TOKEN.encode()
    message = bytes([size % 253]) * size
    assert frame_checksum(token, message) == xxhash.xxh3_64_intdigest(token + message)
    assert frame_checksum(token, memoryview(message)) == frame_checksum(token, message)
