"""`ambrosia-py bench` keeps working (figures are reported, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ambrosia_py.bench.coordinator import measure_coordinator, measure_disk
from ambrosia_py.bench.immortal_process import ImmortalProcess
from ambrosia_py.bench.rpc import RpcPeer, measure_forks, measure_remote, measure_round_trips
from ambrosia_py.bench.wire import MESSAGES_PER_RECORD, measure
from ambrosia_py.cli import main
from ambrosia_py.testing import ImmortalRunner


def test_measure_reports_every_figure_for_each_size() -> None:
    for size in (16, 1024, 64 * 1024):
        figures = measure(size, min_seconds=0.0)
        assert figures["arg_size"] == size
        # A record holds 1,000 framed messages plus the 24-byte header.
        assert figures["record_bytes"] > MESSAGES_PER_RECORD * size + 24
        for key in ("encode", "decode", "chunked"):
            assert figures[f"{key}_msgs_per_s"] > 0
            assert figures[f"{key}_mb_per_s"] > 0


def test_bench_wire_command_prints_the_table() -> None:
    result = CliRunner().invoke(main, ["bench", "wire", "--seconds", "0"])
    assert result.exit_code == 0, result.output
    for label in ("16 B", "1024 B", "65536 B", "decode msg/s"):
        assert label in result.output


def test_bench_coordinator_streams_every_message_through_a_real_ic(tmp_path: Path) -> None:
    figures = measure_coordinator(16, 2000, tmp_path)
    # Every message came back; they were group-committed into at least one record.
    assert figures["messages_per_s"] > 0
    assert 1 <= figures["messages_per_record"] <= 2000
    syncs, bandwidth = measure_disk(tmp_path, seconds=0.05)
    assert syncs > 0 and bandwidth > 0


def test_bench_rpc_runs_forks_and_round_trips_through_a_real_ic(tmp_path: Path) -> None:
    runner = ImmortalRunner(tmp_path)
    try:
        assert measure_forks(runner, 16, 300) > 0
        rtts = measure_round_trips(runner, 20)
        assert len(rtts) == 19 and all(t > 0 for t in rtts)
    finally:
        runner.close()


def test_bench_rpc_to_another_instance_goes_through_two_coordinators(tmp_path: Path) -> None:
    forks, rtts = measure_remote(tmp_path, 300, 20)
    assert forks > 0
    assert len(rtts) == 19 and all(t > 0 for t in rtts)
    # The calls crossed a link: the caller's coordinator dialed the peer's.
    log = (tmp_path / "remote-caller.coordinator.log").read_text()
    assert "link to 'remote-peer' open" in log
    # Each immortal ran in a process of its own, which stopped its coordinator cleanly.
    for instance in ("remote-caller", "remote-peer"):
        text = (tmp_path / f"{instance}.coordinator.log").read_text()
        assert "binding disconnected; log 1 ends at seq" in text, text[-2000:]


def test_an_immortal_process_reports_what_failed_there(tmp_path: Path) -> None:
    peer = ImmortalProcess(tmp_path, RpcPeer, "lonely", timeout=60)
    try:
        peer.impulse("sink", b"x")
        assert peer.wait_until_at_least("received", 1) > 0
        with pytest.raises(RuntimeError, match="'impulse' failed there"):
            peer.impulse("no_such_method")
        assert peer.stamps() == []
    finally:
        peer.stop()
