"""A coordinator's link endpoint, driven by a raw peer that speaks bytes built here from the
layouts (flow: reference flow-transport.md; link: coordinator/links/protocol.py): ReplayFrom where
the sender must resume — also after a crash, from the log's watermarks and from a
checkpoint — Commit once input is durable, and bad peers disconnected with nothing logged.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

from ambrosia_py.coordinator.registry.store import Registry
from tests.fake_binding import (
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    incoming_fork,
    incoming_impulse,
    zz,
)
from tests.link_peer import (
    AUTH_TOKEN,
    COMMIT,
    DEADLINE,
    MAGIC,
    REPLAY_FROM,
    TAKE_CHECKPOINT,
    Peer,
    Receiver,
    connect_packet,
    flow_frame,
    hello,
    sha,
)


def wait_for_checkpoint(data_dir: Path, instance: str, n: int) -> None:
    deadline = time.monotonic() + DEADLINE
    with Registry(data_dir) as registry:
        while (info := registry.get(instance)) is None or info.last_checkpoint != n:
            assert time.monotonic() < deadline, f"checkpoint {n} never committed: {info}"
            time.sleep(0.01)  # polling the registry, with a deadline


def first_start(binding: FakeBinding) -> None:
    assert binding.record().seq == -1
    binding.send(frame(9, b"init") + checkpoint(b"cp1"))
    assert binding.record().seq == 0


def recover(binding: FakeBinding, records: int) -> list[bytes]:
    rec = binding.record()
    assert rec.seq == -2
    bodies = [binding.record().body for _ in range(records)]
    rec = binding.record()
    assert rec.seq == -1
    binding.send(checkpoint(b"recovered"))
    return bodies


def test_replay_from_commit_and_resume_after_reconnect_crash_and_checkpoint(
    tmp_path: Path,
) -> None:
    calls = [incoming_fork(5, bytes([i])) for i in range(6)]
    with coordinator(tmp_path, "server") as (ic, binding):
        first_start(binding)
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.send(calls[0] + calls[1])
        rec = binding.record()  # logged durably, then forwarded
        assert (rec.seq, rec.body) == (1, calls[0] + calls[1])
        assert peer.control() == (COMMIT, 2, 2)
        # A new connection from the same sender resumes where the log is.
        peer.close()
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 2, 2)
        assert peer.control() == (COMMIT, 2, 2)  # what it has durably already
        peer.send(calls[2])
        assert binding.record().body == calls[2]
        assert peer.control() == (COMMIT, 3, 3)
        peer.close()
        ic.kill()
    # After a SIGKILL the watermarks in the log say where the sender resumes.
    with coordinator(tmp_path, "server") as (ic, binding):
        assert recover(binding, 3)[1:] == [calls[0] + calls[1], calls[2]]
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 3, 3)
        assert peer.control() == (COMMIT, 3, 3)  # what it has durably already
        peer.send(calls[3])
        assert binding.record().body == calls[3]
        assert peer.control() == (COMMIT, 4, 4)
        # A checkpoint: the next recovery starts from it, not from the watermarks of
        # records before it.
        binding.send(frame(TAKE_CHECKPOINT))
        assert binding.record().seq == -1
        binding.send(checkpoint(b"cp-after-4"))
        peer.send(calls[4])
        assert binding.record().body == calls[4]
        assert peer.control() == (COMMIT, 5, 5)
        peer.close()
        wait_for_checkpoint(tmp_path, "server", 3)  # committed after the input before it
        ic.kill()
    with coordinator(tmp_path, "server") as (ic, binding):
        assert recover(binding, 1) == [calls[4]]
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 5, 5)
        assert peer.control() == (COMMIT, 5, 5)  # what it has durably already
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0


def test_bad_peers_are_disconnected_and_nothing_of_theirs_is_logged(tmp_path: Path) -> None:
    good = incoming_fork(5, b"ok")
    with coordinator(tmp_path, "server") as (ic, binding):
        first_start(binding)
        challenge = MAGIC + b"\x01" + bytes(32) + sha("client")
        bad_inputs = [
            # a ConnectPacket longer than any known
            struct.pack("<IQH", 99, 0x1FDB00B073000000, 1) + bytes(96),
            # a handshake frame whose checksum is wrong
            connect_packet() + flow_frame(challenge + sha("server"), AUTH_TOKEN)[:-1] + b"X",
            # a handshake for another instance
            connect_packet() + flow_frame(challenge + sha("elsewhere"), AUTH_TOKEN),
            # a hello, or calls, before any handshake
            connect_packet() + flow_frame(hello("client", "server")),
            connect_packet() + flow_frame(good),
        ]
        for data in bad_inputs:
            peer = Peer(tmp_path, "server")
            peer.sock.sendall(data)
            assert peer.closed_by_peer()
            peer.close()
        # Authenticated, then a hello for another instance, or from another sender than
        # the one that authenticated.
        for sender, hello_sender, destination in (
            ("client", "client", "elsewhere"),
            ("client", "other", "server"),
        ):
            peer = Peer(tmp_path, "server")
            peer.connect()
            peer.authenticate(sender, "server")
            peer.send(hello(hello_sender, destination))
            assert peer.closed_by_peer()
            peer.close()
        # After a good hello: a frame that is not calls, an impulse, a cut message.
        for payload in (frame(TAKE_CHECKPOINT), incoming_impulse(5, b"i"), good[:-1]):
            peer = Peer(tmp_path, "server")
            peer.open()
            assert peer.control() == (REPLAY_FROM, 0, 0)
            peer.send(good + payload)  # the good call goes down too
            assert peer.closed_by_peer()
            peer.close()
        # The coordinator is unharmed and logged nothing of the above.
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.send(good)
        rec = binding.record()
        assert (rec.seq, rec.body) == (1, good)
        assert peer.control() == (COMMIT, 1, 1)
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert "link from 'an unknown peer' at 127.0.0.1:" in log
    assert "the peer dialed another instance" in log
    assert "before the link handshake was done" in log
    assert "'client' dialed 'elsewhere', but this is 'server'" in log
    assert "the hello names 'other', but the peer authenticated as another instance" in log


def test_a_frame_for_a_token_that_differs_from_ours_in_first_closes_the_link(
    tmp_path: Path,
) -> None:
    """Seed 004, *Endpoint / token / UID layout*: besides the endpoint index (the low 32
    bits of ``second``), a receiver checks all 64 bits of ``first``. A frame whose token
    is the link endpoint's but for one bit of ``first`` is not taken: the link closes
    and nothing of it is logged (the reference answers on endpoint-not-found; see
    docs/protocols.md)."""
    good = incoming_fork(5, b"ok")
    not_ours = struct.pack("<QQ", 0x7FFF_FFFF_FFFF_FFFF, 0x414D_4252)
    with coordinator(tmp_path, "server") as (ic, binding):
        first_start(binding)
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.send(good, token=not_ours)
        assert peer.closed_by_peer()
        peer.close()
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)  # nothing was logged
        peer.send(good)
        assert binding.record().body == good
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        assert "not the link endpoint" in ic.stderr()


# --- the sending side: a raw receiver stands in for the destination's coordinator --------


def attach_to(destination: str) -> bytes:
    """AttachTo: the destination's name, UTF-8, no length (seed 002: sent before the first
    call to an instance)."""
    return frame(1, destination.encode())


def fork_to(destination: str, method: int, args: bytes) -> bytes:
    """An outgoing fork from the binding to another instance."""
    dest = destination.encode()
    return frame(0, zz(len(dest)) + dest + b"\x00" + zz(method) + b"\x01" + args)


def test_the_sender_resends_from_where_the_receiver_asks_and_drops_what_it_has(
    tmp_path: Path,
) -> None:
    receiver = Receiver(tmp_path, "server")
    calls = [incoming_fork(5, bytes([i])) for i in range(6)]
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            first_start(binding)
            forks = b"".join(fork_to("server", 5, bytes([i])) for i in range(3))
            binding.send(attach_to("server") + forks)
            peer = receiver.accept("client", "server", 0)
            expected = b"".join(calls[:3])  # in the receiver's incoming form, in order
            assert peer.messages(len(expected)) == expected
            peer.send(frame(COMMIT, zz(2) + zz(2)))
            peer.close()
            # The receiver lost the third call (not durable there): it asks from 2.
            peer = receiver.accept("client", "server", 2)
            assert peer.frame() == calls[2]
            peer.close()
            # A receiver asking from below what it committed is refused: the link closes.
            peer = receiver.accept("client", "server", 1)
            assert peer.closed_by_peer()
            peer.close()
            peer = receiver.accept("client", "server", 3)
            binding.send(fork_to("server", 5, bytes([3])))
            assert peer.frame() == calls[3]
            peer.close()
            ic.kill()
            assert "peer asks to replay from seq 1" in ic.stderr()
        # The sender crashes. Its checkpoint (first start) held no output; replay makes the
        # binding regenerate all four calls, which the receiver already has but for none,
        # and its AttachTo (that checkpoint holds none either).
        with coordinator(tmp_path, "client") as (ic, binding):
            rec = binding.record()
            assert rec.seq == -2
            assert binding.record().seq == 0
            assert binding.record().seq == -1
            forks = b"".join(fork_to("server", 5, bytes([i])) for i in range(4))
            regenerated = attach_to("server") + forks
            binding.send(regenerated + checkpoint(b"recovered") + fork_to("server", 5, b"\x04"))
            peer = receiver.accept("client", "server", 4)
            assert peer.frame() == calls[4]  # only what the receiver does not have
            peer.send(frame(COMMIT, zz(5) + zz(5)))
            peer.close()
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
    finally:
        receiver.close()


def test_output_a_checkpoint_holds_is_sent_after_a_crash_though_replay_never_regenerates_it(
    tmp_path: Path,
) -> None:
    """Calls sent before a checkpoint and not yet confirmed by their destination live on
    in the checkpoint (replay from it will not regenerate them)."""
    receiver = Receiver(tmp_path, "server")
    calls = [incoming_fork(5, bytes([i])) for i in range(3)]
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            first_start(binding)
            forks = b"".join(fork_to("server", 5, bytes([i])) for i in range(3))
            binding.send(attach_to("server") + forks)
            peer = receiver.accept("client", "server", 0)
            peer.messages(len(b"".join(calls)))  # sent, but never confirmed: no Commit
            peer.close()
            binding.send(frame(TAKE_CHECKPOINT))
            assert binding.record().seq == -1
            binding.send(checkpoint(b"cp2"))
            wait_for_checkpoint(tmp_path, "client", 2)
            ic.kill()
        with coordinator(tmp_path, "client") as (ic, binding):
            rec = binding.record()
            assert rec.seq == -2 and rec.blob == b"cp2"
            assert binding.record().seq == -1  # nothing logged after checkpoint 2
            binding.send(checkpoint(b"cp3"))  # and the binding regenerates nothing
            peer = receiver.accept("client", "server", 1)  # the receiver had call 0
            assert peer.messages(len(calls[1] + calls[2])) == calls[1] + calls[2]
            peer.close()
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
    finally:
        receiver.close()


def test_a_sender_that_started_over_is_refused(tmp_path: Path) -> None:
    """A sender's incarnation (its committer id) is remembered, through a checkpoint and a
    crash: one that comes back with another has restarted its numbering, and taking its
    calls for duplicates would lose them."""
    call = incoming_fork(5, b"x")
    with coordinator(tmp_path, "server") as (ic, binding):
        first_start(binding)
        peer = Peer(tmp_path, "server")
        peer.open(incarnation=7)
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.send(call)
        assert binding.record().body == call
        peer.close()
        binding.send(frame(TAKE_CHECKPOINT))
        assert binding.record().seq == -1
        binding.send(checkpoint(b"cp2"))
        wait_for_checkpoint(tmp_path, "server", 2)
        ic.kill()
    with coordinator(tmp_path, "server") as (ic, binding):
        assert recover(binding, 0) == []
        impostor = Peer(tmp_path, "server")
        impostor.open(incarnation=8)
        assert impostor.closed_by_peer()  # no ReplayFrom: refused
        impostor.close()
        peer = Peer(tmp_path, "server")
        peer.open(incarnation=7)
        assert peer.control() == (REPLAY_FROM, 1, 1)
        assert peer.control() == (COMMIT, 1, 1)  # what it has durably already
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert "instance 'client' started over from an empty history (committer id 7, now 8)" in log
