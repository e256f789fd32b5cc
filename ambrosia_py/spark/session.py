"""Configured Spark sessions (local, or on a cluster), and registering the data source on
any session.

The settings are the ones measured to work on a small machine (reference spark.md):
workers run this interpreter (``PYSPARK_PYTHON``), so they import the installed package;
no UI or console progress; the driver bound to 127.0.0.1; timestamps shown in UTC.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

from ..extras import optional_import, require

__all__ = [
    "JAVA_HINT",
    "cluster_session",
    "java_problem",
    "local_session",
    "register",
]

JAVA_HINT = "apt-get install openjdk-17-jre-headless"


def java_problem() -> str | None:
    """Why Spark cannot start here for want of Java, with how to get it; ``None`` if a
    ``java`` is found (``$JAVA_HOME/bin/java`` or on the PATH)."""
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return None
    if shutil.which("java"):
        return None
    return f"Spark needs a Java runtime (17 or 21) and none was found: {JAVA_HINT}"


def _pyspark() -> Any:
    require("pyspark", "pyarrow", what="the Spark reader")  # its data source reads Arrow
    return optional_import("pyspark.sql", what="the Spark reader")


def register(spark: Any) -> None:
    """Register the ``ambrosia`` data source on ``spark`` (a ``SparkSession``)."""
    _pyspark()
    from .source import AmbrosiaDataSource

    spark.dataSource.register(AmbrosiaDataSource)


def _session(master: str, app_name: str, settings: dict[str, str]) -> Any:
    sql = _pyspark()
    problem = java_problem()
    if problem is not None:
        raise RuntimeError(problem)
    # Workers must run this interpreter, or they miss the packages of its environment.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    builder = sql.SparkSession.builder.master(master).appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session


def local_session(
    cores: int = 2, *, app_name: str = "ambrosia-py", conf: dict[str, str] | None = None
) -> Any:
    """A local ``SparkSession`` on ``cores`` cores with the data source registered.

    ``conf`` adds or overrides Spark settings. Starting one costs several seconds: make
    one and share it.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # loopback only, as bindAddress
    settings = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.host": "127.0.0.1",
        "spark.sql.shuffle.partitions": str(cores),
        "spark.sql.session.timeZone": "UTC",
        **(conf or {}),
    }
    return _session(f"local[{cores}]", app_name, settings)


def cluster_session(
    master: str,
    *,
    app_name: str = "ambrosia-py",
    executor_memory: str = "1g",
    driver_host: str | None = None,
    conf: dict[str, str] | None = None,
) -> Any:
    """A ``SparkSession`` on the cluster at ``master`` (``spark://host:port`` for a
    standalone cluster) with the data source registered.

    Its executors run Python as ``PYSPARK_PYTHON`` says, which this sets to the running
    interpreter: every worker machine needs ``ambrosia-py[spark]`` installed at that same
    path (the data source's classes are pickled by reference), and the logs readable
    from every executor under the path given to ``load`` (a shared file system, or a
    ``hdfs://`` or ``s3://`` URI read through ``pyarrow.fs``). ``driver_host`` is the
    address executors connect back to (``127.0.0.1`` for a cluster on this machine;
    Spark's choice otherwise). ``conf`` adds or overrides Spark settings.
    """
    settings = {
        "spark.executor.memory": executor_memory,
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
    }
    if driver_host is not None:
        settings["spark.driver.host"] = driver_host
        settings["spark.driver.bindAddress"] = driver_host
    return _session(master, app_name, {**settings, **(conf or {})})
