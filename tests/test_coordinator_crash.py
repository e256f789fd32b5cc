"""SIGKILL the coordinator at random points while a binding streams impulses.

Impulses are input from the outside world (a real binding sends them from background
tasks), so replay does not regenerate them: what was logged is all there is.

The fake binding's state is the list of numbers it has been handed; its checkpoint blob
is that list. After every crash and recovery the state must be exactly the state before
the round plus a prefix of what the round sent, and that prefix must include everything
the binding had been handed before the kill: nothing lost, nothing twice.
"""

from __future__ import annotations

import random
import struct
import threading
from pathlib import Path

from tests.fake_binding import FakeBinding, checkpoint, coordinator, frame, self_impulse, unzz

TAKE_BECOMING_PRIMARY = 11


def encode_state(state: list[int]) -> bytes:
    return struct.pack(f"<{len(state)}q", *state)


def decode_state(blob: bytes) -> list[int]:
    return list(struct.unpack(f"<{len(blob) // 8}q", blob))


def impulse_value(data: bytes) -> int:
    # incoming call body: return type 0, method id, rpc type 2, then the 8-byte argument
    assert data[0] == 0
    _, pos = unzz(data, 1)
    assert data[pos] == 2
    return int(struct.unpack("<q", data[pos + 1 :])[0])


def stream(binding: FakeBinding, values: list[int], stop: threading.Event) -> None:
    try:
        for v in values:
            if stop.is_set():
                return
            binding.send(self_impulse(7, struct.pack("<q", v)))
    except OSError:
        return  # the coordinator was killed


def test_sigkill_at_random_points_loses_nothing_and_repeats_nothing(tmp_path: Path) -> None:
    rng = random.Random(20261122)
    state: list[int] = []
    check: tuple[list[int], list[int], int] | None = None  # (base, sent this round, handed)
    next_value = 0
    rounds = 7  # six crashes, each recovered and checked by the next round
    for round_no in range(rounds):
        with coordinator(tmp_path, "crashy") as (ic, binding):
            rec = binding.record()
            if round_no == 0:
                assert rec.seq == -1
                binding.send(frame(9, b"init") + checkpoint(encode_state(state)))
                assert binding.record().seq == 0
            else:
                assert rec.seq == -2 and rec.blob is not None
                state = decode_state(rec.blob)
                while True:
                    rec = binding.record()
                    if rec.seq == -1:
                        assert rec.messages == [(TAKE_BECOMING_PRIMARY, b"")]
                        break
                    for mtype, data in rec.messages:
                        if mtype == 0:
                            state.append(impulse_value(data))
                assert check is not None
                base, sent, handed = check
                k = len(state) - len(base)
                assert state[: len(base)] == base, "state before the round changed"
                assert state[len(base) :] == sent[:k], "recovered input is not a prefix of sent"
                assert k >= handed, f"lost input: {handed} handed, {k} recovered"
                binding.send(checkpoint(encode_state(state)))
                if round_no == rounds - 1:
                    break
            base = list(state)
            sent = list(range(next_value, next_value + 2000))
            next_value += 2000
            stop = threading.Event()
            sender = threading.Thread(target=stream, args=(binding, sent, stop))
            sender.start()
            kill_after = rng.randint(1, 1500)
            handed = 0
            try:
                while handed < kill_after:
                    rec = binding.record()
                    assert rec.seq >= 0
                    for mtype, data in rec.messages:
                        assert mtype == 0
                        state.append(impulse_value(data))
                        handed += 1
                ic.kill()
            finally:
                stop.set()
                sender.join(timeout=30)
            assert state[len(base) :] == sent[:handed]
            check = (base, sent, handed)
    assert len(state) >= 6  # every round handed at least one call, and all were kept
