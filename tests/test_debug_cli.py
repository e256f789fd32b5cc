"""``ambrosia-py debug``: it refuses clearly while the instance runs."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from ambrosia_py.cli import main
from tests.test_run_errors import EXAMPLES, free_port, running

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
