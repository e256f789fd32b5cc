"""The public surface of ``ambrosia_py.spark`` is pinned, and importing it needs neither
PySpark nor PyArrow (only using Spark does)."""

from __future__ import annotations

import subprocess
import sys

import ambrosia_py.spark as spark_api

SPARK_API = [
    "MESSAGE_COLUMNS",
    "MSG_TYPE_NAMES",
    "RECORD_COLUMNS",
    "LogDamageError",
    "LogFile",
    "LogFormatError",
    "LogReadError",
    "NoLogsError",
    "cluster_session",
    "decoded",
    "find_logs",
    "java_problem",
    "local_session",
    "read_rows",
    "register",
]


def test_the_public_names_are_pinned() -> None:
    assert sorted(spark_api.__all__) == sorted(SPARK_API)
    for name in SPARK_API:
        assert getattr(spark_api, name) is not None


def test_column_names_are_the_documented_ones() -> None:
    assert [name for name, _, _ in spark_api.MESSAGE_COLUMNS] == [
        "instance", "version", "log_file", "offset", "seq", "committer", "commit_time",
        "check_ok", "msg_index", "msg_type", "method_id", "rpc_type", "sender",
        "destination", "call_seq", "payload_size", "payload", "return_type",
    ]  # fmt: skip
    assert [name for name, _, _ in spark_api.RECORD_COLUMNS][8:] == ["size", "msg_count", "body"]


def test_importing_the_package_needs_no_pyspark_or_pyarrow() -> None:
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pyspark', 'pyarrow'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import ambrosia_py.spark as s\n"
        "try:\n"
        "    s.register(None)\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install 'ambrosia-py[spark]'" in out.stdout
