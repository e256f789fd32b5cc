"""The authenticated channel's core (ambrosia_py/auth), on its own.

Every proof, key and tag is rebuilt here with ``hmac.new`` from the layout in
docs/security.md (*One authenticated channel*): ``T = head | Nc | context | Nr``, the
responder's proof ``H(S, D " " responder | T)``, the challenger's ``H(S, D " "
challenger | T | info)``, each direction's key ``H(S, D " key " sender "->" receiver |
T)``, and each frame's tag ``H(K, u64le counter | header | payload)[:16]``; nothing is
taken from the module under test. Then what it must refuse: a bad proof either way, a
reflected proof, a tampered context or info, a peer with other labels, a replayed,
reordered or re-addressed frame; and its state machine, table by table, against a table
written out here.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import itertools
import pickle
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.auth import (
    EXPECTED,
    TABLE,
    TAG_SIZE,
    Challenge,
    Channel,
    ChannelError,
    Confirm,
    Direction,
    Handshake,
    HandshakeState,
    Labels,
    MessageKind,
    ProofError,
    Response,
    Role,
    TagError,
    UnexpectedMessageError,
    step,
)
from ambrosia_py.coordinator.links.auth import LINK_LABELS
from ambrosia_py.ingress.connection import INGRESS_LABELS

SECRET = bytes(range(100, 132))
N_CHALLENGER = bytes(range(32))
N_RESPONDER = bytes(range(32, 64))
CONTEXT = b"what the challenger binds in"
INFO = b"what the challenger says under its proof"
LABELS = Labels(
    domain=b"test-channel-v1",
    head=b"TESTHEAD",
    challenger="opener",
    responder="answerer",
    frames="on the test connection",
)
C, R = Role.CHALLENGER, Role.RESPONDER


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def counter(n: int) -> bytes:
    return struct.pack("<Q", n)


def pair(
    *,
    challenger_secret: bytes = SECRET,
    responder_secret: bytes = SECRET,
    responder_labels: Labels = LABELS,
    info: bytes = INFO,
) -> tuple[Handshake, Handshake]:
    challenger = Handshake(LABELS, C, challenger_secret, nonce=N_CHALLENGER, info=info)
    responder = Handshake(responder_labels, R, responder_secret, nonce=N_RESPONDER)
    return challenger, responder


def run(challenger: Handshake, responder: Handshake) -> None:
    responder.receive(challenger.receive(responder.receive(challenger.start(CONTEXT))))


# --- the layout, computed independently ---------------------------------------------------


def test_the_handshake_and_keys_are_the_documented_hmacs() -> None:
    challenger, responder = pair()
    challenge = challenger.start(CONTEXT)
    assert challenge == Challenge(N_CHALLENGER, CONTEXT)
    assert challenger.state is HandshakeState.CHALLENGED
    response = responder.receive(challenge)
    transcript = b"TESTHEAD" + N_CHALLENGER + CONTEXT + N_RESPONDER
    assert response == Response(N_RESPONDER, mac(SECRET, b"test-channel-v1 answerer", transcript))
    assert responder.state is HandshakeState.RESPONDED
    confirm = challenger.receive(response)
    assert confirm == Confirm(mac(SECRET, b"test-channel-v1 opener", transcript, INFO), INFO)
    assert challenger.done
    assert responder.receive(confirm) is None
    assert responder.done

    to_responder = mac(SECRET, b"test-channel-v1 key opener->answerer", transcript)
    to_challenger = mac(SECRET, b"test-channel-v1 key answerer->opener", transcript)
    assert challenger.keys() == (to_responder, to_challenger)
    assert responder.keys() == (to_challenger, to_responder)


def test_tags_are_the_documented_hmacs_and_open_on_the_other_side() -> None:
    challenger, responder = pair()
    run(challenger, responder)
    out, back = challenger.channel(), responder.channel()
    (key, _) = challenger.keys()
    header = b"\x10"
    for n, parts in enumerate([[b"hel", b"lo"], [], [b"x" * 5000]]):
        tag = out.tag(header, parts)
        payload = b"".join(parts)
        assert tag == mac(key, counter(n), header, payload)[:TAG_SIZE]
        assert bytes(back.check(header, payload + tag)) == payload
    assert (out.sent, out.received, back.sent, back.received) == (3, 0, 0, 3)


@pytest.mark.parametrize(
    ("labels", "proofs", "keys"),
    [
        (
            LINK_LABELS,
            (b"ambrosia-link-v1 dialer", b"ambrosia-link-v1 acceptor"),
            (b"ambrosia-link-v1 key dialer->acceptor", b"ambrosia-link-v1 key acceptor->dialer"),
        ),
        (
            INGRESS_LABELS,
            (b"ambrosia-ingress-v1 server", b"ambrosia-ingress-v1 client"),
            (
                b"ambrosia-ingress-v1 key server->client",
                b"ambrosia-ingress-v1 key client->server",
            ),
        ),
    ],
)
def test_the_protocols_labels_are_the_documented_strings(
    labels: Labels, proofs: tuple[bytes, bytes], keys: tuple[bytes, bytes]
) -> None:
    """docs/security.md and docs/ingress.md spell these out; the core derives them."""
    assert (labels.proofs[C], labels.proofs[R]) == proofs
    assert (labels.keys[C], labels.keys[R]) == keys


def test_the_protocols_heads_are_their_challenges_first_bytes() -> None:
    assert LINK_LABELS.head == b"AMBAUTH1\x01"
    assert INGRESS_LABELS.head == b"AMBINGR1"


@settings(max_examples=100, deadline=None)
@given(
    secret=st.binary(min_size=16, max_size=100),
    nonces=st.tuples(st.binary(min_size=32, max_size=32), st.binary(min_size=32, max_size=32)),
    context=st.binary(max_size=100),
    info=st.binary(max_size=300),
    frames=st.lists(st.tuples(st.booleans(), st.binary(max_size=2, min_size=0), st.binary())),
)
def test_any_handshake_agrees_with_the_layout_and_its_channels_interoperate(
    secret: bytes,
    nonces: tuple[bytes, bytes],
    context: bytes,
    info: bytes,
    frames: list[tuple[bool, bytes, bytes]],
) -> None:
    challenger = Handshake(LABELS, C, secret, nonce=nonces[0], info=info)
    responder = Handshake(LABELS, R, secret, nonce=nonces[1])
    response = responder.receive(challenger.start(context))
    transcript = b"TESTHEAD" + nonces[0] + context + nonces[1]
    assert response.proof == mac(secret, b"test-channel-v1 answerer", transcript)
    confirm = challenger.receive(response)
    assert confirm.proof == mac(secret, b"test-channel-v1 opener", transcript, info)
    responder.receive(confirm)
    ends = {C: challenger.channel(), R: responder.channel()}
    keys = {
        C: mac(secret, b"test-channel-v1 key opener->answerer", transcript),
        R: mac(secret, b"test-channel-v1 key answerer->opener", transcript),
    }
    counts = {C: 0, R: 0}
    for from_challenger, header, payload in frames:
        sender = C if from_challenger else R
        receiver = R if from_challenger else C
        tag = ends[sender].tag(header, [payload])
        assert tag == mac(keys[sender], counter(counts[sender]), header, payload)[:TAG_SIZE]
        assert bytes(ends[receiver].check(header, payload + tag)) == payload
        counts[sender] += 1


# --- what it refuses ----------------------------------------------------------------------


def test_a_responder_without_the_secret_is_refused_and_the_challenger_stays_failed() -> None:
    challenger, responder = pair(responder_secret=b"another secret, 32 bytes long!!!")
    response = responder.receive(challenger.start(CONTEXT))
    with pytest.raises(ProofError, match="the answerer's proof does not match") as err:
        challenger.receive(response)
    assert err.value.kind is MessageKind.RESPONSE
    assert challenger.state is HandshakeState.FAILED
    assert challenger.expecting is None
    with pytest.raises(UnexpectedMessageError, match="in handshake state FAILED"):
        challenger.receive(response)
    with pytest.raises(ChannelError, match="no channel before the handshake is done"):
        challenger.channel()


def test_a_challenger_without_the_secret_is_refused() -> None:
    """It would refuse the responder's proof first; one that went on anyway, its proof
    made with what it has, is refused by the responder."""
    challenger, responder = pair()
    responder.receive(challenger.start(CONTEXT))
    transcript = b"TESTHEAD" + N_CHALLENGER + CONTEXT + N_RESPONDER
    wrong = b"another secret, 32 bytes long!!!"
    forged = Confirm(mac(wrong, b"test-channel-v1 opener", transcript, INFO), INFO)
    with pytest.raises(ProofError, match="the opener's proof does not match") as err:
        responder.receive(forged)
    assert err.value.kind is MessageKind.CONFIRM
    assert responder.state is HandshakeState.FAILED
    with pytest.raises(ChannelError, match="no channel"):
        responder.keys()


def test_a_proof_reflected_to_its_maker_is_refused() -> None:
    """The responder's own proof, sent back to it as the challenger's, does not pass:
    the two proofs carry different labels."""
    challenger, responder = pair(info=b"")
    response = responder.receive(challenger.start(CONTEXT))
    with pytest.raises(ProofError, match="the opener's proof does not match"):
        responder.receive(Confirm(response.proof))


@pytest.mark.parametrize("what", ["context", "info", "challenger nonce", "responder nonce"])
def test_whatever_the_transcript_covers_cannot_be_changed_on_the_way(what: str) -> None:
    challenger, responder = pair()
    challenge = challenger.start(CONTEXT)
    if what == "context":
        challenge = Challenge(challenge.nonce, b"another context")
    if what == "challenger nonce":
        challenge = Challenge(bytes(32), challenge.context)
    response = responder.receive(challenge)
    if what == "responder nonce":
        response = Response(bytes(32), response.proof)
    if what in ("context", "challenger nonce", "responder nonce"):
        with pytest.raises(ProofError, match="the answerer's proof does not match"):
            challenger.receive(response)
        return
    confirm = challenger.receive(response)
    with pytest.raises(ProofError, match="the opener's proof does not match"):
        responder.receive(Confirm(confirm.proof, b"another info"))


@pytest.mark.parametrize(
    "other",
    [
        {"domain": b"test-channel-v2"},
        {"head": b"TESTHEAX"},
        {"challenger": "dialer"},
        {"responder": "acceptor"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_peer_with_other_labels_is_refused(other: dict[str, object]) -> None:
    """Another protocol (or version) is refused, whichever label differs: one of the
    two proofs is over other bytes (the one whose label names the differing side, or
    both, for another domain or head)."""
    fields = {
        "domain": LABELS.domain,
        "head": LABELS.head,
        "challenger": LABELS.challenger,
        "responder": LABELS.responder,
        "frames": LABELS.frames,
    }
    labels = Labels(**{**fields, **other})
    challenger, responder = pair(responder_labels=labels)
    with pytest.raises(ProofError, match="proof does not match"):
        run(challenger, responder)
    assert HandshakeState.FAILED in (challenger.state, responder.state)
    assert not (challenger.done and responder.done)


def test_the_links_and_the_ingress_labels_refuse_each_other_with_one_secret() -> None:
    for ours, theirs in ((LINK_LABELS, INGRESS_LABELS), (INGRESS_LABELS, LINK_LABELS)):
        challenger = Handshake(ours, C, SECRET, nonce=N_CHALLENGER)
        responder = Handshake(theirs, R, SECRET, nonce=N_RESPONDER)
        response = responder.receive(challenger.start())
        with pytest.raises(ProofError, match=f"the {ours.responder}'s proof does not match"):
            challenger.receive(response)


def open_channels() -> tuple[Channel, Channel]:
    challenger, responder = pair()
    run(challenger, responder)
    return challenger.channel(), responder.channel()


def test_a_replayed_reordered_or_readdressed_frame_fails_its_tag() -> None:
    out, back = open_channels()
    first = b"one" + out.tag(b"A", [b"one"])
    second = b"two" + out.tag(b"A", [b"two"])
    with pytest.raises(TagError, match="frame 0 on the test connection fails its tag") as err:
        back.check(b"A", second)  # reordered: the second frame first
    assert err.value.frame == 0 and back.received == 0
    with pytest.raises(TagError, match=r"frame 0 .* fails its tag"):
        back.check(b"B", first)  # under another header
    with pytest.raises(TagError, match="fails its tag"):
        back.check(b"A", b"onf" + first[3:])  # altered
    assert bytes(back.check(b"A", first)) == b"one"
    with pytest.raises(TagError, match="frame 1 on the test connection fails its tag") as err:
        back.check(b"A", first)  # replayed
    assert err.value.frame == 1
    assert bytes(back.check(b"A", second)) == b"two"
    # A frame tagged for one direction does not pass in the other.
    back_first = b"one" + back.tag(b"A", [b"one"])
    with pytest.raises(TagError, match="fails its tag"):
        back.check(b"A", back_first)


def test_a_message_too_short_for_its_tag_is_named() -> None:
    _out, back = open_channels()
    with pytest.raises(TagError, match=r"frame 0 on the test connection: 15 bytes, too short"):
        back.check(b"", bytes(15))


def test_another_handshakes_keys_do_not_open_this_ones_frames() -> None:
    """Fresh nonces give fresh keys: a frame recorded on one connection fails on the next."""
    out, _back = open_channels()
    challenger = Handshake(LABELS, C, SECRET, info=INFO)
    responder = Handshake(LABELS, R, SECRET)
    run(challenger, responder)
    recorded = b"call" + out.tag(b"A", [b"call"])
    with pytest.raises(TagError, match="fails its tag"):
        responder.channel().check(b"A", recorded)


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (Challenge(bytes(31)), "a CHALLENGE whose nonce has 31 bytes, not 32"),
        (Response(bytes(33), bytes(32)), "a RESPONSE whose nonce has 33 bytes, not 32"),
        (Response(bytes(32), bytes(16)), "a RESPONSE whose proof has 16 bytes, not 32"),
        (Confirm(bytes(31)), "a CONFIRM whose proof has 31 bytes, not 32"),
    ],
)
def test_fields_of_the_wrong_size_are_refused(
    message: Challenge | Response | Confirm, match: str
) -> None:
    challenger, responder = pair()
    side = responder
    if isinstance(message, Response):
        challenger.start(CONTEXT)
        side = challenger
    if isinstance(message, Confirm):
        responder.receive(challenger.start(CONTEXT))
    with pytest.raises(ChannelError, match=match):
        side.receive(message)
    assert side.state is HandshakeState.FAILED


def test_secrets_and_nonces_of_the_wrong_size_and_a_responders_info_are_refused() -> None:
    with pytest.raises(ValueError, match="a secret of 15 bytes: at least 16"):
        Handshake(LABELS, C, bytes(15))
    with pytest.raises(ValueError, match="a nonce has 32 bytes, not 8"):
        Handshake(LABELS, R, SECRET, nonce=bytes(8))
    with pytest.raises(ValueError, match="only the opener's CONFIRM carries info"):
        Handshake(LABELS, R, SECRET, info=b"x")


def test_fresh_nonces_differ() -> None:
    assert Handshake(LABELS, C, SECRET).nonce != Handshake(LABELS, C, SECRET).nonce


# --- the state machine, table by table ------------------------------------------------------

S = HandshakeState
K = MessageKind
SEND, RECEIVE = Direction.SEND, Direction.RECEIVE
# Written out from the protocol's text (docs/security.md): who does what in which state.
EXPECTED_TABLE = {
    (C, S.START, K.CHALLENGE, SEND): S.CHALLENGED,
    (R, S.START, K.CHALLENGE, RECEIVE): S.CHALLENGED,
    (R, S.CHALLENGED, K.RESPONSE, SEND): S.RESPONDED,
    (C, S.CHALLENGED, K.RESPONSE, RECEIVE): S.RESPONDED,
    (C, S.RESPONDED, K.CONFIRM, SEND): S.CONFIRMED,
    (R, S.RESPONDED, K.CONFIRM, RECEIVE): S.CONFIRMED,
}


def test_every_message_in_every_state_both_roles_both_directions() -> None:
    for key in itertools.product(Role, HandshakeState, MessageKind, Direction):
        if key in EXPECTED_TABLE:
            assert step(*key) is EXPECTED_TABLE[key]
            continue
        role, state, kind, direction = key
        with pytest.raises(UnexpectedMessageError) as err:
            step(*key)
        verb = "sent" if direction is SEND else "received"
        assert str(err.value).startswith(
            f"the {role.value} {verb} {kind.name} in handshake state {state.name}: "
        )
        assert (err.value.role, err.value.state, err.value.kind) == (role, state, kind)
    assert dict(TABLE) == EXPECTED_TABLE


def test_what_each_side_awaits() -> None:
    assert dict(EXPECTED) == {
        (R, S.START): K.CHALLENGE,
        (C, S.CHALLENGED): K.RESPONSE,
        (R, S.RESPONDED): K.CONFIRM,
    }
    challenger, responder = pair()
    assert (challenger.expecting, responder.expecting) == (None, K.CHALLENGE)
    response = responder.receive(challenger.start(CONTEXT))
    assert (challenger.expecting, responder.expecting) == (K.RESPONSE, K.CONFIRM)
    responder.receive(challenger.receive(response))
    assert (challenger.expecting, responder.expecting) == (None, None)


def test_messages_out_of_turn_fail_the_handshake() -> None:
    challenger, responder = pair()
    with pytest.raises(UnexpectedMessageError, match="the responder sent CHALLENGE"):
        responder.start()
    assert responder.state is S.FAILED
    with pytest.raises(
        UnexpectedMessageError,
        match=r"the challenger received CHALLENGE in handshake state START: "
        r"CHALLENGE goes challenger -> responder, in state START",
    ):
        challenger.receive(Challenge(N_RESPONDER))
    assert challenger.state is S.FAILED

    challenger, responder = pair()
    challenge = challenger.start(CONTEXT)
    with pytest.raises(UnexpectedMessageError, match="the challenger sent CHALLENGE"):
        challenger.start(CONTEXT)  # twice
    challenger, responder = pair()
    responder.receive(challenger.start(CONTEXT))
    with pytest.raises(UnexpectedMessageError, match="received CHALLENGE in handshake state"):
        responder.receive(challenge)  # a second CHALLENGE
    challenger, responder = pair()
    run(challenger, responder)
    with pytest.raises(UnexpectedMessageError, match="in handshake state CONFIRMED"):
        responder.receive(Confirm(bytes(32)))


def test_a_failure_the_protocol_found_leaves_it_taking_nothing() -> None:
    _challenger, responder = pair()
    responder.fail()
    assert responder.state is S.FAILED and responder.expecting is None
    with pytest.raises(UnexpectedMessageError):
        responder.receive(Challenge(N_CHALLENGER))


def test_errors_pickle_with_what_and_where() -> None:
    for error in (
        ProofError("the opener's proof does not match", kind=K.CONFIRM),
        TagError("frame 3 fails its tag", frame=3),
        UnexpectedMessageError(R, S.RESPONDED, K.CHALLENGE, RECEIVE),
    ):
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error)
        assert (copy.reason, copy.kind, copy.frame) == (error.reason, error.kind, error.frame)


# --- its surface and its floor ----------------------------------------------------------

AUTH_API = [
    "EXPECTED",
    "MIN_SECRET_SIZE",
    "NONCE_SIZE",
    "PROOF_SIZE",
    "SENDERS",
    "TABLE",
    "TAG_SIZE",
    "TRANSITIONS",
    "Buffer",
    "Challenge",
    "Channel",
    "ChannelError",
    "Confirm",
    "Direction",
    "Handshake",
    "HandshakeState",
    "KeyedMac",
    "Labels",
    "MessageKind",
    "ProofError",
    "Response",
    "Role",
    "TagError",
    "UnexpectedMessageError",
    "same_digest",
    "step",
]


def test_the_public_surface_is_pinned() -> None:
    import ambrosia_py.auth as auth

    assert sorted(auth.__all__) == sorted(AUTH_API)
    for name in AUTH_API:
        assert hasattr(auth, name), name


def test_the_core_imports_nothing_of_the_project_but_itself() -> None:
    """It sits under the links and the ingress (docs/architecture.md, *Floors*)."""
    package = Path(__file__).resolve().parents[1] / "ambrosia_py" / "auth"
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                assert node.level == 1, f"{path.name} imports from above ambrosia_py.auth"
            elif isinstance(node, ast.Import | ast.ImportFrom):
                names = [node.module] if isinstance(node, ast.ImportFrom) else []
                names += (
                    [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                )
                assert not any(str(n).startswith("ambrosia_py") for n in names), path.name
