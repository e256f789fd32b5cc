"""Replicas started empty before and after an instance is founded: real processes, a
shared SQLite registry.

One started before replica 0 founds the instance has nothing it could have lost, and
counts toward new terms at once. One started after it may be a machine that lost its
disk: it recovers until it has caught up. So the founder's machine can be lost right
after founding, and the two others take over.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ambrosia_py.testing import wait_for
from tests.test_replicas_failover import (
    DEADLINE,
    current_term,
    installed,
    newer_term,
    sqlite_machines,
)

pytestmark = pytest.mark.timeout(300)


def test_replicas_started_before_founding_count_at_once_the_later_one_catches_up(
    tmp_path: Path,
) -> None:
    founder, early, late = machines = sqlite_machines(tmp_path)
    try:
        early.start()
        assert early.process is not None
        early.process.wait_for_log("listens for its group", DEADLINE)
        founder.start()  # 2 of the 3 replicas live: it founds the instance
        wait_for("a primary", lambda: current_term(early.registry) is not None, DEADLINE)
        term = current_term(early.registry)
        assert term is not None and term.replica == founder.replica
        wait_for("replica 1 to hold a checkpoint", lambda: installed(early), DEADLINE)
        late.start()
        wait_for("replica 2 to catch up", lambda: installed(late), DEADLINE)
        assert early.process is not None and late.process is not None
        assert "starts empty after" not in early.process.output()
        assert "starts empty after 'counter' was founded" in late.process.output()
        assert "replica 2 caught up" in late.process.output()

        founder.lose()  # its processes and its disk
        wait_for("a new primary", lambda: newer_term(early.registry, term), DEADLINE)
        taker = current_term(early.registry)
        assert taker is not None and taker.replica in (early.replica, late.replica)
    finally:
        for m in machines:
            m.stop()
