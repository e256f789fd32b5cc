"""What the coordinator refuses: a second binding, a second coordinator, damaged logs."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

from ambrosia_py.coordinator.storage.files import log_data_size
from ambrosia_py.testing import readline_within
from ambrosia_py.wire import logfile
from tests.fake_binding import (
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    incoming_fork,
    incoming_impulse,
    ready_token,
    self_fork,
    self_impulse,
    start_coordinator,
)

DEADLINE = 30


def start(binding: FakeBinding) -> None:
    assert binding.record().seq == -1
    binding.send(frame(9, b"init") + checkpoint(b"cp"))
    assert binding.record().seq == 0


def one_by_one(binding: FakeBinding, n: int) -> None:
    """Send n self-calls, each waiting for its echo, so each is a record of its own."""
    for i in range(n):
        binding.send(self_fork(1, bytes([i])))
        rec = binding.record()
        assert rec.seq == i + 1 and rec.body == incoming_fork(1, bytes([i]))


def run_ic(data_dir: Path, instance: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "coordinator",
            "--instance",
            instance,
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )


def test_a_second_binding_is_refused_and_the_first_unaffected(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        start(binding)
        for port in (binding.receive_port, binding.send_port):
            intruder = socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
            assert intruder.recv(1) == b""  # closed by the coordinator
            intruder.close()
        one_by_one(binding, 3)
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        assert ic.stderr().count("refusing a second binding connection") == 2


def test_a_second_coordinator_for_the_instance_is_refused(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        start(binding)
        second = run_ic(tmp_path, "svc")
        assert second.returncode == 2
        assert f"pid {ic.proc.pid}" in second.stderr
        assert "svc" in second.stderr
        one_by_one(binding, 1)  # the first is unaffected


def test_a_binding_that_dies_between_its_two_connections_lets_the_instance_start_again(
    tmp_path: Path,
) -> None:
    """Killed after proving the token on the receive port, before the send port: the
    coordinator stops and releases the instance instead of waiting for good."""
    for attempt in range(2):
        proc = start_coordinator(tmp_path, "svc")
        assert proc.stdout is not None and proc.stderr is not None
        line = readline_within(proc.stdout, DEADLINE)
        fields = dict(kv.split("=") for kv in line.split() if "=" in kv)
        half = FakeBinding(
            int(fields["receive_port"]),
            int(fields["send_port"]),
            ready_token(fields, tmp_path, "svc"),
        ).connect_receive()
        half.close()  # what a SIGKILL of the service process leaves
        assert proc.wait(timeout=DEADLINE) == 2, attempt
        assert "closed its connection to the receive port before it attached" in (
            proc.stderr.read()
        )
    with coordinator(tmp_path, "svc") as (_ic, binding):  # the same command starts it
        start(binding)
        one_by_one(binding, 2)


def test_a_torn_tail_is_cut_and_reported(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        start(binding)
        one_by_one(binding, 5)
        ic.kill()
    log1 = tmp_path / "svc_0" / "serverlog1"
    size = log_data_size(log1)  # where its records end: a live tail follows them
    assert log1.stat().st_size > size
    with log1.open("r+b") as f:  # the last write did not finish: its last 3 bytes and
        f.seek(size - 3)  # its end marker never reached the file
        f.write(bytes(3 + len(logfile.END_MARKER)))
    with coordinator(tmp_path, "svc") as (ic, binding):
        assert binding.record().seq == -2
        seqs = []
        while (rec := binding.record()).seq != -1:
            seqs.append(rec.seq)
        assert seqs == [0, 1, 2, 3, 4]  # record 5 was torn and is gone
        binding.send(checkpoint(b"cp2") + self_impulse(1, b"again"))
        rec = binding.record()  # the sequence carries on where it was cut
        assert (rec.seq, rec.body) == (5, incoming_impulse(1, b"again"))
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        err = ic.stderr()
    assert "cut a torn tail of serverlog1" in err
    assert log1.stat().st_size < size - 3  # repaired: the torn record was truncated away


def test_damage_before_the_tail_stops_recovery(tmp_path: Path) -> None:
    with coordinator(tmp_path, "svc") as (ic, binding):
        start(binding)
        one_by_one(binding, 5)
        ic.kill()
    log1 = tmp_path / "svc_0" / "serverlog1"
    data = bytearray(log1.read_bytes())
    # Record 0 is the initial message: header (24) + 6-byte body + 2 watermark bytes.
    # Flip a byte inside record 1's body, which has good records after it.
    rec1 = 24 + len(frame(9, b"init")) + 2
    data[rec1 + 24 + 2] ^= 0xFF
    log1.write_bytes(bytes(data))
    with coordinator(tmp_path, "svc") as (ic, binding):
        assert binding.record().seq == -2
        assert binding.record().seq == 0  # the good record before the damage
        assert ic.proc.wait(timeout=DEADLINE) == 2
        err = ic.stderr()
    assert "recovery stopped" in err
    assert "serverlog1" in err and f"offset {rec1}" in err and "seq 1" in err
    assert log1.read_bytes() == bytes(data)  # nothing was cut


def test_an_upgrade_to_the_version_the_instance_has_is_refused(tmp_path: Path) -> None:
    """Its binding would replay that version's records with the old code (a supervisor
    starting an upgraded replica again with the same options): refused, saying how to
    start it instead."""
    done = subprocess.run(
        [
            *(sys.executable, "-m", "ambrosia_py.cli", "coordinator", "--instance", "svc"),
            *("--data-dir", str(tmp_path / "d"), "--upgrade-version", "0"),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert done.returncode == 2
    assert "instance 'svc' is at version 0 already" in done.stderr
    assert "start it without --upgrade-version and --upgrade-from" in done.stderr
