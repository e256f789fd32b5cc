"""``ambrosia-py register``, ``instances`` and ``log show|verify|prune``: output and exit codes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ambrosia_py import wire
from ambrosia_py.cli import main
from ambrosia_py.coordinator.registry.store import Registry
from ambrosia_py.coordinator.storage.files import InstanceFiles

COMMITTER = 7


def body(seq: int) -> bytes:
    batch = wire.RpcBatch(
        (
            wire.IncomingRpc(1, wire.RpcType.ASYNC_AWAIT, bytes(range(40)), "caller", 9),
            wire.IncomingReturnValue(wire.ReturnType.VALUE, "other", 4, b"ok"),
        )
    )
    fork = wire.IncomingRpc(3, wire.RpcType.FORK, f'{{"n": {seq}}}'.encode())
    return wire.encode_message(fork) + wire.encode_message(batch)


def record(seq: int) -> bytes:
    return wire.encode_disk_record(
        COMMITTER,
        seq,
        body(seq),
        [wire.Watermark("peer", 40 + seq, 30 + seq)],
        [wire.TrimWatermark("peer", 2)],
    )


@pytest.fixture
def files(tmp_path: Path) -> InstanceFiles:
    """Instance ``svc`` version 0: logs 1 (seqs 0-1), 2 (2-3), 3 (4); checkpoints 1-3."""
    f = InstanceFiles(tmp_path, "svc", 0)
    f.create()
    for n, seqs in ((1, range(0, 2)), (2, range(2, 4)), (3, range(4, 5))):
        f.write_checkpoint(n, [f"state {n}".encode()])
        with f.open_log(n) as log:
            for seq in seqs:
                log.append([record(seq)])
    return f


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def test_register_and_instances(tmp_path: Path) -> None:
    result = run("register", "alpha", "--data-dir", tmp_path)
    assert result.exit_code == 0, result.output
    with Registry(tmp_path) as reg:
        alpha = reg.get("alpha")
    assert alpha is not None
    assert result.output == (
        f"alpha: receive port {alpha.receive_port}, send port {alpha.send_port}, version 0\n"
    )
    result = run(
        "register", "beta", "--data-dir", tmp_path, "--receive-port", "24001",
        "--send-port", "24002", "--version", "3",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert result.output == "beta: receive port 24001, send port 24002, version 3\n"
    # A second registration with a new version moves the instance to it.
    assert "version 4" in run("register", "beta", "--data-dir", tmp_path, "--version", "4").output
    with Registry(tmp_path) as reg:
        reg.commit_checkpoint("beta", 4, 2, 2)
        reg.set_link_address("beta", "127.0.0.1", 24003)

    def cells(name: str) -> list[str]:
        result = run("instances", "--data-dir", tmp_path)
        assert result.exit_code == 0, result.output
        (line,) = [line for line in result.output.splitlines() if f" {name} " in line]
        return [c.strip() for c in line.split("│")[1:-1]]

    # Published by a coordinator that is gone: not shown, and not alive.
    assert cells("beta") == ["beta", "4", "24001", "24002", "2", "2", "-", "no", "-", "-", "-"]
    files = InstanceFiles(tmp_path, "beta", 4)
    files.create()
    files.acquire_lock()  # as its running coordinator does
    try:
        beta = cells("beta")
    finally:
        files.release_lock()
    assert beta[:8] == ["beta", "4", "24001", "24002", "2", "2", "-", f"yes (pid {os.getpid()})"]
    assert beta[8] == socket.gethostname() and beta[9:] == ["127.0.0.1:24003", "-"]
    assert cells("alpha")[7:] == ["no", "-", "-", "-"]  # no coordinator accepts links
    result = run("instances", "--data-dir", tmp_path)
    lines = result.output.splitlines()
    assert any("alpha" in line and str(alpha.receive_port) in line for line in lines)
    assert "checkpoint" in result.output and "receive" in result.output


def test_register_port_clash_fails(tmp_path: Path) -> None:
    run("register", "a", "--data-dir", tmp_path, "--receive-port", "24001", "--send-port", "24002")
    result = run("register", "b", "--data-dir", tmp_path, "--receive-port", "24002")
    assert result.exit_code == 1
    assert "receive port 24002 for 'b' is already used by instance 'a'" in result.output


def test_instances_without_registry(tmp_path: Path) -> None:
    result = run("instances", "--data-dir", tmp_path)
    assert result.exit_code == 0 and "no registry" in result.output
    Registry(tmp_path).close()
    result = run("instances", "--data-dir", tmp_path)
    assert result.exit_code == 0 and "no instances registered" in result.output


def test_log_show_prints_records_and_messages(files: InstanceFiles) -> None:
    result = run("log", "show", files.log_path(1))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"record seq 0  offset 0  committer 7  length {wire.HEADER_SIZE + len(body(0))}  messages 2"
    )
    assert lines[1] == "  watermarks: 'peer' seq 40 replayable 30"
    assert lines[2] == "  trims: 'peer' seq 2"
    assert lines[3] == "  RPC fork method 3, args 8 bytes: 7b226e223a20307d '{\"n\": 0}'"
    assert lines[4] == "  RPC batch of 2"
    assert lines[5] == (
        "    RPC async_await method 1 from 'caller' call 9, "
        "args 40 bytes: 000102030405060708090a0b0c0d0e0f..."
    )
    assert lines[6] == "    return value from 'other' call 4, value 2 bytes: 6f6b 'ok'"
    assert sum(line.startswith("record seq") for line in lines) == 2


def test_log_show_from_seq_and_limit(files: InstanceFiles) -> None:
    with files.open_log(3) as log:
        for seq in range(5, 9):
            log.append([record(seq)])
    result = run("log", "show", files.log_path(3), "--from-seq", "6", "--limit", "2")
    assert result.exit_code == 0, result.output
    heads = [line.split()[2] for line in result.output.splitlines() if line.startswith("record")]
    assert heads == ["6", "7"]
    result = run("log", "show", files.log_path(3), "--from-seq", "100")
    assert result.exit_code == 0 and result.output == "no records\n"


def test_log_show_reports_a_torn_tail(files: InstanceFiles) -> None:
    path = files.log_path(3)
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-3])
    result = run("log", "show", path)
    assert result.exit_code == 1
    assert "record seq 4" not in result.output
    assert "torn tail" in result.output and f"{size - 3} bytes from offset 0" in result.output
    assert path.stat().st_size == size - 3  # show never repairs


def test_log_verify_a_directory_and_a_file(files: InstanceFiles) -> None:
    total = sum(files.log_path(n).stat().st_size for n in (1, 2, 3))
    result = run("log", "verify", files.path)
    assert result.exit_code == 0, result.output
    assert result.output == (f"OK: 3 files, 5 records, 15 messages, {total} bytes, seqs 0..4\n")
    result = run("log", "verify", files.log_path(2))
    assert result.exit_code == 0, result.output
    assert result.output.startswith("OK: 1 file, 2 records, 6 messages")


def test_log_verify_names_the_first_bad_record(files: InstanceFiles) -> None:
    path = files.log_path(2)
    data = bytearray(path.read_bytes())
    second = len(record(2))
    data[second + 30] ^= 0x01  # inside the body of seq 3, the last record of a non-last file
    path.write_bytes(bytes(data))
    result = run("log", "verify", files.path)
    assert result.exit_code == 1
    assert f"bad record in {path} at offset {second}, seq 3: check bytes" in result.output


def test_log_verify_reports_a_torn_tail(files: InstanceFiles) -> None:
    path = files.log_path(3)
    path.write_bytes(path.read_bytes()[:-1])
    result = run("log", "verify", files.path)
    assert result.exit_code == 1
    assert "torn tail" in result.output
    assert f"in {path} at offset 0" in result.output and "next seq 4" in result.output


def test_log_verify_reports_gaps(files: InstanceFiles) -> None:
    files.log_path(2).unlink()
    result = run("log", "verify", files.path)
    assert result.exit_code == 1 and "serverlog2" in result.output and "missing" in result.output
    files.log_path(3).rename(files.log_path(2))  # logs 1, 2 now hold seqs 0-1 and 4
    result = run("log", "verify", files.path)
    assert result.exit_code == 1
    assert "seq 4: sequence id 4 where 2 was expected" in result.output


def test_log_verify_empty_directory(tmp_path: Path) -> None:
    result = run("log", "verify", tmp_path)
    assert result.exit_code == 1 and "no log files" in result.output


def test_log_prune(files: InstanceFiles) -> None:
    with Registry(files.data_dir) as reg:
        reg.register("svc")
        reg.commit_checkpoint("svc", 0, 2, 2)
    # The registry's committed checkpoint 2 is kept even though only 1 is asked for.
    result = run("log", "prune", "--data-dir", files.data_dir, "--instance", "svc", "--keep", "1")
    assert result.exit_code == 0, result.output
    assert result.output == (
        "removed serverchkpt1\nremoved serverlog1\nkept checkpoints 2, 3; logs 2, 3\n"
    )
    args: list[str | Path] = [
        "log",
        "prune",
        "--data-dir",
        files.data_dir,
        "--instance",
        "svc",
        "--version",
        "0",
    ]
    result = run(*args, "--keep", "5")
    assert result.exit_code == 0 and result.output.startswith("nothing to remove")
    assert not files.lock_path.read_text()  # the lock was released


def test_log_prune_keeps_a_replicas_own_committed_checkpoint(files: InstanceFiles) -> None:
    """A replica's data dir: the registry's committed checkpoint (3) is the instance's,
    numbered in another replica's files; this replica committed its checkpoint 1 (its
    state file says so; 2 and 3 were written, never committed). Pruning to one checkpoint
    must keep 1 and every log after it."""
    from ambrosia_py.coordinator.storage.replica_state import ReplicaState, save_replica_state

    with Registry(files.data_dir) as reg:
        reg.register("svc")
        reg.commit_checkpoint("svc", 0, 3, 3)
    save_replica_state(files, ReplicaState(1, 2, ((2, 0),), 1))
    result = run("log", "prune", "--data-dir", files.data_dir, "--instance", "svc", "--keep", "1")
    assert result.exit_code == 0, result.output
    assert result.output == "nothing to remove\nkept checkpoints 1, 2, 3; logs 1, 2, 3\n"


def test_log_prune_needs_a_version_or_registration(files: InstanceFiles) -> None:
    result = run("log", "prune", "--data-dir", files.data_dir, "--instance", "svc", "--keep", "1")
    assert result.exit_code == 1 and "give --version" in result.output
    result = run(
        "log", "prune", "--data-dir", files.data_dir, "--instance", "nope", "--version", "0",
        "--keep", "1",
    )  # fmt: skip
    assert result.exit_code == 1 and "no directory" in result.output


HOLDER = """
import sys, pathlib
from ambrosia_py.coordinator.storage.files import InstanceFiles
files = InstanceFiles(pathlib.Path(sys.argv[1]), "svc", 0)
files.acquire_lock()
print("locked", flush=True)
sys.stdin.readline()
"""


@pytest.fixture
def holder(files: InstanceFiles) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(files.data_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "locked\n"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_log_prune_refuses_while_a_coordinator_runs(
    files: InstanceFiles, holder: subprocess.Popen[str]
) -> None:
    args: list[str | Path] = [
        "log",
        "prune",
        "--data-dir",
        files.data_dir,
        "--instance",
        "svc",
        "--version",
        "0",
    ]
    result = run(*args, "--keep", "1")
    assert result.exit_code == 1
    assert "refusing to prune" in result.output and f"pid {holder.pid}" in result.output
    assert files.checkpoint_numbers() == [1, 2, 3] and files.log_numbers() == [1, 2, 3]


def test_registry_rebuild_registers_what_the_files_say(files: InstanceFiles) -> None:
    # The fixture's checkpoints are not coordinator checkpoints: none reads, so the
    # instance is registered with no checkpoint and its committer from the log.
    result = run("registry", "rebuild", "--data-dir", files.data_dir)
    assert result.exit_code == 0, result.output
    assert f"svc: version 0, checkpoint -, committer {COMMITTER}," in result.output
    assert result.output.count("skipped a checkpoint that does not read") == 3
    with Registry(files.data_dir) as reg:
        info = reg.get("svc")
    assert info is not None and (info.last_checkpoint, info.committer_id) == (None, COMMITTER)
    again = run("registry", "rebuild", "--data-dir", files.data_dir)
    assert again.exit_code == 0 and "already knows every instance" in again.output


def test_registry_rebuild_refuses_while_a_coordinator_runs(
    files: InstanceFiles, holder: subprocess.Popen[str]
) -> None:
    result = run("registry", "rebuild", "--data-dir", files.data_dir)
    assert result.exit_code == 1
    assert "registry not rebuilt" in result.output and f"pid {holder.pid}" in result.output


def test_instances_on_an_unreadable_registry_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "registry.sqlite3").write_bytes(b"\x5a" * 4096)
    result = run("instances", "--data-dir", tmp_path)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "registry.sqlite3" in result.output and "registry rebuild" in result.output
