"""On-disk records written by hand from the reference, read by the tools and by recovery.

Every byte below is laid out with ``struct`` and a ZigZag varint written here, following
``shared/reference/ambrosia.md`` (*Log record header*, *Message types*, *RPC layouts*,
*Files on disk*), not with the project's encoder: the header with the length stored as
``-length-1``, check bytes that are XXH64 of the messages only, and behind the messages
(not counted in the length) the watermarks (zigzag count; per sender zigzag name length,
name, i64 last seq, i64 last replayable seq) and the trim watermarks (zigzag count; per
destination zigzag name length, name, i64 trim seq). The records carry message types 13
(CountReplayableRPCBatch) and 14 (TrimTo) besides plain incoming calls and a return value.

A real coordinator makes the instance (first start: record 0, checkpoint 1, the
registry); the hand-written records are appended to its log with its committer id. Then
``ambrosia-py log show`` and ``log verify`` must read them as the reference says, the
replay reader must rebuild the link watermarks from them, and a coordinator recovering
from that data directory must send them to its binding with the length positive and the
watermarks left out (*When replaying to a binding ...*), then number the next record on
from them.
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import struct
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import xxhash

from ambrosia_py.coordinator.core.binding_link import BindingLink
from ambrosia_py.coordinator.core.intake import IcState
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replay import Replayed, replay_log
from tests.fake_binding import checkpoint, coordinator, frame

INSTANCE = "vec"
HEADER = struct.Struct("<iiQq")  # committer id, length, check bytes, sequence id
DEADLINE = 60.0


def zz(value: int) -> bytes:
    """ZigZag, then a little-endian base-128 varint (reference ambrosia.md, *Primitives*)."""
    n = ((value << 1) ^ (value >> 63)) & (2**64 - 1)
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def name(text: str) -> bytes:
    raw = text.encode()
    return zz(len(raw)) + raw


def msg(mtype: int, data: bytes) -> bytes:
    """``zigzag (size of type byte + data) | type byte | data``."""
    return zz(1 + len(data)) + bytes([mtype]) + data


def fork(method: int, args: bytes) -> bytes:
    return msg(0, b"\x00" + zz(method) + b"\x01" + args)


def impulse(method: int, args: bytes) -> bytes:
    return msg(0, b"\x00" + zz(method) + b"\x02" + args)


def self_impulse(method: int, args: bytes) -> bytes:
    """What a binding sends for an impulse to itself: the outgoing form, destination
    length 0 (*RPC layouts*); the coordinator logs it as :func:`impulse`."""
    return msg(0, zz(0) + b"\x00" + zz(method) + b"\x02" + args)


def call(method: int, sender: str, call_seq: int, args: bytes) -> bytes:
    """An incoming async/await call: sender and the caller's call sequence number."""
    return msg(0, b"\x00" + zz(method) + b"\x00" + name(sender) + zz(call_seq) + args)


def returned(sender: str, call_seq: int, value: bytes) -> bytes:
    """An incoming return value (return type 1: a value, length-prefixed)."""
    return msg(0, b"\x01" + name(sender) + zz(call_seq) + zz(len(value)) + value)


def count_replayable_batch(messages: list[bytes], replayable: int) -> bytes:
    """Type 13: zigzag count, zigzag count of non-impulse messages, the messages."""
    return msg(13, zz(len(messages)) + zz(replayable) + b"".join(messages))


def trim_to(seq: int) -> bytes:
    """Type 14: zigzag long."""
    return msg(14, zz(seq))


def tail(marks: list[tuple[str, int, int]], trims: list[tuple[str, int]]) -> bytes:
    out = zz(len(marks))
    for sender, last, last_replayable in marks:
        out += name(sender) + struct.pack("<qq", last, last_replayable)
    out += zz(len(trims))
    for dest, seq in trims:
        out += name(dest) + struct.pack("<q", seq)
    return out


def on_disk(committer: int, seq: int, body: bytes, after: bytes) -> bytes:
    length = HEADER.size + len(body)
    return HEADER.pack(committer, -length - 1, xxhash.xxh64_intdigest(body), seq) + body + after


def on_wire(committer: int, seq: int, body: bytes) -> bytes:
    return HEADER.pack(committer, HEADER.size + len(body), xxhash.xxh64_intdigest(body), seq) + body


# The hand-written records, seq 1 on (record 0 is the coordinator's InitialMessage).
ARGS = b"{}"
BODIES: dict[int, bytes] = {
    # A fork from link sender 'peer' (its message 0); this instance trimmed its output to
    # 'peer' at 5.
    1: fork(3, ARGS),
    # Type 13: an awaited call from 'peer' (its message 1, call 7), an impulse and a self
    # fork; two of the three are replayable. Trims to two destinations.
    2: count_replayable_batch(
        [call(4, "peer", 7, ARGS), impulse(5, b"\xff\x01\x02"), fork(6, ARGS)], 2
    ),
    # Type 14 beside a return value from 'other' (its message 0, for our call 2).
    3: trim_to(9) + returned("other", 2, b"\x2a"),
}
TAILS: dict[int, bytes] = {
    1: tail([("peer", 0, 0)], [("peer", 5)]),
    2: tail([("peer", 1, 1)], [("peer", 6), ("other", 2)]),
    3: tail([("other", 0, 0)], []),
}
MESSAGES = {1: 1, 2: 3, 3: 2}  # messages per record, a batch's counted one by one
INBOX = {"peer": 2, "other": 1}  # per sender, the seq after its last logged message
OUTPUTS = 1  # replayable messages that are not from links: the self fork in record 2


@attrs.frozen
class Instance:
    """The data dir the fixture made, and what the coordinator's own record 0 was."""

    data: Path
    log: Path
    committer: int
    offsets: dict[int, int]  # seq -> offset of its record in the log
    record0: bytes  # record 0 in wire form
    length0: int


@pytest.fixture(scope="module")
def instance(tmp_path_factory: pytest.TempPathFactory) -> Instance:
    """A data dir whose log 1 holds the coordinator's record 0, then the hand records."""
    data = tmp_path_factory.mktemp("vectors")
    with coordinator(data, INSTANCE) as (ic, binding):
        assert binding.record().seq == -1  # TakeBecomingPrimaryCheckpoint
        binding.send(frame(9, b"init") + checkpoint(b"state-1"))
        record0 = binding.record()
        assert record0.seq == 0
        binding.close()  # the coordinator makes what it holds durable and exits
        ic.proc.wait(DEADLINE)
    log = data / f"{INSTANCE}_0" / "serverlog1"
    raw = log.read_bytes()
    committer, stored, check, seq = HEADER.unpack_from(raw)
    # Record 0 as the coordinator wrote it, read by the reference's rules.
    assert (committer, seq) == (record0.committer, 0)
    length = -stored - 1
    assert length == HEADER.size + len(record0.body)
    assert check == xxhash.xxh64_intdigest(raw[HEADER.size : length])
    assert raw[length:] == tail([], [])  # no watermarks, no trims: two zero counts
    offsets = {0: 0}
    with log.open("ab") as f:
        for s, body in BODIES.items():
            offsets[s] = f.tell()
            f.write(on_disk(committer, s, body, TAILS[s]))
    return Instance(data, log, committer, offsets, on_wire(committer, 0, record0.body), length)


def test_the_hand_encoder_writes_the_reference_examples() -> None:
    """The helpers above against the reference's own bytes (*Log record header*,
    *RPC layouts*), so the vectors below rest on the reference, not on themselves."""
    assert on_wire(1, 0, fork(3, b"{}")) == bytes.fromhex(
        "01000000 1f000000 adb7b72576a9270f 0000000000000000 0c 00 00 06 01 7b 7d"
    )
    assert impulse(3, b"\xff\x01\x02") == bytes.fromhex("0e 00 00 06 02 ff 01 02")
    # The reference's self-call Fork (0e 00 00 00 06 01 7b7d) with rpc type 2, impulse.
    assert self_impulse(3, b"{}") == bytes.fromhex("0e 00 00 00 06 02 7b7d")
    assert [zz(v) for v in (0, 1, -1, 5, 63, 64, -65, 300)] == [
        bytes.fromhex(h) for h in ("00", "02", "01", "0a", "7e", "8001", "8101", "d804")
    ]
    assert zz(2147483647) == bytes.fromhex("feffffff0f")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", "log", *args],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_log_show_reads_the_hand_written_records(instance: Instance) -> None:
    done = _cli("show", str(instance.log))
    assert done.returncode == 0, done.stderr
    out = done.stdout
    committer, offsets = instance.committer, instance.offsets
    heads = re.findall(
        r"^record seq (\d+)  offset (\d+)  committer (-?\d+)  length (\d+)  "
        r"messages (\d+)$",
        out,
        re.M,
    )
    # length: the real one (the disk's -length-1 read back); messages: top-level ones.
    expected = [(0, 0, committer, instance.length0, 1)] + [
        (s, offsets[s], committer, HEADER.size + len(BODIES[s]), 2 if s == 3 else 1) for s in BODIES
    ]
    assert [tuple(int(x) for x in h) for h in heads] == expected
    assert "  watermarks: 'peer' seq 0 replayable 0\n  trims: 'peer' seq 5\n" in out
    assert "  watermarks: 'peer' seq 1 replayable 1\n  trims: 'peer' seq 6; 'other' seq 2\n" in out
    assert "  watermarks: 'other' seq 0 replayable 0\n" in out
    assert out.count("watermarks:") == 3 and out.count("trims:") == 2
    # The messages, as laid out by hand: methods, senders, call numbers, the batch's counts.
    assert "  RPC fork method 3, args 2 bytes: 7b7d '{}'\n" in out
    assert "  RPC batch of 3 (2 replayable)\n" in out
    assert "    RPC async_await method 4 from 'peer' call 7, args 2 bytes: 7b7d '{}'\n" in out
    assert "    RPC impulse method 5, args 3 bytes: ff0102\n" in out
    assert "    RPC fork method 6, args 2 bytes: 7b7d '{}'\n" in out
    assert "  TrimTo(seq=9)\n" in out
    assert "  return value from 'other' call 2, value 1 bytes: 2a '*'\n" in out


def test_log_verify_counts_the_hand_written_records(instance: Instance) -> None:
    log = instance.log
    messages = 1 + sum(MESSAGES.values())
    for path in (log, log.parent):
        done = _cli("verify", str(path))
        assert done.returncode == 0, done.stderr
        assert done.stdout == (
            f"OK: 1 file, 4 records, {messages} messages, {log.stat().st_size} bytes, seqs 0..3\n"
        )


def test_log_verify_finds_a_watermark_section_cut_short(tmp_path: Path) -> None:
    """A last record whose watermarks were cut by a crash is a torn tail (reference: a
    torn tail is found and recovery stops at the last good record)."""
    first = on_disk(7, 0, BODIES[1], TAILS[1])
    second = on_disk(7, 1, BODIES[2], TAILS[2])
    log = tmp_path / "serverlog1"
    log.write_bytes(first + second[:-5])
    done = _cli("verify", str(log))
    assert done.returncode == 1
    assert f"at offset {len(first)}: {len(second) - 5} bytes after the last good record " in (
        done.stderr
    )


def test_replay_reads_the_watermarks_and_the_batch(instance: Instance) -> None:
    """The replay reader (recovery's, in process): records in wire form, and from the
    watermarks where each link sender resumes; from type 13 how many outputs replay
    regenerates."""
    data = instance.data
    files = InstanceFiles(data, INSTANCE, 0)
    state = IcState.decode(files.read_checkpoint(1), "checkpoint 1")

    async def replay() -> tuple[Replayed, bytes]:
        ours, theirs = socket.socketpair()
        unused, unused_peer = socket.socketpair()
        ours.setblocking(False)
        unused.setblocking(False)
        link = BindingLink(unused, ours)
        try:
            replayed = await replay_log(files, link, state, 1, repair=False)
            theirs.setblocking(False)
            got = b""
            while True:
                try:
                    chunk = theirs.recv(1 << 20)
                except BlockingIOError:
                    break
                got += chunk
            return replayed, got
        finally:
            link.close()
            for s in (theirs, unused_peer):
                s.close()

    replayed, got = asyncio.run(replay())
    committer = instance.committer
    expected = instance.record0 + b"".join(on_wire(committer, s, b) for s, b in BODIES.items())
    assert got == expected
    assert replayed.next_seq == 4
    assert replayed.inbox == INBOX
    assert replayed.outputs == OUTPUTS


def test_a_coordinator_recovers_from_the_hand_written_records(
    instance: Instance, tmp_path: Path
) -> None:
    source, committer = instance.data, instance.committer
    data = tmp_path / "data"  # a copy: recovery adds a log and a checkpoint
    shutil.copytree(source, data)
    with coordinator(data, INSTANCE) as (ic, binding):
        rec = binding.record()
        assert (rec.seq, rec.blob) == (-2, b"state-1")
        replayed = [binding.record() for _ in range(4)]
        got = [on_wire(r.committer, r.seq, r.body) for r in replayed]
        assert got == [instance.record0] + [on_wire(committer, s, b) for s, b in BODIES.items()]
        assert binding.record().seq == -1  # TakeBecomingPrimaryCheckpoint
        binding.send(checkpoint(b"state-2") + self_impulse(5, b"\xff\x03"))
        nxt = binding.record()
        assert (nxt.committer, nxt.seq, nxt.body) == (committer, 4, impulse(5, b"\xff\x03"))
        binding.close()
        ic.proc.wait(DEADLINE)
