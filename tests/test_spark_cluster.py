"""The data source on a real Spark standalone cluster, not only ``local[*]``: a master and a
worker started as their own processes from the pyspark package's jars, bound to
127.0.0.1 on free ports; a driver in a subprocess (the suite's process holds its one
local SparkContext) reads a data dir with ``spark://`` as master, and its rows are the
local reader's. The master's JSON status shows the application ran there, on the
worker's executor."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.spark import read_rows
from ambrosia_py.testing import free_port
from ambrosia_py.testing.processes import wait_for
from tests.spark_cluster_driver import QUICK_JVM
from tests.test_spark_rows import make_data_dir, normal

DRIVER = Path(__file__).with_name("spark_cluster_driver.py")
DEADLINE = 120.0  # each step; on an idle machine the whole test takes about 40 s


def _status(port: int) -> dict[str, Any] | None:
    """The master's status (its web UI's ``/json/``), or None while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/", timeout=2) as reply:
            status: dict[str, Any] = json.load(reply)
            return status
    except (OSError, ValueError):
        return None


class Cluster:
    """A master and one worker (2 cores, 1 GiB), each in its own process group."""

    def __init__(self, work: Path) -> None:
        import pyspark

        self.home = Path(pyspark.__file__).parent
        self.work = work
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        # The worker builds its executors' command from SPARK_HOME and the Scala version
        # (what spark-class's load-spark-env.sh would set), read from the jars' names.
        core = next(self.home.glob("jars/spark-core_*.jar")).name
        self.env = {
            **os.environ,
            "SPARK_HOME": str(self.home),
            "SPARK_SCALA_VERSION": core.split("_", 1)[1].split("-", 1)[0],
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_DIRS": str(work / "local"),
            "PYSPARK_PYTHON": sys.executable,
        }

    def _java(self, name: str, cls: str, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        command = ["java", "-Xmx256m", *QUICK_JVM.split(), "-cp", f"{self.home}/jars/*", cls, *args]
        self.procs.append(
            subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
        )
        log.close()

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}:\n" + p.read_text(errors="replace")[-3000:]
            for p in sorted(self.work.glob("*.log"))
        )

    def start(self) -> None:
        self._java(
            "master",
            "org.apache.spark.deploy.master.Master",
            *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui)),
        )
        self._java(
            "worker",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--port", str(free_port())),
            *("--webui-port", str(free_port()), "--cores", "2", "--memory", "1g"),
            *("--work-dir", str(self.work / "worker"), self.url),
        )

        def registered() -> bool:
            status = _status(self.ui)
            workers = [] if status is None else status.get("workers", [])
            return any(w.get("state") == "ALIVE" for w in workers)

        wait_for("the worker to register with the master", registered, DEADLINE, self.logs)

    def stop(self) -> None:
        """Kill each process group (the worker's holds its executors too) and reap."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs:
            proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    pytest.importorskip("pyspark", reason="PySpark is missing: pip install 'ambrosia-py[spark]'")
    from ambrosia_py.spark import java_problem

    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    cluster = Cluster(tmp_path / "cluster")
    cluster.work.mkdir()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_the_data_source_runs_on_a_standalone_cluster(cluster: Cluster, tmp_path: Path) -> None:
    root = make_data_dir(tmp_path / "data")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    driver = subprocess.Popen(
        [sys.executable, str(DRIVER), cluster.url, root.as_uri(), "600"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parent.parent,
        start_new_session=True,  # its JVM too is stopped with its group
    )
    try:
        out, err = driver.communicate(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        out, err = driver.communicate()
        pytest.fail(f"the driver took over {DEADLINE:g} s\n{err[-5000:]}\n{cluster.logs()}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(driver.pid, signal.SIGKILL)
    lines = [line for line in out.splitlines() if line.startswith('{"result"')]
    assert driver.returncode == 0 and lines, err[-5000:] + cluster.logs()
    result = json.loads(lines[-1])["result"]
    assert result["partitions"] > 4  # split across the executor's tasks
    assert result["executors"] == 1
    expected = normal(read_rows(root))
    for row in expected:
        row["payload"] = None if row["payload"] is None else row["payload"].hex()
    key = ("log_file", "offset", "msg_index")
    assert sorted(result["rows"], key=lambda r: tuple(r[k] for k in key)) == expected
    # The master ran the application (its executors are the worker's).
    status = _status(cluster.ui)
    assert status is not None
    apps = [a["name"] for a in status["activeapps"] + status["completedapps"]]
    assert "ambrosia-cluster-test" in apps
