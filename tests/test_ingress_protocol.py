"""The ingress protocol, sans-IO: both ends byte by byte against the layout in
docs/ingress.md (rebuilt here with struct and hmac), round trips in any chunking, and
bad input refused with errors naming the frame and offset; a client without the
secret gets nothing but HELLO and nothing it sends is decoded."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.ingress import (
    PRE_AUTH_FRAME_LIMIT,
    AuthenticationError,
    Call,
    ClientConnection,
    ConnectionState,
    IngressProtocolError,
    Outcome,
    OutcomeKind,
    Refusal,
    RefusalReason,
    Reply,
    ServerConnection,
    ServiceInfo,
)

SECRET = bytes(range(100, 132))
NS = bytes(range(32))  # the server's nonce
NC = bytes(range(32, 64))  # the client's nonce
INFO = ServiceInfo("counter", "Counter", 1 << 20)
MAGIC = b"AMBINGR1"


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def frame(kind: int, body: bytes) -> bytes:
    return struct.pack("<IB", 1 + len(body), kind) + body


TRANSCRIPT = MAGIC + NS + NC
K_TO_SERVER = mac(SECRET, b"ambrosia-ingress-v1 key client->server", TRANSCRIPT)
K_TO_CLIENT = mac(SECRET, b"ambrosia-ingress-v1 key server->client", TRANSCRIPT)


def tagged(key: bytes, counter: int, kind: int, body: bytes) -> bytes:
    tag = mac(key, struct.pack("<Q", counter), bytes([kind]), body)[:16]
    return frame(kind, body + tag)


def hello() -> bytes:
    return frame(1, MAGIC + NS)


def auth(secret: bytes = SECRET) -> bytes:
    return frame(2, MAGIC + NC + mac(secret, b"ambrosia-ingress-v1 client", TRANSCRIPT))


def welcome(secret: bytes = SECRET) -> bytes:
    info = b"\x07counter\x07Counter" + struct.pack("<I", 1 << 20)
    return frame(3, mac(secret, b"ambrosia-ingress-v1 server", TRANSCRIPT, info) + info)


def call_body(request_id: int, key: bytes, method_id: int, args: bytes) -> bytes:
    return struct.pack("<IB", request_id, len(key)) + key + struct.pack("<i", method_id) + args


def open_pair() -> tuple[ServerConnection, ClientConnection]:
    server = ServerConnection(SECRET, INFO, nonce=NS)
    client = ClientConnection(SECRET, nonce=NC)
    client.receive_data(server.data_to_send())
    assert server.receive_data(client.data_to_send()) == []
    assert client.receive_data(server.data_to_send()) == [INFO]
    assert server.state is client.state is ConnectionState.OPEN
    return server, client


# --- the bytes ----------------------------------------------------------------------------


def test_handshake_bytes_match_the_documented_layout() -> None:
    server = ServerConnection(SECRET, INFO, nonce=NS)
    assert server.data_to_send() == hello()
    assert len(hello()) == 4 + 41
    client = ClientConnection(SECRET, nonce=NC)
    assert client.receive_data(hello()) == []
    assert client.data_to_send() == auth()
    assert len(auth()) == 4 + 73
    assert server.receive_data(auth()) == []
    assert server.data_to_send() == welcome()
    assert client.receive_data(welcome()) == [INFO]
    assert client.info == INFO


def test_call_reply_and_refusal_bytes_with_their_tags() -> None:
    server, client = open_pair()
    client.call(7, b"k-1", 0x1234, b"\x80args")
    body = call_body(7, b"k-1", 0x1234, b"\x80args")
    assert client.data_to_send() == tagged(K_TO_SERVER, 0, 16, body)
    client.call(8, b"\xff" * 16, -5, b"")
    second = client.data_to_send()
    assert second == tagged(K_TO_SERVER, 1, 16, call_body(8, b"\xff" * 16, -5, b""))
    assert server.receive_data(tagged(K_TO_SERVER, 0, 16, body) + second) == [
        Call(7, b"k-1", 0x1234, b"\x80args"),
        Call(8, b"\xff" * 16, -5, b""),
    ]

    server.reply(7, Outcome(OutcomeKind.VALUE, b"\x80\x05K\x05."))
    server.reply(8, Refusal(RefusalReason.KEY_REUSED, "key in use"))
    server.reply(9, Outcome(OutcomeKind.NO_VALUE))
    expected = (
        tagged(K_TO_CLIENT, 0, 17, struct.pack("<IB", 7, 1) + b"\x80\x05K\x05.")
        + tagged(K_TO_CLIENT, 1, 18, struct.pack("<IB", 8, 2) + b"key in use")
        + tagged(K_TO_CLIENT, 2, 17, struct.pack("<IB", 9, 2))
    )
    out = server.data_to_send()
    assert out == expected
    assert client.receive_data(out) == [
        Reply(7, Outcome(OutcomeKind.VALUE, b"\x80\x05K\x05.")),
        Reply(8, Refusal(RefusalReason.KEY_REUSED, "key in use")),
        Reply(9, Outcome(OutcomeKind.NO_VALUE)),
    ]


# --- round trips --------------------------------------------------------------------------

calls = st.builds(
    Call,
    st.integers(0, 2**32 - 1),
    st.binary(min_size=1, max_size=255),
    st.integers(-(2**31), 2**31 - 1),
    st.binary(max_size=300),
)
answers = st.one_of(
    st.builds(Outcome, st.sampled_from([OutcomeKind.VALUE, OutcomeKind.EXCEPTION]), st.binary()),
    st.just(Outcome(OutcomeKind.NO_VALUE)),
    st.builds(Refusal, st.sampled_from(list(RefusalReason)), st.text(max_size=50)),
)


def chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@given(st.lists(calls, max_size=8), st.lists(answers, max_size=8), st.lists(st.integers(0, 10**6)))
@settings(max_examples=200)
def test_calls_and_answers_round_trip_in_any_chunking(
    sent: list[Call], replies: list[Outcome | Refusal], cuts: list[int]
) -> None:
    server = ServerConnection(SECRET, INFO)
    client = ClientConnection(SECRET)
    for part in chunks(server.data_to_send(), cuts):
        client.receive_data(part)
    for part in chunks(client.data_to_send(), cuts):
        assert server.receive_data(part) == []
    got_info = [
        e for part in chunks(server.data_to_send(), cuts) for e in client.receive_data(part)
    ]
    assert got_info == [INFO]
    for c in sent:
        client.call(c.request_id, c.key, c.method_id, c.args)
    received = [
        c for part in chunks(client.data_to_send(), cuts) for c in server.receive_data(part)
    ]
    assert received == sent
    for n, answer in enumerate(replies):
        server.reply(n, answer)
    events = [e for part in chunks(server.data_to_send(), cuts) for e in client.receive_data(part)]
    assert events == [Reply(n, a) for n, a in enumerate(replies)]


# --- authentication -----------------------------------------------------------------------


def test_a_client_without_the_secret_gets_nothing_and_nothing_it_sends_is_decoded() -> None:
    server = ServerConnection(SECRET, INFO, nonce=NS)
    server.data_to_send()  # HELLO: random bytes, all anyone gets before proving the secret
    wrong = bytes(32)
    forged_call = tagged(K_TO_SERVER, 0, 16, call_body(1, b"k", 1, b"\x80evil"))
    with pytest.raises(AuthenticationError, match="does not hold this cluster's secret") as err:
        server.receive_data(auth(wrong) + forged_call)
    assert (err.value.frame, err.value.offset) == (0, 0)
    assert server.data_to_send() == b""
    assert server.state is ConnectionState.FAILED
    with pytest.raises(IngressProtocolError, match="failed already"):
        server.receive_data(forged_call)


def test_a_call_before_the_proof_is_refused_as_what_it_is() -> None:
    server = ServerConnection(SECRET, INFO, nonce=NS)
    body = call_body(1, b"k", 1, b"x")
    with pytest.raises(IngressProtocolError, match=r"expected a AUTH frame .* got kind CALL"):
        server.receive_data(frame(16, body))
    assert server.data_to_send() == b""  # a failed connection sends nothing at all


def test_a_server_without_the_secret_is_refused_before_any_call_leaves() -> None:
    client = ClientConnection(SECRET, nonce=NC)
    client.receive_data(hello())
    client.data_to_send()
    with pytest.raises(AuthenticationError, match="server's proof does not match") as err:
        client.receive_data(welcome(bytes(32)))
    assert err.value.frame == 1 and err.value.offset == 45
    with pytest.raises(IngressProtocolError, match="no call in state FAILED"):
        client.call(1, b"k", 1, b"secret arguments")
    assert client.data_to_send() == b""


def test_short_secrets_are_refused() -> None:
    with pytest.raises(ValueError, match="at least 16"):
        ServerConnection(b"short", INFO)
    with pytest.raises(ValueError, match="at least 16"):
        ClientConnection(b"short")


# --- malformed input ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "match", "offset"),
    [
        (struct.pack("<IB", PRE_AUTH_FRAME_LIMIT + 1, 2), "declared length 129: the limit", 0),
        (struct.pack("<IB", 0, 2), "declared length 0", 0),
        (b"GET / HTTP/1.1\r\n", "declared length 542393671", 0),
        (frame(2, b"AMBINGR2" + bytes(64)), "not b'AMBINGR1': not an ingress", 5),
        (frame(2, MAGIC + bytes(63)), "AUTH body of 71 bytes, not 72", 5),
        (frame(9, MAGIC + bytes(64)), "expected a AUTH frame \\(kind 2\\), got kind 9", 4),
    ],
)
def test_bad_handshake_frames_name_what_and_where(data: bytes, match: str, offset: int) -> None:
    server = ServerConnection(SECRET, INFO, nonce=NS)
    with pytest.raises(IngressProtocolError, match=match) as err:
        server.receive_data(data)
    assert err.value.offset == offset and err.value.frame == 0
    assert f"offset {offset}" in str(err.value)


def test_an_oversize_call_is_refused_from_its_length_alone() -> None:
    server, _client = open_pair()
    with pytest.raises(IngressProtocolError, match=f"limit here is 1 to {INFO.max_call_frame}"):
        server.receive_data(struct.pack("<I", INFO.max_call_frame + 1))


@pytest.mark.parametrize(
    ("body", "match", "at"),
    [
        (struct.pack("<I", 1), "too short for its request id and key", 0),
        (struct.pack("<IB", 1, 0) + bytes(4), "empty idempotency key", 4),
        (struct.pack("<IB", 1, 5) + b"abc", "ends inside its 5-byte key or method id", 4),
    ],
)
def test_malformed_calls_name_the_frame_and_offset(body: bytes, match: str, at: int) -> None:
    server, _client = open_pair()
    with pytest.raises(IngressProtocolError, match=match) as err:
        server.receive_data(tagged(K_TO_SERVER, 0, 16, body))
    assert err.value.frame == 1  # the AUTH was frame 0
    assert err.value.offset == 4 + 73 + 5 + at


def test_malformed_replies_name_the_frame_and_offset() -> None:
    _server, client = open_pair()
    with pytest.raises(IngressProtocolError, match="outcome 9: not one of") as err:
        client.receive_data(tagged(K_TO_CLIENT, 0, 17, struct.pack("<IB", 1, 9)))
    assert err.value.frame == 2 and err.value.offset == 45 + len(welcome()) + 5 + 4
    _server, client = open_pair()
    with pytest.raises(IngressProtocolError, match="NO_VALUE REPLY carries 1 bytes"):
        client.receive_data(tagged(K_TO_CLIENT, 0, 17, struct.pack("<IB", 1, 2) + b"x"))
    _server, client = open_pair()
    with pytest.raises(IngressProtocolError, match="unknown reason 77"):
        client.receive_data(tagged(K_TO_CLIENT, 0, 18, struct.pack("<IB", 1, 77)))


def test_altered_replayed_or_reordered_frames_fail_their_tags() -> None:
    server, client = open_pair()
    client.call(1, b"a", 1, b"one")
    first = client.data_to_send()
    client.call(2, b"b", 1, b"two")
    second = client.data_to_send()
    for bad in (
        first[:-1] + bytes([first[-1] ^ 1]),  # the tag
        first[:10] + bytes([first[10] ^ 0x40]) + first[11:],  # the body
        second,  # reordered: the second frame first
    ):
        s, c = open_pair()
        c.call(1, b"a", 1, b"one")
        with pytest.raises(IngressProtocolError, match="fails its tag"):
            s.receive_data(bad)
    assert server.receive_data(first) == [Call(1, b"a", 1, b"one")]
    with pytest.raises(IngressProtocolError, match="frame 1 after the handshake fails its tag"):
        server.receive_data(first)  # replayed


@given(st.binary(max_size=400))
@settings(max_examples=300)
def test_arbitrary_bytes_before_authentication_are_refused_or_waited_for(data: bytes) -> None:
    server = ServerConnection(SECRET, INFO)
    hello_bytes = server.data_to_send()
    try:
        assert server.receive_data(data) == []
    except IngressProtocolError:
        assert server.state is ConnectionState.FAILED
    assert server.data_to_send() == b""  # never a byte more than HELLO
    assert len(hello_bytes) == 45


@given(st.binary(max_size=400))
@settings(max_examples=300)
def test_arbitrary_bytes_after_authentication_are_refused_or_waited_for(data: bytes) -> None:
    server, _client = open_pair()
    with contextlib.suppress(IngressProtocolError):
        assert server.receive_data(data) == []  # without the key, no frame passes its tag
