"""The link state between coordinators, sans-IO: numbering, replay from, commit, trimming,
the hello frame, and the link section of the coordinator's checkpoint."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py import wire
from ambrosia_py.coordinator.core.intake import IcState, Intake, StateFormatError
from ambrosia_py.coordinator.links.protocol import Hello, Inbox, LinkError, Outbox
from ambrosia_py.wire import AttachTo, IncomingRpc, OutgoingRpc, RpcType, encode_message
from ambrosia_py.wire.records import decode_disk_tail


def test_hello_bytes_and_round_trip() -> None:
    assert Hello("ab", "c", 5).encode() == b"AMBLINK1" + bytes.fromhex("04 6162 02 63 0a")
    hello = Hello("client", "server", 2**31 - 1)
    assert Hello.decode(hello.encode()) == hello


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b"AMBLINK2\x02a\x02b\x02", "magic"),
        (b"AMBLINK1\x00\x02b\x02", "sender name length 0"),
        (b"AMBLINK1\x02a\x04b", "destination name length 2"),
        (b"AMBLINK1\x02\xff\x02b\x02", "sender name is not UTF-8"),
        (b"AMBLINK1\x02a\x02b", "incarnation is missing"),
        (b"AMBLINK1\x02a\x02b\x02\x00", "1 trailing bytes"),
    ],
)
def test_a_bad_hello_is_refused_with_the_reason(data: bytes, reason: str) -> None:
    with pytest.raises(LinkError, match=reason):
        Hello.decode(data)


def test_outbox_sends_from_where_the_receiver_asks_and_forgets_what_it_committed() -> None:
    box = Outbox()
    for i in range(5):
        assert box.add(f"m{i}".encode()) == i
    assert box.take(100) == []  # not connected
    box.connected(2)  # the receiver has 0 and 1, queued or durable
    assert [seq for seq, _ in box.buffered] == [0, 1, 2, 3, 4]  # only a Commit forgets
    assert box.take(4) == [b"m2", b"m3"]  # at least one, then up to the byte budget
    assert box.take(100) == [b"m4"]
    assert box.take(100) == []
    box.commit(4)
    assert box.buffered == [(4, b"m4")]
    box.disconnected()
    box.connected(4)  # a new connection resends what is not committed
    assert box.take(100) == [b"m4"]


def test_outbox_refuses_a_replay_from_below_what_the_receiver_committed() -> None:
    box = Outbox()
    for _i in range(3):
        box.add(b"x")
    box.connected(0)
    assert len(box.take(100)) == 3
    box.commit(2)
    box.disconnected()
    with pytest.raises(LinkError, match="replay from seq 1"):
        box.connected(1)


def test_outbox_skips_regenerated_output_the_receiver_already_has() -> None:
    # Recovery: the checkpoint kept seq 3; replay regenerates 4.. while the receiver
    # already has everything below 6.
    box = Outbox(4, [(3, b"m3")])
    box.connected(6)
    for i in range(4, 8):
        box.add(f"m{i}".encode())
    assert box.take(100) == [b"m6", b"m7"]


@given(st.lists(st.integers(0, 4), max_size=60))
def test_every_message_reaches_the_receivers_log_exactly_once(ops: list[int]) -> None:
    """A receiver that queues what it gets, makes a prefix durable now and then, reconnects
    asking from what it has queued, or crashes (losing what was not durable) and asks from
    what is durable: its log ends up 0, 1, 2, ... exactly."""
    box = Outbox()
    received: list[int] = []  # queued at the receiver, in order
    durable = 0  # received[:durable] is in its log
    box.connected(0)
    for op in ops:
        if op == 0:
            box.add(str(box.next_seq).encode())
        elif op == 1:
            received += [int(f) for f in box.take(3)]
        elif op == 2:
            durable = len(received)
            box.commit(durable)
        elif op == 3:  # the link drops; the receiver lives on with what it queued
            box.disconnected()
            box.connected(len(received))
        else:  # the receiver crashes: what was not durable is gone
            del received[durable:]
            box.disconnected()
            box.connected(durable)
    received += [int(f) for f in box.take(1 << 20)]
    assert received == list(range(box.next_seq))


def test_inbox_resumes_from_what_is_queued_and_commits_what_is_durable() -> None:
    inbox = Inbox({"a": 3})
    assert inbox.expect("a") == 3 and inbox.expect("b") == 0
    assert inbox.accept("a", 2) == 5
    assert inbox.expect("a") == 5
    inbox.made_durable({"a": 4})
    assert inbox.durable == {"a": 4}
    inbox.made_durable({"a": 2})  # never backwards
    assert inbox.durable == {"a": 4}


def test_inbox_refuses_a_sender_that_started_over() -> None:
    inbox = Inbox({"client": 5}, {"client": 11})
    inbox.check_incarnation(Hello("client", "server", 11))  # the same history: fine
    inbox.check_incarnation(Hello("other", "server", 3))  # first seen: remembered
    assert inbox.incarnations == {"client": 11, "other": 3}
    with pytest.raises(LinkError, match=r"'client' started over .* \(committer id 11, now 12\)"):
        inbox.check_incarnation(Hello("client", "server", 12))


def _incoming_call(n: int) -> bytes:
    return encode_message(IncomingRpc(7, RpcType.FORK, bytes([n])))


def test_link_input_is_queued_with_watermarks() -> None:
    intake = Intake("server")
    assert intake.link_input("client", _incoming_call(1) + _incoming_call(2)) == 2
    assert intake.link_input("other", _incoming_call(3)) == 1
    record = intake.next_record(1 << 20)
    assert record is not None and intake.next_record(1 << 20) is None
    body = _incoming_call(1) + _incoming_call(2) + _incoming_call(3)
    assert b"".join(bytes(p) for p in record.wire_parts[1:]) == body
    assert intake.logged_outputs == 0  # input from links is not the binding's own output
    assert record.marks == {"client": 2, "other": 1}
    # The disk form carries them as watermarks (reference ambrosia.md, *Files on disk*).
    disk = b"".join(bytes(p) for p in record.disk_parts)
    assert len(disk) == record.size and disk[24 : 24 + len(body)] == body  # a 24-byte header
    tail, end = decode_disk_tail(disk, 24 + len(body))
    assert end == len(disk)
    # Per sender, the seq of its last message in the record (the first is 0).
    assert {(w.name, w.last_seq) for w in tail.watermarks} == {("client", 1), ("other", 0)}


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (encode_message(wire.TakeCheckpoint()), "not TAKE_CHECKPOINT"),
        (encode_message(IncomingRpc(7, RpcType.IMPULSE, b"")), "impulse"),
        (_incoming_call(1)[:-1], "bad message on a link"),
        (encode_message(OutgoingRpc("x", 7, RpcType.FORK, b"")), "bad message|incoming"),
    ],
)
def test_bad_link_input_is_refused_whole(payload: bytes, reason: str) -> None:
    intake = Intake("server")
    with pytest.raises(LinkError, match=reason):
        intake.link_input("client", _incoming_call(1) + payload)
    assert intake.pending == []  # nothing of the bad frame is queued
    assert intake.inbox.expect("client") == 0


def test_output_for_another_instance_goes_to_its_outbox_in_incoming_form() -> None:
    intake = Intake("client")
    intake.receive_data(encode_message(AttachTo("server")))
    intake.receive_data(encode_message(OutgoingRpc("server", 7, RpcType.FORK, b"\x01")))
    assert intake.pending == []
    assert intake.new_destinations == ["server"]
    assert intake.outboxes["server"].buffered == [(0, _incoming_call(1))]


def test_an_impulse_for_another_instance_is_refused() -> None:
    intake = Intake("client")
    with pytest.raises(wire.MalformedMessageError, match="impulse for instance 'server'"):
        intake.receive_data(encode_message(OutgoingRpc("server", 7, RpcType.IMPULSE, b"")))


def test_checkpoint_state_keeps_the_link_section() -> None:
    outboxes = {"server": (9, [(7, b"m7"), (8, b"m8")])}
    state = IcState(5, 10, 3, 4, b"blob", {"client": 7}, outboxes, {"client": -3})
    data = b"".join(bytes(p) for p in state.encode_parts())
    back = IcState.decode(data, "serverchkpt2")
    assert back.inbox == {"client": 7}
    assert back.outboxes == {"server": (9, [(7, b"m7"), (8, b"m8")])}
    assert back.senders == {"client": -3}
    assert bytes(back.blob) == b"blob"
    with pytest.raises(StateFormatError, match="serverchkpt2"):
        IcState.decode(data[:-5], "serverchkpt2")


def test_a_format_1_checkpoint_state_still_reads() -> None:
    data = struct.pack("<6sHiqqqQ", b"AMBRIC", 1, 5, 10, 3, 4, 4) + b"blob"
    state = IcState.decode(data, "serverchkpt1")
    assert (state.committer_id, state.next_seq, bytes(state.blob)) == (5, 10, b"blob")
    assert (state.inbox, state.outboxes, state.senders) == ({}, {}, {})


def test_outbox_refuses_a_commit_of_what_was_never_sent() -> None:
    box = Outbox()
    for _ in range(3):
        box.add(b"x")
    box.connected(0)
    box.take(1)  # one message sent
    with pytest.raises(LinkError, match="commits up to seq 2, but only 1 messages were sent"):
        box.commit(2)
    assert len(box.buffered) == 3  # nothing forgotten


def test_a_checkpoint_whose_outbox_has_gaps_is_refused_naming_the_file() -> None:
    state = IcState(5, 10, 3, 4, b"", {}, {"server": (9, [(6, b"m6"), (8, b"m8")])})
    data = b"".join(bytes(p) for p in state.encode_parts())
    with pytest.raises(StateFormatError, match="serverchkpt4: outbox 'server' holds seqs"):
        IcState.decode(data, "serverchkpt4")
    with pytest.raises(ValueError, match=r"seqs 7\.\.8"):
        Outbox(9, [(6, b"m6"), (8, b"m8")])


@given(st.lists(st.sampled_from(["add", "send", "commit", "reconnect"]), max_size=80))
def test_outbox_buffer_is_what_was_not_committed(ops: list[str]) -> None:
    box = Outbox(3, [(1, b"1"), (2, b"2")])  # as restored from a checkpoint
    box.connected(1)
    sent = 1
    for op in ops:
        if op == "add":
            box.add(str(box.next_seq).encode())
        elif op == "send":
            sent += len(box.take(7))
        elif op == "commit":
            box.commit(sent)
        else:
            box.disconnected()
            box.connected(box.first)
            sent = box.first
        assert [int(f) for _, f in box.buffered] == list(range(box.first, box.next_seq))
        assert box.first <= (box.cursor or 0) <= box.next_seq
