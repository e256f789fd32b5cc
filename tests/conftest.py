"""Fixtures shared across test modules."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

# Tests stop `ambrosia-py run` with SIGINT, as Ctrl-C would. A shell that starts the suite
# in the background without job control (a script's `pytest &`) ignores SIGINT for it, and
# an ignored signal stays ignored across exec: every `run` the tests start would then sit
# through its SIGINT until the test's deadline. Catching it here gives the children the
# default back (a caught signal is reset on exec), and this process Python's own handling.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# No timing in tests: Hypothesis's per-example deadline (200 ms) fails a property test
# when the machine is busy (it did, at 859 ms for a 1 ms example, with other work running),
# so the suite runs without it. Speed is measured by ambrosia-py bench, not asserted.
settings.register_profile("ambrosia", deadline=None)
settings.load_profile("ambrosia")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local SparkSession (``local[2]``) for the whole run, with the ambrosia data source
    registered; the Spark tests skip, saying what to install, where PySpark or Java is
    missing."""
    pytest.importorskip("pyspark", reason="PySpark is missing: pip install 'ambrosia-py[spark]'")
    from ambrosia_py.spark import java_problem, local_session

    problem = java_problem()
    if problem is not None:
        pytest.skip(problem)
    session = local_session(2, conf={"spark.sql.shuffle.partitions": "1"})
    try:
        yield session
    finally:
        session.stop()
