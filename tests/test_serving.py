"""``ambrosia_py.serving`` on its own: the admission table's eviction rules table by
table, the refusal log with a clock of the test's, and back-pressure on a real socket
pair whose peer does not read. Expected values come from the rules in each module's
docstring. (The servers under floods: tests/test_flood_admission.py.)"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator

import pytest

from ambrosia_py.coordinator.links.config import LinkSettings
from ambrosia_py.ingress import IngressSettings
from ambrosia_py.serving import (
    Admission,
    ConnectionLimits,
    OutputStalled,
    RefusalLog,
    Slot,
    buffered_output,
    limit_output,
    wait_for_room,
)

DEADLINE = 30.0

# --- Admission ------------------------------------------------------------------------------


class Table:
    """An Admission and the connections it closed, by name."""

    def __init__(self, max_connections: int, max_pending_per_source: int) -> None:
        self.admission = Admission(
            ConnectionLimits(
                max_connections=max_connections, max_pending_per_source=max_pending_per_source
            )
        )
        self.slots: dict[str, Slot] = {}
        self.closed: list[str] = []
        self.refused: list[str] = []

    def admit(self, name: str, source: str) -> None:
        slot = self.admission.admit(source, lambda why: self.closed.append(name))
        if slot is None:
            self.refused.append(name)
        else:
            self.slots[name] = slot

    def run(self, steps: list[tuple[str, ...]]) -> None:
        for step in steps:
            if step[0] == "admit":
                self.admit(step[1], step[2])
            elif step[0] == "establish":
                self.admission.establish(self.slots[step[1]])
            else:
                assert step[0] == "release"
                self.admission.release(self.slots[step[1]])


# (what, max connections, max pending per source, steps, closed, refused, open, pending)
TABLES = [
    (
        "the oldest pending connection goes when the table is full",
        *(3, 10),
        [("admit", n, s) for n, s in [("a", "x"), ("b", "y"), ("c", "z"), ("d", "w")]],
        ["a"],
        [],
        *(3, 3),
    ),
    (
        "a newcomer after a full table keeps evicting in age order",
        *(2, 10),
        [("admit", n, s) for n, s in [("a", "x"), ("b", "y"), ("c", "z"), ("d", "w")]],
        ["a", "b"],
        [],
        *(2, 2),
    ),
    (
        "established connections are passed over: the oldest pending goes",
        *(3, 10),
        [
            *[("admit", n, s) for n, s in [("a", "x"), ("b", "y"), ("c", "z")]],
            ("establish", "a"),
            ("admit", "d", "w"),
        ],
        ["b"],
        [],
        *(3, 2),
    ),
    (
        "one source past its limit loses its own oldest, not another's older one",
        *(10, 2),
        [("admit", n, s) for n, s in [("o", "y"), ("a", "x"), ("b", "x"), ("c", "x")]],
        ["a"],
        [],
        *(3, 3),
    ),
    (
        "the per-source limit counts pending connections only",
        *(10, 1),
        [("admit", "a", "x"), ("establish", "a"), ("admit", "b", "x"), ("admit", "c", "x")],
        ["b"],
        [],
        *(2, 1),
    ),
    (
        "an established connection is never evicted: with every slot established, refused",
        *(2, 10),
        [
            *[("admit", n, s) for n, s in [("a", "x"), ("b", "x")]],
            *[("establish", n) for n in "ab"],
            *[("admit", n, s) for n, s in [("c", "y"), ("d", "x")]],
        ],
        [],
        ["c", "d"],
        *(2, 0),
    ),
    (
        "a released slot makes room without evicting anyone",
        *(2, 10),
        [
            *[("admit", n, s) for n, s in [("a", "x"), ("b", "y")]],
            ("establish", "a"),
            ("release", "a"),
            ("admit", "c", "z"),
        ],
        [],
        [],
        *(2, 2),
    ),
    (
        "a source at its limit in a full table loses its own oldest, not the oldest of all",
        *(3, 2),
        [("admit", n, s) for n, s in [("a", "x"), ("b", "y"), ("c", "y"), ("d", "y")]],
        ["b"],  # that made room: a stays
        [],
        *(3, 3),
    ),
]


@pytest.mark.parametrize(
    ("what", "cap", "per_source", "steps", "closed", "refused", "open_", "pending"),
    TABLES,
    ids=[t[0] for t in TABLES],
)
def test_admission_table(
    what: str,
    cap: int,
    per_source: int,
    steps: list[tuple[str, ...]],
    closed: list[str],
    refused: list[str],
    open_: int,
    pending: int,
) -> None:
    table = Table(cap, per_source)
    table.run(steps)
    assert table.closed == closed, what
    assert table.refused == refused, what
    assert (table.admission.open, table.admission.pending) == (open_, pending), what
    assert table.admission.evicted == len(closed)


def test_an_eviction_says_why() -> None:
    admission = Admission(ConnectionLimits(max_connections=1, max_pending_per_source=5))
    reasons: list[str] = []
    admission.admit("x", reasons.append)
    admission.admit("y", lambda why: None)
    assert reasons == [
        "all 1 connection slots are taken; the oldest connection that has not proved itself goes"
    ]


def test_release_is_idempotent_and_harmless_after_an_eviction() -> None:
    table = Table(2, 10)
    table.run([("admit", "a", "x"), ("admit", "b", "y")])
    table.admission.release(table.slots["a"])
    table.admission.release(table.slots["a"])
    assert (table.admission.open, table.admission.pending) == (1, 1)
    table.run([("admit", "c", "z"), ("admit", "d", "w")])  # evicts b, the oldest pending
    assert table.closed == ["b"]
    # The adapter releases an evicted connection when it sees it end: no effect on others.
    table.admission.release(table.slots["b"])
    table.admission.release(table.slots["b"])
    assert (table.admission.open, table.admission.pending) == (2, 2)
    # Establishing a slot that is gone does not bring it back.
    table.admission.establish(table.slots["b"])
    assert (table.admission.open, table.admission.pending) == (2, 2)


# --- RefusalLog -----------------------------------------------------------------------------


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[tuple[logging.Logger, Lines]]:
    logger = logging.getLogger("tests.refusals")
    handler = Lines()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield logger, handler
    finally:
        logger.removeHandler(handler)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_refusals_in_full_then_one_summary_per_interval(
    lines: tuple[logging.Logger, Lines],
) -> None:
    logger, out = lines
    clock = Clock()
    refusals = RefusalLog(logger, "things refused", first=3, interval_s=10, clock=clock)
    for i in range(7):
        refusals("a", "refused %s number %d", "a", i)
        clock.now += 1
    refusals("b", "refused %s", "b")
    assert out.lines == [*(f"refused a number {i}" for i in range(3)), "refused b"]
    # The interval (from the first refusal, at 100) ends at 110: the next refusal writes
    # the summary first, then is logged in full, as the first of a new interval.
    clock.now = 110.0
    refusals("a", "refused %s again", "a")
    assert out.lines[4:] == ["4 more things refused from a in the last 10 s", "refused a again"]
    # b was never over its first three: no summary for it.
    clock.now = 111.0
    refusals.flush()
    assert len(out.lines) == 6


def test_sources_past_max_sources_share_one_count(lines: tuple[logging.Logger, Lines]) -> None:
    logger, out = lines
    clock = Clock()
    refusals = RefusalLog(logger, "refused", first=2, interval_s=10, max_sources=2, clock=clock)
    for source in ("s1", "s2", "s3", "s4", "s5", "s6", "s1"):
        refusals(source, "from %s", source)
    # s1 and s2 have their own counts; s3 to s6 share one, whose first two are in full.
    assert out.lines == ["from s1", "from s2", "from s3", "from s4", "from s1"]
    clock.now += 10
    refusals.flush()
    assert out.lines[5:] == ["2 more refused from other sources in the last 10 s"]


def test_the_summary_comes_when_the_interval_ends_with_no_refusal_after_it(
    lines: tuple[logging.Logger, Lines],
) -> None:
    logger, out = lines

    async def main() -> None:
        refusals = RefusalLog(logger, "refused", first=1, interval_s=0.05)
        for _ in range(4):
            refusals("a", "refused a")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE
        while len(out.lines) < 2:
            assert loop.time() < deadline, "no summary line"
            await asyncio.sleep(0.01)  # polling for the timer's line, with a deadline

    asyncio.run(main())
    assert out.lines[0] == "refused a"
    assert out.lines[1].startswith("3 more refused from a in the last ")


def test_an_early_summary_says_its_own_span_at_the_lines_level() -> None:
    """A summary written before the interval ends (the server closing) names the time
    it covers, and keeps the level of the lines it stands for."""
    logger = logging.getLogger("tests.refusals.levels")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        clock = Clock()
        refusals = RefusalLog(logger, "refused", first=1, interval_s=10, clock=clock)
        for _ in range(3):
            refusals("a", "lost a", level=logging.INFO)
        clock.now += 1.5
        refusals.flush()
    finally:
        logger.removeHandler(handler)
    assert [(r.levelno, r.getMessage()) for r in records] == [
        (logging.INFO, "lost a"),
        (logging.INFO, "2 more refused from a in the last 1.5 s"),
    ]


# --- back-pressure ----------------------------------------------------------------------------

BOUND = 64 * 1024


async def _stuffed(
    limits: ConnectionLimits,
) -> tuple[asyncio.StreamWriter, socket.socket, int]:
    """A writer to a socket pair's end whose peer reads nothing, written to until more
    than the bound waits unsent; and how much was written."""
    ours, theirs = socket.socketpair()
    _, writer = await asyncio.open_connection(sock=ours)
    limit_output(writer, limits)
    written = 0
    chunk = bytes(64 * 1024)
    while buffered_output(writer) <= limits.max_buffered_output:
        writer.write(chunk)
        written += len(chunk)
        await asyncio.sleep(0)  # let the transport hand what it can to the kernel
    return writer, theirs, written


def test_wait_for_room_returns_at_once_under_the_bound() -> None:
    async def main() -> None:
        ours, theirs = socket.socketpair()
        _, writer = await asyncio.open_connection(sock=ours)
        limits = ConnectionLimits(max_buffered_output=BOUND)
        limit_output(writer, limits)
        writer.write(b"x" * 100)
        await wait_for_room(writer, limits)
        writer.close()
        theirs.close()

    asyncio.run(main())


def test_wait_for_room_raises_output_stalled_past_the_deadline() -> None:
    async def main() -> None:
        limits = ConnectionLimits(max_buffered_output=BOUND, output_stall_s=0.2)
        writer, theirs, _ = await _stuffed(limits)
        with pytest.raises(OutputStalled, match=r"unread for 0\.2 s \(the bound is 65536\)"):
            await wait_for_room(writer, limits)
        writer.transport.abort()
        theirs.close()

    asyncio.run(main())


def test_wait_for_room_returns_once_the_peer_reads() -> None:
    async def main() -> None:
        limits = ConnectionLimits(max_buffered_output=BOUND, output_stall_s=DEADLINE)
        writer, theirs, written = await _stuffed(limits)
        theirs.setblocking(False)
        loop = asyncio.get_running_loop()

        async def read_all() -> int:
            got = 0
            while got < written:
                got += len(await loop.sock_recv(theirs, 1 << 20))
            return got

        reader = asyncio.create_task(read_all())
        await wait_for_room(writer, limits)  # OutputStalled here would fail the test
        assert buffered_output(writer) <= limits.max_buffered_output
        assert await reader == written
        writer.close()
        theirs.close()

    asyncio.run(main())


# --- the servers' defaults ------------------------------------------------------------------


def test_the_links_and_the_ingress_take_the_shared_defaults() -> None:
    shared = ConnectionLimits()
    assert LinkSettings().max_pending_per_source == shared.max_pending_per_source
    assert IngressSettings().limits == shared
