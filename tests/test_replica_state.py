"""The replica state file: its bytes, its refusals of damage and of impossible values,
and its atomic replacement (a child SIGKILLed at every step of a save)."""

from __future__ import annotations

import os
import re
import signal
import stat
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import xxhash

from ambrosia_py.coordinator.storage.errors import StorageError
from ambrosia_py.coordinator.storage.files import InstanceFiles
from ambrosia_py.coordinator.storage.replica_state import (
    ReplicaState,
    ReplicaStateError,
    load_replica_state,
    replica_state_path,
    save_replica_state,
)

STATE = ReplicaState(replica=2, epoch=9, history=((1, 0), (4, 120), (9, 120)), checkpoint=3)


def by_hand(
    replica: int,
    epoch: int,
    checkpoint: int,
    history: list[tuple[int, int]],
    *,
    flags: int = 0,
    group: tuple[int, int] = (0, 0),
    version: int = 2,
    stated: int | None = None,
) -> bytes:
    """The file's bytes from its documented layout: ``b"AMBRREPL" | u16 version | u32 body
    length | i64 replica | i64 epoch | i64 checkpoint | u32 flags | u32 replicas | u32
    ack | u32 n | n x (i64, i64) | u64 XXH64 of all before`` (format 1: no ``flags``,
    ``replicas``, ``ack``)."""
    if version == 1:
        body = struct.pack("<qqqI", replica, epoch, checkpoint, len(history))
    else:
        fields = (replica, epoch, checkpoint, flags, *group, len(history))
        body = struct.pack("<qqqIIII", *fields)
    body += b"".join(struct.pack("<qq", e, s) for e, s in history)
    head = b"AMBRREPL" + struct.pack("<HI", version, len(body) if stated is None else stated)
    return head + body + struct.pack("<Q", xxhash.xxh64_intdigest(head + body))


@pytest.fixture
def files(tmp_path: Path) -> InstanceFiles:
    f = InstanceFiles(tmp_path / "data", "svc", 0)
    f.create()
    return f


def test_round_trip_in_the_documented_bytes(files: InstanceFiles) -> None:
    assert load_replica_state(files) is None
    save_replica_state(files, STATE)
    path = replica_state_path(files)
    assert path == files.path / "replica-state"
    assert path.read_bytes() == by_hand(2, 9, 3, [(1, 0), (4, 120), (9, 120)])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_replica_state(files) == STATE
    assert load_replica_state(files, replica=2) == STATE
    fresh = ReplicaState(replica=0, epoch=0, history=[])
    save_replica_state(files, fresh)  # replaces it whole
    assert path.read_bytes() == by_hand(0, 0, 0, [])
    assert load_replica_state(files) == fresh and fresh.checkpoint is None
    assert sorted(p.name for p in files.path.iterdir()) == ["replica-state"]  # no temp file
    recovering = ReplicaState(replica=1, epoch=3, history=[], recovering=True, group=(5, 3))
    save_replica_state(files, recovering)
    assert path.read_bytes() == by_hand(1, 3, 0, [], flags=1, group=(5, 3))
    assert load_replica_state(files) == recovering


def test_a_file_of_format_1_is_read_as_not_recovering(files: InstanceFiles) -> None:
    path = replica_state_path(files)
    path.write_bytes(by_hand(2, 9, 3, [(1, 0), (4, 120), (9, 120)], version=1))
    assert load_replica_state(files) == STATE and not STATE.recovering
    save_replica_state(files, STATE)  # saved again, in format 2
    assert path.read_bytes() == by_hand(2, 9, 3, [(1, 0), (4, 120), (9, 120)])


def test_every_single_byte_change_is_refused(files: InstanceFiles) -> None:
    save_replica_state(files, STATE)
    path = replica_state_path(files)
    good = path.read_bytes()
    refused = 0
    for at in range(len(good)):
        for mask in (0x01, 0x80, 0xFF):
            bad = bytearray(good)
            bad[at] ^= mask
            path.write_bytes(bytes(bad))
            with pytest.raises(ReplicaStateError, match=re.escape(str(path))):
                load_replica_state(files)
            refused += 1
    assert refused == 3 * len(good)


def test_every_cut_and_an_extension_are_refused(files: InstanceFiles) -> None:
    save_replica_state(files, STATE)
    path = replica_state_path(files)
    good = path.read_bytes()
    for size in range(len(good)):
        path.write_bytes(good[:size])
        with pytest.raises(ReplicaStateError, match=re.escape(str(path))) as caught:
            load_replica_state(files)
        assert re.search(r"shorter than|bytes in all|not a replica state", str(caught.value))
    path.write_bytes(good + b"\x00")
    with pytest.raises(ReplicaStateError, match="the file has 111"):
        load_replica_state(files)


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"AMBRIC\x03\x00" + bytes(90), r"not a replica state file \(magic b'AMBRIC\\x03\\x00'"),
        (by_hand(1, 2, 0, [(1, 0)], version=3), "format version 3 at offset 8; this"),
        (by_hand(1, 2, 0, [], flags=3), r"flags 0x3 at offset 38: only bit 0"),
        (by_hand(1, 2, 0, [], group=(3, 0)), r"a group of 3 replicas committing on 0 cannot"),
        (by_hand(1, 2, 0, [], group=(0, 1)), r"a group of 0 replicas committing on 1 cannot"),
        (by_hand(3, 2, 0, [], group=(3, 2)), r"replica 3 is not one of a group of 3"),
        (by_hand(1, 2, 0, [(1, 0)], stated=20), r"states a 20-byte body, so 42 bytes in all"),
        (by_hand(-1, 2, 0, []), r"replica number -1 is not in 0\.\."),
        (by_hand(1, -2, 0, []), r"epoch -2 is not in 0\.\."),
        (by_hand(1, 2, -1, []), r"checkpoint number -1 is not in 1\.\."),
        (by_hand(1, 2, 0, [(3, 0)]), r"history entry 0 has epoch 3, not in 1\.\.2 \(the epoch\)"),
        (by_hand(1, 2, 0, [(0, 0)]), r"history entry 0 has epoch 0"),
        (by_hand(1, 5, 0, [(1, 0), (1, 4)]), r"history entry 1 \(1, 4\) does not follow \(1, 0\)"),
        (by_hand(1, 5, 0, [(1, 9), (2, 4)]), r"history entry 1 \(2, 4\) does not follow \(1, 9\)"),
        (by_hand(1, 5, 0, [(1, -1)]), r"history entry 0 starts at seq -1"),
    ],
    ids=[
        "magic",
        "version",
        "flags",
        "ack-zero",
        "no-replicas",
        "replica-outside",
        "length",
        "replica",
        "epoch",
        "checkpoint",
        "epoch-above",
        "epoch-zero",
        "epochs-repeat",
        "starts-fall",
        "start-negative",
    ],
)
def test_files_with_a_valid_check_but_wrong_contents_are_refused(
    files: InstanceFiles, data: bytes, match: str
) -> None:
    path = replica_state_path(files)
    path.write_bytes(data)
    with pytest.raises(ReplicaStateError, match=f"^{re.escape(str(path))}: .*{match}"):
        load_replica_state(files)


def test_a_count_that_disagrees_with_the_length_is_refused(files: InstanceFiles) -> None:
    path = replica_state_path(files)
    for version, count_at in ((1, 38), (2, 50)):
        fields = struct.pack("<qqqI", 1, 2, 0, 5)  # five entries stated, none present
        body = fields if version == 1 else fields[:24] + struct.pack("<III", 0, 3, 2) + fields[24:]
        head = b"AMBRREPL" + struct.pack("<HI", version, len(body))
        path.write_bytes(head + body + struct.pack("<Q", xxhash.xxh64_intdigest(head + body)))
        stated = rf"5 history entries \(count at offset {count_at}\)"
        with pytest.raises(ReplicaStateError, match=stated):
            load_replica_state(files)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"replica": -1, "epoch": 0, "history": ()}, "replica number -1"),
        ({"replica": 0, "epoch": 2**63, "history": ()}, "epoch 9223372036854775808"),
        ({"replica": 0, "epoch": 1, "history": (), "checkpoint": 0}, "checkpoint number 0"),
        ({"replica": 0, "epoch": 1, "history": ((2, 0),)}, "has epoch 2, not in 1..1"),
        ({"replica": 0, "epoch": 3, "history": ((2, 5), (3, 4))}, r"\(3, 4\) does not follow"),
        ({"replica": 0, "epoch": 3, "history": ((1, 2, 3),)}, r"entry 0 is \(1, 2, 3\), not an"),
    ],
)
def test_impossible_values_cannot_be_made_or_saved(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ReplicaStateError, match=match) as caught:
        ReplicaState(**kwargs)  # type: ignore[arg-type]
    assert isinstance(caught.value, StorageError)


def test_another_replicas_data_dir_is_refused(files: InstanceFiles) -> None:
    save_replica_state(files, STATE)
    with pytest.raises(ReplicaStateError, match="belongs to replica 2, not to replica 1"):
        load_replica_state(files, replica=1)


def test_a_crash_anywhere_in_a_save_leaves_the_old_state_or_the_new(files: InstanceFiles) -> None:
    old = ReplicaState(replica=2, epoch=4, history=((1, 0), (4, 120)), checkpoint=1)
    seen = []

    def setup() -> None:
        save_replica_state(files, old)

    def check() -> None:
        state = load_replica_state(files, replica=2)
        assert state in (old, STATE)
        seen.append(state)

    steps = crash_at_every_step(setup, lambda: save_replica_state(files, STATE), check)
    assert steps >= 4  # create, write, fsync, rename, fsync of the directory
    assert seen[0] == old and seen[-1] == STATE


# --- a crash at every step (shared with tests/test_replica_log.py) ---------------------

_CHANGES = (
    "write",
    "pwrite",
    "pwritev",
    "ftruncate",
    "fsync",
    "fdatasync",
    "posix_fallocate",
    "unlink",
    "replace",
    "rename",
)


SECTOR = 512  # what a disk writes whole or not at all


def _arm(step: int) -> None:
    """Make this process SIGKILL itself at its ``step``-th file system change: a write,
    cut, sync, allocation, removal, rename or file creation. A write is torn first, as a
    power cut may tear it: its first half is written, cut back to a sector boundary."""
    real: dict[str, Any] = {name: getattr(os, name) for name in (*_CHANGES, "open", "lseek")}
    count = 0

    def tear(name: str, args: tuple[Any, ...]) -> None:
        fd = args[0]
        data = b"".join(map(bytes, args[1])) if name == "pwritev" else bytes(args[1])
        at = real["lseek"](fd, 0, os.SEEK_CUR) if name == "write" else args[2]
        end = (at + len(data) // 2) // SECTOR * SECTOR
        if end > at:
            real["pwrite"](fd, data[: end - at], at)

    def hooked(name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal count
            if name == "lseek" or (name == "open" and not args[1] & os.O_CREAT):
                return real[name](*args, **kwargs)
            count += 1
            if count == step:
                if name in ("write", "pwrite", "pwritev"):
                    tear(name, args)
                os.kill(os.getpid(), signal.SIGKILL)
            return real[name](*args, **kwargs)

        return call

    for name in real:
        setattr(os, name, hooked(name))


def killed_at(step: int, work: Callable[[], None]) -> bool:
    """Run ``work`` in a child process that is SIGKILLed at its ``step``-th file system
    change; True if it was, False if ``work`` finished first."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            _arm(step)
            work()
        except BaseException:
            code = 3
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return True
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, "the work failed in the child"
    return False


def crash_at_every_step(
    setup: Callable[[], None], work: Callable[[], None], check: Callable[[], None]
) -> int:
    """``setup``, then ``work`` killed at its first, second, ... change, ``check`` after
    each, until ``work`` finishes; also checks after the finished run. Returns the steps."""
    step = 1
    while True:
        setup()
        crashed = killed_at(step, work)
        check()
        if not crashed:
            return step - 1
        step += 1
