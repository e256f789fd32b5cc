"""Storage against loss, loose modes and damage, on real files and real coordinator processes.

1. A lost registry (deleted, emptied, unreadable) never makes a start clear an instance's
   history: the coordinator refuses in one line, naming the files, and
   ``registry rebuild`` recovers the registry so the instance recovers its state.
2. Every file a coordinator run creates is 0600 and every directory 0700, whatever the
   umask; a data directory with looser modes is tightened on start, and that is logged.
3. One flipped byte in the last complete record stops recovery naming file, offset and
   seq, with the file untouched; a record cut short is cut, its bytes kept beside the log.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.coordinator.registry.files import (
    RegistryRefusal,
    clear_interrupted_first_start,
)
from ambrosia_py.coordinator.registry.store import Registry
from ambrosia_py.coordinator.storage.files import InstanceFiles, LogScan
from ambrosia_py.testing import ImmortalRunner

EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")
INSTANCE = "tally"
HARNESS_LOG = ".coordinator.log"  # the test runner's own file in the data directory


class Tally(Immortal):
    def __init__(self) -> None:
        self.items: list[int] = []

    @rpc
    def add(self, n: int) -> None:
        self.items.append(n)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[ImmortalRunner]:
    r = ImmortalRunner(tmp_path / "data")
    try:
        yield r
    finally:
        r.close()


def fill(runner: ImmortalRunner, count: int, *, kill: bool) -> list[int]:
    """Start the instance, hand it ``count`` impulses, then SIGKILL or stop it."""
    svc = runner.start(Tally, INSTANCE)
    start = len(svc.state["items"])
    for i in range(start, start + count):
        svc.impulse.add(i)
    items: list[int] = svc.wait_until(lambda s: len(s["items"]) == start + count)["items"]
    if kill:
        svc.kill()
    else:
        svc.stop()
    return items


def snapshot(data_dir: Path) -> dict[str, bytes]:
    """Every file of every instance directory, by path, with its bytes."""
    return {
        str(p.relative_to(data_dir)): p.read_bytes()
        for d in data_dir.iterdir()
        if d.is_dir()
        for p in sorted(d.iterdir())
        if p.name.startswith(("serverlog", "serverchkpt"))
    }


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def assert_one_line_refusal(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("ambrosia-py: ")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def lose_registry(data_dir: Path, how: str) -> None:
    registry = data_dir / "registry.sqlite3"
    if how == "deleted":
        for side in ("", "-wal", "-shm", "-journal"):
            Path(f"{registry}{side}").unlink(missing_ok=True)
    elif how == "emptied":
        with Registry(data_dir) as reg:  # the rows gone, the tables there
            db = reg._conn()
            for table in ("versions", "links", "ingresses", "owners", "instances"):
                db.execute(f"DELETE FROM {table}")
    elif how == "truncated":
        for side in ("-wal", "-shm"):
            Path(f"{registry}{side}").unlink(missing_ok=True)
        registry.write_bytes(b"")
    else:  # corrupted: the header page overwritten
        data = bytearray(registry.read_bytes())
        data[:100] = b"\x5a" * 100
        registry.write_bytes(bytes(data))


# --- 1. registry safety -------------------------------------------------------------------


@pytest.mark.parametrize("how", ["deleted", "emptied", "truncated", "corrupted"])
def test_a_lost_registry_is_refused_then_rebuilt_and_the_state_recovers(
    runner: ImmortalRunner, how: str
) -> None:
    data_dir = runner.data_dir
    items = fill(runner, 30, kill=False)
    items = fill(runner, 20, kill=True)  # a second log, records after the checkpoint
    before = snapshot(data_dir)
    assert any("serverlog2" in name for name in before)
    with Registry(data_dir) as reg:
        known = reg.get(INSTANCE)
    assert known is not None and known.last_checkpoint == 2
    lose_registry(data_dir, how)

    needles = ["tally_0/serverchkpt", "ambrosia-py registry rebuild --data-dir"]
    refused = cli("coordinator", "--instance", INSTANCE, "--data-dir", data_dir)
    assert_one_line_refusal(refused, *needles)
    refused = cli("run", EXAMPLE, "--instance", INSTANCE, "--data-dir", data_dir)
    assert_one_line_refusal(refused, *needles)
    replayed = cli("replay", EXAMPLE, "--instance", INSTANCE, "--data-dir", data_dir)
    assert replayed.returncode == 1 and "Traceback" not in replayed.stderr, replayed.stderr
    assert all(n in replayed.stderr.splitlines()[-1] for n in needles), replayed.stderr
    assert snapshot(data_dir) == before  # byte for byte

    rebuilt = cli("registry", "rebuild", "--data-dir", data_dir)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert f"tally: version 0, checkpoint 2, committer {known.committer_id}," in rebuilt.stdout
    if how == "corrupted":
        assert "moved the unreadable registry.sqlite3 aside" in rebuilt.stdout
        assert len(list(data_dir.glob("registry.sqlite3.damaged-*"))) == 1
    assert snapshot(data_dir) == before

    again = runner.start(Tally, INSTANCE)
    assert again.state["items"] == items
    again.impulse.add(999)
    again.wait_until(lambda s: s["items"] == [*items, 999])


def test_a_registry_that_knows_the_name_but_not_the_history_is_refused(
    runner: ImmortalRunner,
) -> None:
    # The registry lost, then the instance registered again by hand: still no first start.
    data_dir = runner.data_dir
    fill(runner, 5, kill=True)
    before = snapshot(data_dir)
    lose_registry(data_dir, "deleted")
    assert cli("register", INSTANCE, "--data-dir", data_dir).returncode == 0
    refused = cli("coordinator", "--instance", INSTANCE, "--data-dir", data_dir)
    assert_one_line_refusal(refused, "no committed checkpoint", "serverlog1", "registry rebuild")
    assert snapshot(data_dir) == before


def test_an_unusable_data_directory_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    refused = cli("coordinator", "--instance", INSTANCE, "--data-dir", blocker / "data")
    assert_one_line_refusal(refused, str(blocker / "data"))


def test_only_an_interrupted_first_start_is_cleared(tmp_path: Path) -> None:
    files = InstanceFiles(tmp_path, INSTANCE, 0)
    files.create()
    with files.open_log(1) as log:
        log.append([(7).to_bytes(4, "little", signed=True) + bytes(40)])
    # Another committer's log: history, not leftovers.
    with pytest.raises(RegistryRefusal, match="written by committer 7, not 8"):
        clear_interrupted_first_start(files, 8)
    with pytest.raises(RegistryRefusal, match="no committer id"):
        clear_interrupted_first_start(files, None)
    files.open_log(2).close()
    with pytest.raises(RegistryRefusal, match="more than an interrupted first start"):
        clear_interrupted_first_start(files, 7)
    assert files.log_numbers() == [1, 2]
    files.log_path(2).unlink()
    clear_interrupted_first_start(files, 7)  # its own leftovers: cleared
    assert files.log_numbers() == []


# --- 2. file modes ------------------------------------------------------------------------


def modes(data_dir: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(data_dir.stat().st_mode)}
    for root, dirs, names in os.walk(data_dir):
        for name in dirs + names:
            path = Path(root) / name
            if not name.endswith(HARNESS_LOG):
                out[str(path.relative_to(data_dir))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def loose(found: dict[str, int], data_dir: Path) -> dict[str, str]:
    def want(name: str) -> int:
        return 0o700 if (data_dir / name).is_dir() else 0o600

    return {name: f"{mode:o}" for name, mode in found.items() if mode != want(name)}


def test_every_file_is_0600_and_every_directory_0700_whatever_the_umask(
    runner: ImmortalRunner,
) -> None:
    data_dir = runner.data_dir
    old = os.umask(0)  # the coordinator inherits it: modes must not depend on it
    try:
        svc = runner.start(Tally, INSTANCE)
        svc.impulse.add(1)
        svc.wait_until(lambda s: s["items"] == [1])
        running = modes(data_dir)  # while it runs: the registry's -wal and -shm too
        svc.kill()
        items = fill(runner, 3, kill=False)  # recovery: a second log and checkpoint
    finally:
        os.umask(old)
    assert items == [1, 1, 2, 3]
    after = modes(data_dir)
    assert {"registry.sqlite3-wal", "registry.sqlite3-shm"} <= set(running)
    assert {"tally_0", "tally_0/serverlog2", "tally_0/serverchkpt2"} <= set(after)
    assert {"tally_0/serverkillFile", "registry.sqlite3"} <= set(after)
    assert loose(running, data_dir) == {} and loose(after, data_dir) == {}


def test_a_loose_data_directory_is_tightened_on_start_and_logged_once(
    runner: ImmortalRunner,
) -> None:
    data_dir = runner.data_dir
    items = fill(runner, 3, kill=False)
    for path in [data_dir, *data_dir.rglob("*")]:
        # Not the link secret: a loose secret may have leaked, and is refused, not tightened.
        if not path.name.endswith(HARNESS_LOG) and path.name != "link-secret":
            path.chmod(0o755 if path.is_dir() else 0o644)
    log_before = (data_dir / f"{INSTANCE}{HARNESS_LOG}").read_text()
    assert fill(runner, 0, kill=False) == items
    log = (data_dir / f"{INSTANCE}{HARNESS_LOG}").read_text()[len(log_before) :]
    assert log.count("took group and other permissions off") == 1
    assert "serverlog1 (644)" in log and f"{data_dir} (755)" in log
    assert loose(modes(data_dir), data_dir) == {}


# --- 3. damage in the last record ---------------------------------------------------------


def last_record(data_dir: Path) -> tuple[Path, int, int, int]:
    """The newest log, and the offset, seq and length of its last record."""
    files = InstanceFiles(data_dir, INSTANCE, 0)
    path = files.log_path(files.log_numbers()[-1])
    scan = LogScan(path, committer_id=None, next_seq=None, last=True, repair=False)
    records = [(r.offset, r.seq, r.header.length) for r in scan]
    assert scan.damage is None and records
    return (path, *records[-1])


def test_a_flipped_byte_in_the_last_record_stops_recovery_and_keeps_the_file(
    runner: ImmortalRunner,
) -> None:
    data_dir = runner.data_dir
    fill(runner, 10, kill=True)
    path, offset, seq, _ = last_record(data_dir)
    data = bytearray(path.read_bytes())
    data[offset + 24 + 1] ^= 0x01  # one bit, inside the record's messages
    path.write_bytes(bytes(data))
    ic_log = data_dir / f"{INSTANCE}{HARNESS_LOG}"
    before = ic_log.read_text()
    with pytest.raises(RuntimeError):
        runner.start(Tally, INSTANCE)
    # The binding saw the coordinator go; its last line may still be on its way.
    deadline = time.monotonic() + 30
    while "recovery stopped" not in (err := ic_log.read_text()[len(before) :]):
        assert time.monotonic() < deadline, err
        time.sleep(0.01)  # polling a condition, bounded by the deadline
    assert f"recovery stopped: corrupt log {path} at offset {offset}, record seq {seq}" in err
    assert "check bytes do not match" in err and "Traceback" not in err
    assert path.read_bytes() == bytes(data)  # untouched, nothing cut
    assert list(path.parent.glob("*.torn-*")) == []


def test_a_cut_short_last_record_is_cut_and_its_bytes_kept(runner: ImmortalRunner) -> None:
    data_dir = runner.data_dir
    items = fill(runner, 10, kill=True)
    path, offset, _, length = last_record(data_dir)
    whole = path.read_bytes()
    os.truncate(path, offset + length - 3)  # the last write did not finish
    cut_bytes = whole[offset : offset + length - 3]
    again = runner.start(Tally, INSTANCE)
    state = again.state["items"]
    assert state == items[: len(state)] and len(state) < len(items)
    kept = path.with_name(f"{path.name}.torn-{offset}")
    assert kept.read_bytes() == cut_bytes
    assert stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert path.read_bytes() == whole[:offset]
    log = (data_dir / f"{INSTANCE}{HARNESS_LOG}").read_text()
    assert f"the cut bytes are kept in {kept}" in log
