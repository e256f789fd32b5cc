"""A configured local Spark session, and registering the data source on any session.

The settings are the ones measured to work on a small machine (reference spark.md):
workers run this interpreter (``PYSPARK_PYTHON``), so they import the installed package;
no UI or console progress; the driver bound to 127.0.0.1; timestamps shown in UTC.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

__all__ = ["JAVA_HINT", "SPARK_HINT", "java_problem", "local_session", "register"]

SPARK_HINT = "pip install 'ambrosia-py[spark]'"
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
    try:
        import pyspark.sql
    except ImportError:
        raise ImportError(f"the Spark reader needs PySpark and PyArrow: {SPARK_HINT}") from None
    return pyspark.sql


def register(spark: Any) -> None:
    """Register the ``ambrosia`` data source on ``spark`` (a ``SparkSession``)."""
    _pyspark()
    from .source import AmbrosiaDataSource

    spark.dataSource.register(AmbrosiaDataSource)


def local_session(
    cores: int = 2, *, app_name: str = "ambrosia-py", conf: dict[str, str] | None = None
) -> Any:
    """A local ``SparkSession`` on ``cores`` cores with the data source registered.

    ``conf`` adds or overrides Spark settings. Starting one costs several seconds: make
    one and share it.
    """
    sql = _pyspark()
    problem = java_problem()
    if problem is not None:
        raise RuntimeError(problem)
    # Workers must run this interpreter, or they miss the packages of its environment.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
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
    builder = sql.SparkSession.builder.master(f"local[{cores}]").appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    register(session)
    return session
