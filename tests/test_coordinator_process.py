"""The coordinator as a real process, driven by a fake binding speaking raw bytes."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.fake_binding import (
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    incoming_fork,
    self_fork,
    unzz,
)

TAKE_CHECKPOINT = 2
INITIAL_MESSAGE = 9
UPGRADE_TAKE_CHECKPOINT = 10
TAKE_BECOMING_PRIMARY = 11
UPGRADE_SERVICE = 12


def first_start(binding: FakeBinding, initial: bytes = b"hello", blob: bytes = b"state-0") -> int:
    rec = binding.record()
    assert (rec.seq, rec.messages) == (-1, [(TAKE_BECOMING_PRIMARY, b"")])
    assert rec.body == bytes.fromhex("020b")
    binding.send(frame(INITIAL_MESSAGE, initial) + checkpoint(blob))
    rec0 = binding.record()
    assert rec0.seq == 0
    assert rec0.body == frame(INITIAL_MESSAGE, initial)
    assert rec0.committer == rec.committer
    return rec.committer


def collect(binding: FakeBinding, n_messages: int) -> list[tuple[int, bytes]]:
    """Read records until ``n_messages`` messages came; return (seq, message frame) pairs."""
    out: list[tuple[int, bytes]] = []
    while len(out) < n_messages:
        rec = binding.record()
        assert rec.seq >= 0, rec
        for mtype, data in rec.messages:
            out.append((rec.seq, frame(mtype, data)))
    return out


def test_first_start_then_self_calls_then_clean_exit(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        committer = first_start(binding)
        sent = [self_fork(3, i.to_bytes(4, "little")) for i in range(50)]
        binding.send(b"".join(sent))
        got = collect(binding, 50)
        assert [m for _, m in got] == [incoming_fork(3, i.to_bytes(4, "little")) for i in range(50)]
        seqs = sorted({s for s, _ in got})
        assert seqs == list(range(1, len(seqs) + 1))  # consecutive, group-committed
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    files = sorted(p.name for p in (tmp_path / "svc_0").iterdir())
    assert files == ["serverchkpt1", "serverindex1", "serverkillFile", "serverlog1"]
    assert committer > 0


def test_binding_take_checkpoint_rolls_the_log(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        first_start(binding)
        binding.send(self_fork(1, b"a"))
        assert collect(binding, 1) == [(1, incoming_fork(1, b"a"))]
        binding.send(frame(TAKE_CHECKPOINT))
        rec = binding.record()
        assert (rec.seq, rec.messages) == (-1, [(TAKE_CHECKPOINT, b"")])
        binding.send(checkpoint(b"state-after-1") + self_fork(1, b"b"))
        assert collect(binding, 1) == [(2, incoming_fork(1, b"b"))]
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    d = tmp_path / "svc_0"
    assert (d / "serverlog2").exists() and (d / "serverchkpt2").exists()
    assert (d / "serverchkpt2").read_bytes().endswith(b"state-after-1")


def test_recovery_after_sigkill_replays_exactly(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        committer = first_start(binding, blob=b"cp1")
        binding.send(b"".join(self_fork(2, bytes([i])) for i in range(10)))
        before = collect(binding, 10)
        ic.kill()
    with coordinator(tmp_path, "svc") as (ic, binding):
        rec = binding.record()
        assert rec.seq == -2 and rec.committer == committer
        assert [t for t, _ in rec.messages] == [8]
        assert unzz(rec.messages[0][1], 0)[0] == 3 and rec.blob == b"cp1"
        # Record 0 (the initial message) and every self-call, in order, same seqs.
        replay = binding.record()
        assert (replay.seq, replay.body) == (0, frame(INITIAL_MESSAGE, b"hello"))
        assert collect(binding, 10) == before
        rec = binding.record()
        assert (rec.seq, rec.messages) == (-1, [(TAKE_BECOMING_PRIMARY, b"")])
        # A real binding regenerates its outputs while it replays: the ten forks again.
        # They are in the log already, so the coordinator drops them; "next" is new.
        regenerated = b"".join(self_fork(2, bytes([i])) for i in range(10))
        binding.send(regenerated + checkpoint(b"cp-recovered") + self_fork(2, b"next"))
        ((seq, msg),) = collect(binding, 1)
        assert seq == before[-1][0] + 1 and msg == incoming_fork(2, b"next")
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    d = tmp_path / "svc_0"
    assert (d / "serverchkpt2").read_bytes().endswith(b"cp-recovered")


def test_upgrade_moves_to_the_new_version(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        first_start(binding)
        binding.send(self_fork(1, b"x"))
        collect(binding, 1)
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    with coordinator(tmp_path, "svc", "--upgrade-version", "1") as (ic, binding):
        assert binding.record().seq == -2
        assert binding.record().seq == 0
        assert collect(binding, 1) == [(1, incoming_fork(1, b"x"))]
        rec = binding.record()
        assert (rec.seq, rec.messages) == (-1, [(UPGRADE_TAKE_CHECKPOINT, b"")])
        binding.send(self_fork(1, b"x") + checkpoint(b"upgraded") + self_fork(1, b"y"))
        assert collect(binding, 1) == [(2, incoming_fork(1, b"y"))]  # "x" regenerated
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    assert "version=1" not in ic.ready  # it started at version 0
    new = tmp_path / "svc_1"
    assert (new / "serverchkpt1").read_bytes().endswith(b"upgraded")
    # A plain restart now runs version 1 and recovers from its checkpoint.
    with coordinator(tmp_path, "svc") as (ic, binding):
        assert "version=1" in ic.ready
        rec = binding.record()
        assert rec.seq == -2 and rec.blob == b"upgraded"
        assert collect(binding, 1) == [(2, incoming_fork(1, b"y"))]


def test_debug_replays_from_a_checkpoint_and_writes_nothing(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        first_start(binding, blob=b"cp1")
        binding.send(self_fork(1, b"x") + self_fork(1, b"y"))
        collect(binding, 2)
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    d = tmp_path / "svc_0"
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir()}
    registry_before = (tmp_path / "registry.sqlite3").read_bytes()
    with coordinator(tmp_path, "svc", "--checkpoint", "1", "--test-upgrade", command="debug") as (
        ic,
        binding,
    ):
        rec = binding.record()
        assert rec.seq == -2 and rec.blob == b"cp1"
        rec = binding.record()
        assert (rec.seq, rec.messages) == (-1, [(UPGRADE_SERVICE, b"")])
        assert binding.record().seq == 0
        assert [m for _, m in collect(binding, 2)] == [
            incoming_fork(1, b"x"),
            incoming_fork(1, b"y"),
        ]
        binding.send(self_fork(9, b"what-if output is discarded"))
        # Seed 002, upgrade what-if test: nothing follows the replay (no
        # TakeBecomingPrimaryCheckpoint). The binding ends its side; the coordinator
        # stops, having sent nothing more.
        binding.to_ic.shutdown(socket.SHUT_WR)
        assert ic.proc.wait(timeout=30) == 0
        with pytest.raises(EOFError):
            binding.record()
    after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir()}
    assert after == before
    assert (tmp_path / "registry.sqlite3").read_bytes() == registry_before


def test_debug_ends_the_replay_with_take_becoming_primary_checkpoint(tmp_path: Path) -> None:
    """Seed 002, *Starting up*: running a repro or what-if test, the binding receives the
    Checkpoint, the logged records, then TakeBecomingPrimaryCheckpoint; it sends a
    Checkpoint and goes on to normal processing, which the debug coordinator drops."""
    with coordinator(tmp_path, "svc") as (ic, binding):
        committer = first_start(binding, blob=b"cp1")
        binding.send(self_fork(1, b"x"))
        collect(binding, 1)
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    d = tmp_path / "svc_0"
    before = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir()}
    registry_before = (tmp_path / "registry.sqlite3").read_bytes()
    with coordinator(tmp_path, "svc", "--checkpoint", "1", command="debug") as (ic, binding):
        rec = binding.record()
        assert rec.seq == -2 and rec.blob == b"cp1"
        assert binding.record().seq == 0
        assert collect(binding, 1) == [(1, incoming_fork(1, b"x"))]
        # The reference's record (committer id 1 there): length 26, XXH64 of 02 0b, seq -1.
        tbpc = bytes.fromhex("1a000000 c7f179c2cb842dda ffffffffffffffff 02 0b")
        assert binding._read(26) == committer.to_bytes(4, "little") + tbpc
        binding.send(checkpoint(b"cp-debug") + self_fork(1, b"y") + frame(TAKE_CHECKPOINT))
        binding.to_ic.shutdown(socket.SHUT_WR)
        assert ic.proc.wait(timeout=30) == 0
        with pytest.raises(EOFError):  # nothing logged, echoed or asked for
            binding.record()
    after = {p.name: (p.stat().st_size, p.stat().st_mtime_ns) for p in d.iterdir()}
    assert after == before
    assert (tmp_path / "registry.sqlite3").read_bytes() == registry_before


def test_a_log_passing_its_size_trigger_rolls_and_asks_for_a_checkpoint(tmp_path: Path) -> None:
    # A trigger of about 2 KB: a few records of 1 KiB arguments pass it.
    with coordinator(tmp_path, "svc", "--log-trigger-mb", "0.002") as (ic, binding):
        first_start(binding)
        asked = False
        for i in range(8):
            binding.send(self_fork(1, bytes(1024)))
            rec = binding.record()
            if rec.seq == -1:
                assert rec.messages == [(TAKE_CHECKPOINT, b"")]
                asked = True
                binding.send(checkpoint(f"cp-{i}".encode()))
                rec = binding.record()
            assert rec.seq >= 1 and rec.body == incoming_fork(1, bytes(1024))
        assert asked
        binding.close()
        assert ic.proc.wait(timeout=30) == 0
    d = tmp_path / "svc_0"
    assert (d / "serverlog2").exists() and (d / "serverchkpt2").exists()
