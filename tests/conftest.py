"""Fixtures shared across test modules."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import settings

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
