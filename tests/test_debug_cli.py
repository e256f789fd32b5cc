"""``ambrosia-py debug``: refusals in one line, and ``debug SERVICE`` (the coordinator and
the binding in one command) replaying to a chosen record, printing the state there or
opening pdb."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from ambrosia_py.cli import main
from ambrosia_py.client import Client
from tests.test_run_errors import EXAMPLES, Counter, free_port, running

COUNTER = EXAMPLES / "counter.py"


def test_debug_while_the_instance_runs_is_refused_in_one_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with running(COUNTER, "--data-dir", data, "--ingress", free_port()) as run:
        run.wait_for(lambda line: line.startswith("ingress listening on"))
        coordinator = run.field("coordinator_pid")
        result = CliRunner().invoke(
            main, ["debug", "--instance", "counter", "--data-dir", str(data), "--checkpoint", "1"]
        )
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"ambrosia-py: instance 'counter' is running (its coordinator is pid {coordinator}): "
        "debug replays the history of a stopped instance; stop the service first"
    ]


# --- debug SERVICE: the coordinator and the binding in one command -------------------------


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A stopped counter whose log holds add(1), add(2), add(4) after checkpoint 1, one
    record each (seqs 1-3; record 0 is the first start's); started again and stopped, so
    checkpoint 2 holds all three."""
    data = tmp_path_factory.mktemp("debug") / "data"
    port = free_port()
    with running(COUNTER, "--data-dir", data, "--ingress", port) as run:
        run.wait_for(lambda line: line.startswith("ingress listening on"))
        with Client(f"127.0.0.1:{port}", data_dir=data) as client:
            for n in (1, 2, 4):
                client.call(Counter.add, n)  # answered, so logged alone
        run.proc.send_signal(signal.SIGINT)
        assert run.finish() == 0
    with running(COUNTER, "--data-dir", data, "--ingress", port) as run:
        run.wait_for(lambda line: line.startswith("ingress listening on"))
        run.proc.send_signal(signal.SIGINT)
        assert run.finish() == 0
    return data


def debug(data: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main,
        ["debug", str(COUNTER), "--instance", "counter", "--data-dir", str(data), *args],
    )


def test_debug_replays_to_the_end_and_prints_the_state(history: Path) -> None:
    result = debug(history, "--checkpoint", "1")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "Counter after record 3: replayed 4 records (seqs 0..3) from checkpoint 1; "
        "the log ends at seq 3",
        "  count = 7",
    ]


def test_debug_stops_at_the_chosen_record(history: Path) -> None:
    result = debug(history, "--checkpoint", "1", "--to-seq", "2")
    assert result.exit_code == 0, result.output
    assert "after record 2: replayed 3 records (seqs 0..2)" in result.output
    assert "  count = 3" in result.output.splitlines()


def test_debug_from_the_last_checkpoint(history: Path) -> None:
    result = debug(history, "--checkpoint", "2")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        "Counter as checkpoint 2 left it (no record replayed); the log has no records after it",
        "  count = 7",
    ]


def test_debug_opens_pdb_at_the_chosen_record(history: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ambrosia_py.cli", "debug", str(COUNTER), "--instance",
         "counter", "--data-dir", str(history), "--checkpoint", "1", "--to-seq", "1", "--pdb"],
        input="p ('count is', immortal.count)\ncontinue\n",
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "(Pdb)" in proc.stdout and "('count is', 1)" in proc.stdout


def test_debug_refuses_a_point_before_the_checkpoint_and_a_missing_one(history: Path) -> None:
    result = debug(history, "--checkpoint", "2", "--to-seq", "1")
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "ambrosia-py: --to-seq 1 comes before checkpoint 2, whose first record is seq 4: start "
        "from an earlier checkpoint"
    ]
    result = debug(history, "--checkpoint", "9")
    assert result.exit_code == 2 and "no checkpoint 9 in" in result.output
    assert "(it has [1, 2])" in result.output


def test_to_seq_and_pdb_need_the_service(history: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["debug", "--instance", "counter", "--data-dir", str(history), "--checkpoint", "1",
         "--to-seq", "2"],
    )  # fmt: skip
    assert result.exit_code == 2 and "give SERVICE" in result.output
