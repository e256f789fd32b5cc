"""Seed 002 rules on the coordinator's side, against a real coordinator process.

The binding is raw bytes on real sockets (``tests.fake_binding``), and the destination of
calls to other instances a raw link peer (``tests.link_peer``); every message is laid out
here from the seed's *Message Formats* (and the reference's examples), not with the
project's encoder:

* RPCBatch (type 5) from the binding: "a count (ZigZagInt) of the number of RPC messages
  in the batch, followed by the corresponding RPC messages", a performance hint: the
  calls are logged and delivered as if sent one by one, in order.
* AttachTo (type 1): "must be sent (once) for each outgoing RPC destination, excluding
  the local instance, prior to sending an RPC" (*Attach-before-send protocol*).
"""

from __future__ import annotations

from pathlib import Path

from tests.fake_binding import (
    DEADLINE,
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    incoming_fork,
    incoming_impulse,
    self_fork,
    self_impulse,
    zz,
)
from tests.link_peer import COMMIT, Receiver
from tests.test_coordinator_links import attach_to, first_start, fork_to, wait_for_checkpoint

RPC_BATCH, TAKE_CHECKPOINT = 5, 2


def rpc_batch(*rpcs: bytes) -> bytes:
    """RPCBatch: ZigZagInt count, then that many framed outgoing RPC messages."""
    return frame(RPC_BATCH, zz(len(rpcs)) + b"".join(rpcs))


def self_call(method: int, args: bytes, sender: str, call_seq: int) -> bytes:
    """An outgoing async/await self-call: dest length 0 | 00 | method | 00 | sender | seq."""
    name = sender.encode()
    body = b"\x00" + zz(method) + b"\x00" + zz(len(name)) + name + zz(call_seq) + args
    return frame(0, zz(0) + body)


def incoming_call(method: int, args: bytes, sender: str, call_seq: int) -> bytes:
    name = sender.encode()
    return frame(0, b"\x00" + zz(method) + b"\x00" + zz(len(name)) + name + zz(call_seq) + args)


def return_value_to(destination: str, sender: str, call_seq: int, value: bytes) -> bytes:
    """An outgoing return value (reference: return type 1 | sender | call seq | value)."""
    dest, name = destination.encode(), sender.encode()
    body = b"\x01" + zz(len(name)) + name + zz(call_seq) + zz(len(value)) + value
    return frame(0, zz(len(dest)) + dest + body)


def messages(binding: FakeBinding, n: int) -> list[tuple[int, bytes]]:
    """(seq, framed message) of the next ``n`` logged messages the binding receives."""
    out: list[tuple[int, bytes]] = []
    while len(out) < n:
        rec = binding.record()
        assert rec.seq >= 0, rec
        out += [(rec.seq, frame(t, data)) for t, data in rec.messages]
    return out


# --- RPCBatch from the binding ----------------------------------------------------------


def test_an_rpc_batch_is_logged_and_delivered_as_its_calls_in_order(tmp_path: Path) -> None:
    batch = rpc_batch(
        self_fork(3, b"a"),
        self_impulse(4, b"b"),
        self_call(6, b"c", "svc", 1),
        self_fork(3, b"d"),
    )
    expected = [
        incoming_fork(3, b"a"),
        incoming_impulse(4, b"b"),
        incoming_call(6, b"c", "svc", 1),
        incoming_fork(3, b"d"),
        incoming_fork(3, b"after"),
    ]
    with coordinator(tmp_path, "svc") as (ic, binding):
        first_start(binding)
        binding.send(batch + self_fork(3, b"after"))
        delivered = messages(binding, len(expected))
        assert [m for _, m in delivered] == expected
        seqs = [s for s, _ in delivered]
        assert seqs == sorted(seqs) and seqs[0] == 1  # logged after record 0, in order
        ic.kill()
    # Logged: recovery replays the very records, with the same seqs.
    with coordinator(tmp_path, "svc") as (ic, binding):
        assert binding.record().seq == -2
        assert binding.record().seq == 0  # the InitialMessage
        assert messages(binding, len(expected)) == delivered
        assert binding.record().seq == -1  # TakeBecomingPrimaryCheckpoint
        # A real binding regenerates the replayable calls (not the impulse): dropped.
        regenerated = rpc_batch(self_fork(3, b"a"), self_call(6, b"c", "svc", 1))
        binding.send(regenerated + self_fork(3, b"d") + self_fork(3, b"after"))
        binding.send(checkpoint(b"recovered") + self_fork(3, b"new"))
        assert messages(binding, 1) == [(delivered[-1][0] + 1, incoming_fork(3, b"new"))]
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0


def test_an_rpc_batch_sends_calls_for_another_instance_down_its_link(tmp_path: Path) -> None:
    receiver = Receiver(tmp_path, "server")
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            first_start(binding)
            batch = rpc_batch(
                fork_to("server", 5, b"x"), self_fork(3, b"y"), fork_to("server", 5, b"z")
            )
            binding.send(attach_to("server") + batch)
            assert messages(binding, 1) == [(1, incoming_fork(3, b"y"))]
            peer = receiver.accept("client", "server", 0)
            wanted = incoming_fork(5, b"x") + incoming_fork(5, b"z")
            assert peer.messages(len(wanted)) == wanted
            peer.send(frame(COMMIT, zz(2) + zz(2)))
            peer.close()
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
    finally:
        receiver.close()


# --- AttachTo before the first call ----------------------------------------------------------


def test_the_released_node_bindings_attach_and_call_reach_the_destination(
    tmp_path: Path,
) -> None:
    """The reference's bytes, as the released Node binding sends them (no preamble:
    ``--binding-auth none``): AttachTo "server", then a fork to it, method 3, args
    ``{}``; the destination gets the call in its incoming form. Attaching again, as a
    binding that restarts does, changes nothing."""
    attach = bytes.fromhex("0e 01 736572766572")
    fork = bytes.fromhex("1a 00 0c 736572766572 00 06 01 7b7d")
    receiver = Receiver(tmp_path, "server")
    try:
        with coordinator(tmp_path, "client", "--binding-auth", "none") as (ic, binding):
            first_start(binding)
            binding.send(attach + fork + attach + fork)
            peer = receiver.accept("client", "server", 0)
            incoming = bytes.fromhex("0c 00 00 06 01 7b7d")
            assert peer.messages(2 * len(incoming)) == incoming * 2
            peer.close()
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
    finally:
        receiver.close()


def test_a_call_before_its_attach_to_stops_the_coordinator_and_goes_nowhere(
    tmp_path: Path,
) -> None:
    cases = {
        "alone": (fork_to("server", 5, b"x"), []),
        "batched": (
            rpc_batch(self_fork(3, b"in the batch"), fork_to("server", 5, b"x")),
            [incoming_fork(3, b"in the batch")],
        ),
    }
    for name, (bad, also_logged) in cases.items():
        data_dir = tmp_path / name
        data_dir.mkdir()
        receiver = Receiver(data_dir, "server")  # where a call for "server" would go
        try:
            with coordinator(data_dir, "client") as (ic, binding):
                first_start(binding)
                # Attached to another instance only; the self-call before is fine.
                binding.send(attach_to("other") + self_fork(3, b"before") + bad)
                assert ic.proc.wait(timeout=DEADLINE) == 1
                log = ic.stderr()
            assert "a call for instance 'server' before any AttachTo 'server'" in log
            assert "Attach-before-send" in log
            receiver.listener.setblocking(False)
            try:
                receiver.listener.accept()
            except BlockingIOError:
                pass  # the coordinator has exited without dialing "server"
            else:
                raise AssertionError(f"{name}: a refused call was sent")
        finally:
            receiver.close()
        # The input before the refused call was made durable: recovery replays it.
        with coordinator(data_dir, "client") as (ic, binding):
            assert binding.record().seq == -2
            assert binding.record().seq == 0
            logged = [incoming_fork(3, b"before"), *also_logged]
            assert [m for _, m in messages(binding, len(logged))] == logged
            assert binding.record().seq == -1
            ic.kill()


def test_attachments_outlive_a_checkpoint_and_a_crash(tmp_path: Path) -> None:
    """Our binding keeps the instances it attached to in its checkpoint (so does the
    released C# binding, in its proxies): restored from it, it calls them without
    attaching again. The coordinator keeps them in its own checkpoint, the same one."""
    receiver = Receiver(tmp_path, "server")
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            first_start(binding)
            binding.send(attach_to("server") + fork_to("server", 5, b"0"))
            binding.send(frame(TAKE_CHECKPOINT))
            assert binding.record().seq == -1
            binding.send(checkpoint(b"cp2"))
            peer = receiver.accept("client", "server", 0)
            assert peer.frame() == incoming_fork(5, b"0")
            peer.send(frame(COMMIT, zz(1) + zz(1)))
            peer.close()
            wait_for_checkpoint(tmp_path, "client", 2)
            ic.kill()
        with coordinator(tmp_path, "client") as (ic, binding):
            rec = binding.record()
            assert rec.seq == -2 and rec.blob == b"cp2"
            assert binding.record().seq == -1  # nothing logged since checkpoint 2
            binding.send(checkpoint(b"cp3") + fork_to("server", 5, b"1"))
            peer = receiver.accept("client", "server", 1)
            assert peer.frame() == incoming_fork(5, b"1")
            peer.close()
            # Still required of instances never attached to.
            binding.send(fork_to("elsewhere", 5, b"2"))
            assert ic.proc.wait(timeout=DEADLINE) == 1
            assert "a call for instance 'elsewhere' before any AttachTo" in ic.stderr()
    finally:
        receiver.close()


def test_a_return_value_needs_no_attach_to(tmp_path: Path) -> None:
    """A return value goes back to an instance that called this one: bindings (ours, the
    released ones) do not attach to their callers, and the seed asks it of RPCs."""
    receiver = Receiver(tmp_path, "server")
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            first_start(binding)
            binding.send(return_value_to("server", "client", 9, b"v"))
            peer = receiver.accept("client", "server", 0)
            name = b"client"
            value = b"\x01" + zz(len(name)) + name + zz(9) + zz(1) + b"v"
            assert peer.frame() == frame(0, value)
            peer.close()
            binding.close()
            assert ic.proc.wait(timeout=DEADLINE) == 0
    finally:
        receiver.close()


def test_calls_for_an_instance_registered_later_wait_for_it(tmp_path: Path) -> None:
    """AttachTo's name "must match the name used when the instance was ... registered";
    the coordinator does not refuse a name nobody has registered yet (instances start in
    any order): the calls wait in its outbox until it registers and publishes a link."""
    with coordinator(tmp_path, "client") as (ic, binding):
        first_start(binding)
        binding.send(attach_to("later") + fork_to("later", 5, b"waited"))
        receiver = Receiver(tmp_path, "later")  # registered only now
        try:
            peer = receiver.accept("client", "later", 0)
            assert peer.frame() == incoming_fork(5, b"waited")
            peer.close()
        finally:
            receiver.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
