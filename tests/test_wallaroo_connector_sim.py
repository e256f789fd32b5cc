"""The connector's core against the worker's core, in memory, through random faults.

A small simulated world: a :class:`ConnectorCore` with an edge that behaves as
``connector.py``'s does (impulses queue up and are handled in order, effects run at
once, readers send records while credits allow), two :class:`WorkerCore` workers with
their default options, byte pipes between the connector and them, and the calls between
the workers (a move's hand-off, ``handoff.py``), delivered in order and exactly once
through crashes, as calls between immortals are. A random schedule interleaves
deliveries, reads, calls, and faults: connections cut, the connector or a worker
crashing (its state is what it handled, as an immortal's log; what was in flight is
lost), a worker NACKing a stream to its own point (NACKs may stack), and the first
worker moving its streams to the second at any moment (MIGRATE in the draft, RESTART in
v3). Then the faults stop and the world runs until nothing is left
to do: every stream finished at the connector and closed at the worker that has it.
Each worker's application records what it applied: per stream, the first worker's
records then the second's must be the source's records, each exactly once, in order.
"""

from __future__ import annotations

import collections
import pickle
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from immortals.wallaroo import Dialect, stream_id_for
from immortals.wallaroo.codec import split_frames
from immortals.wallaroo.connector_actions import (
    Actions,
    Close,
    Commit,
    ConnectorConfig,
    Dial,
    Go,
    Halt,
    MessageEncoder,
    RetryLater,
    Stop,
    Write,
    granted,
)
from immortals.wallaroo.connector_core import ConnectorCore
from immortals.wallaroo.handoff import Call
from immortals.wallaroo.sources import Batch
from immortals.wallaroo.worker_core import Replies, WorkerConfig, WorkerCore

A, B = "127.0.0.1:7100", "127.0.0.1:7200"
APP = "tests.test_wallaroo_connector_sim:tagged"


def tagged(state: dict[str, Any], payload: bytes) -> None:
    """The simulated workers' application: keep every payload, in order."""
    state.setdefault("seen", []).append(payload.decode())


class Numbers:
    """A source of ``count`` records ``NAME:k``; the position is the point."""

    def __init__(self, name: str, count: int) -> None:
        self.name, self.count = name, count

    def read_now(self, after: int, limit: int) -> Batch:
        stop = min(self.count, after + limit)
        records = tuple((k, f"{self.name}:{k}".encode()) for k in range(after + 1, stop + 1))
        return Batch(records, end=stop == self.count)


class Run:
    def __init__(self, go: Go) -> None:
        self.go = go
        self.last = go.start or 0  # the simulated sources start at 0
        self.pending: collections.deque[tuple[int, bytes]] = collections.deque()
        self.end = False
        self.lead = go.lead  # its NOTIFY after a NACK: written after the first read


class Link:
    def __init__(self, cconn: str, wconn: str, worker: str) -> None:
        self.cconn, self.wconn, self.worker = cconn, wconn, worker
        self.c2w: list[bytes] = []  # frames written by the connector, length prefix on
        self.w2c = bytearray()
        self.credits = 0
        self.queue: collections.deque[bytes] = collections.deque()
        self.runs: dict[int, Run] = {}
        self.edge_open = True  # the connector's edge still has it
        self.worker_open = True  # the worker still has it
        self.w_closing = False  # the worker closed it after its last bytes

    def flush(self) -> None:
        n = min(len(self.queue), self.credits)
        for _ in range(n):
            self.c2w.append(self.queue.popleft())
        self.credits -= n

    def stop(self, stream_id: int) -> Run | None:
        """The reader gone; a NOTIFY it had not yet sent still answers its NACK."""
        run = self.runs.pop(stream_id, None)
        if run is not None and run.lead:
            self.queue.append(run.lead)
            self.flush()
        return run


class World:
    def __init__(self, dialect: Dialect, rng: random.Random, counts: dict[str, int]) -> None:
        self.dialect, self.rng = dialect, rng
        self.sources = {name: Numbers(name, n) for name, n in counts.items()}
        self.config = ConnectorConfig(A, tuple(counts), cookie=b"k", dialect=dialect)
        self.wconfig = {
            address: WorkerConfig(
                cookie=b"k",
                dialect=dialect,
                max_credits=6,
                refill_credits=2,
                app=APP,
            )
            for address in (A, B)
        }
        self.workers = {address: WorkerCore() for address in (A, B)}
        for address, w in self.workers.items():
            w.start("w0", self.wconfig[address])
        self.core = ConnectorCore()
        self.inbox: collections.deque[tuple[str, tuple[Any, ...]]] = collections.deque()
        self.links: dict[str, Link] = {}
        self.dials: list[Dial] = []
        self.calls: collections.deque[tuple[str, Call]] = collections.deque()  # (from, call)
        self.retries: list[RetryLater] = []
        self.incarnations = 0
        self.n = 0
        self.order = "little" if dialect is Dialect.DRAFT else "big"
        self.moved = False
        self.faults: collections.Counter[str] = collections.Counter()
        self.start()

    # -- the connector: impulses in order, effects at once -------------------------------

    def start(self) -> None:
        self.incarnations += 1
        self.apply(self.core.start(f"c{self.incarnations}", self.config))

    def handle_one(self) -> None:
        method, args = self.inbox.popleft()
        self.apply(getattr(self.core, method)(*args))

    def apply(self, actions: Actions) -> None:
        for a in actions.actions:
            link = self.links.get(getattr(a, "conn", ""))
            if isinstance(a, Dial):
                self.dials.append(a)
            elif isinstance(a, RetryLater):
                self.retries.append(a)
            elif isinstance(a, Commit) or link is None or not link.edge_open:
                continue
            elif isinstance(a, Write):
                if a.charged:
                    link.queue.extend(a.frames)
                    link.flush()
                else:
                    link.c2w.extend(a.frames)
            elif isinstance(a, Go):
                link.stop(a.stream_id)
                link.runs[a.stream_id] = Run(a)
            elif isinstance(a, Stop):
                link.stop(a.stream_id)
            elif isinstance(a, Halt):
                run = link.stop(a.stream_id)
                if run is not None:
                    self.inbox.append(
                        ("halted", (a.conn, a.stream_id, a.generation, run.last, False))
                    )
            elif isinstance(a, Close):
                link.edge_open = False
                self.to_worker(link, len(link.c2w))  # what was written, then the close
                self.worker_close(link)

    # -- pipes -----------------------------------------------------------------------------

    def to_worker(self, link: Link, n: int) -> None:
        chunk, link.c2w = link.c2w[:n], link.c2w[n:]
        if chunk and link.worker_open:
            w = self.workers[link.worker]
            self.replies(link.worker, w.frames(link.wconn, [f[4:] for f in chunk]))

    def replies(self, worker: str, replies: Replies) -> None:
        self.calls.extend((worker, call) for call in replies.calls)  # logged with the input
        for send in replies.sends:
            link = next(
                (x for x in self.links.values() if x.wconn == send.conn and x.worker == worker),
                None,
            )
            if link is None or not link.worker_open:
                continue
            link.w2c += send.wire
            if send.close:
                link.worker_open = False
                link.w_closing = True

    def to_connector(self, link: Link) -> None:
        frames, used, _ = split_frames(link.w2c, self.order, 2**22)  # type: ignore[arg-type]
        del link.w2c[:used]
        if not link.edge_open:
            return
        if frames:
            self.inbox.append(("frames", (link.cconn, frames)))
            link.credits += sum(granted(raw, self.dialect) for raw in frames)
            link.flush()
        if link.w_closing and not link.w2c:
            self.edge_lost(link)

    def call(self) -> None:
        """The next call between the workers, as the binding makes it."""
        source, call = self.calls.popleft()
        w = self.workers[call.peer]
        if call.method == "expect":
            replies = w.expect(source, *call.args)
        elif call.method == "expecting":
            replies = w.expecting()
        elif call.method == "adopt":
            replies = w.adopt(source, *call.args)
        else:
            replies = w.adopted(*call.args)
        self.replies(call.peer, replies)

    def edge_lost(self, link: Link) -> None:
        if link.edge_open:
            link.edge_open = False
            link.runs.clear()
            self.inbox.append(("closed", (link.cconn,)))

    def worker_close(self, link: Link) -> None:
        if link.worker_open:
            link.worker_open = False
            self.replies(link.worker, self.workers[link.worker].closed(link.wconn))

    def dial(self, d: Dial) -> None:
        self.n += 1
        link = Link(f"c{self.incarnations}.{self.n}", f"w.{self.n}", d.address)
        self.links[link.cconn] = link
        self.replies(d.address, self.workers[d.address].opened(link.wconn, f"peer{self.n}"))
        self.inbox.append(("connected", (d.dial, link.cconn, d.address)))

    def pump(self, link: Link, run: Run, most: int) -> None:
        """The edge's reader: read when nothing is pending, send what credits allow."""
        if not run.pending:
            if run.end:
                del link.runs[run.go.stream_id]
                g = run.go
                self.inbox.append(("halted", (g.conn, g.stream_id, g.generation, run.last, True)))
                return
            batch = self.sources[run.go.name].read_now(run.last, most)
            if run.lead:  # the source reads from the point: its NOTIFY first (D5)
                link.queue.append(run.lead)
                run.lead = b""
                link.flush()
            run.pending.extend(batch.records)
            run.end = batch.end
            return
        if link.queue:
            return
        n = min(link.credits, len(run.pending), most)
        encode = MessageEncoder(self.dialect, run.go.stream_id, 2**22)
        for _ in range(n):
            point, payload = run.pending.popleft()
            link.c2w.append(encode(point, payload))
            run.last = point
        link.credits -= n

    # -- faults ----------------------------------------------------------------------------

    def cut(self, link: Link) -> None:
        link.c2w.clear()
        link.w2c.clear()
        self.edge_lost(link)
        self.worker_close(link)

    def crash_connector(self) -> None:
        self.core = pickle.loads(pickle.dumps(self.core))  # what it handled is logged
        self.inbox.clear()  # impulses not yet logged are lost
        self.dials.clear()
        self.retries.clear()
        for link in self.links.values():
            link.edge_open = False
            self.worker_close(link)
        self.links.clear()
        self.start()

    def crash_worker(self, address: str) -> None:
        w = self.workers[address] = pickle.loads(pickle.dumps(self.workers[address]))
        started = w.start(f"w{self.rng.random()}", self.wconfig[address])  # drops every connection
        for link in self.links.values():
            if link.worker == address:
                link.worker_open = False
                link.c2w.clear()
                link.w2c.clear()
                self.edge_lost(link)
        self.replies(address, started)  # a move's hand-off may go on from here

    def nack(self) -> None:
        """A worker resets a stream a connection holds to its own point (an operator's
        nack that rewinds nothing): the NACK, then NOTIFYs, stacked if several come."""
        held = [
            (address, sid, s.point)
            for address, w in self.workers.items()
            for sid, s in w.streams.items()
            if s.owner is not None and w.connections[s.owner].machine.state.value == "streaming"
        ]
        if held:
            address, sid, point = self.rng.choice(held)
            self.replies(address, self.workers[address].nack(sid, point))

    def move(self) -> None:
        self.moved = True
        host, port = B.split(":")
        self.replies(A, self.workers[A].begin_move(host, int(port), B))

    # -- the schedule ----------------------------------------------------------------------

    def step(self, faults: bool) -> bool:
        rng = self.rng
        links = [x for x in self.links.values() if x.edge_open or x.worker_open]
        choices: list[tuple[str, Any]] = []
        if self.inbox:
            choices += [("handle", None)] * 4
        for link in links:
            if link.c2w:
                choices.append(("to_worker", link))
            if link.w2c or link.w_closing:
                choices.append(("to_connector", link))
            choices += [("pump", (link, run)) for run in link.runs.values()]
        if self.dials:
            choices.append(("dial", None))
        if self.retries:
            choices.append(("retry", None))
        if self.calls:
            choices.append(("call", None))
        if faults:
            choices += [("cut", link) for link in links if rng.random() < 0.02]
            if rng.random() < 0.01:
                choices.append(("crash_connector", None))
            if rng.random() < 0.01:
                choices.append(("crash_worker", rng.choice([A, B])))
            if not self.moved and rng.random() < 0.01:
                choices.append(("move", None))
            if rng.random() < 0.02:
                choices.append(("nack", None))
        if not choices:
            return False
        what, arg = rng.choice(choices)
        if what == "handle":
            self.handle_one()
        elif what == "to_worker":
            self.to_worker(arg, rng.randint(1, len(arg.c2w)))
        elif what == "to_connector":
            self.to_connector(arg)
        elif what == "pump":
            self.pump(*arg, most=rng.randint(1, 5))
        elif what == "dial":
            self.dial(self.dials.pop(rng.randrange(len(self.dials))))
        elif what == "call":
            self.call()
        elif what == "retry":
            r = self.retries.pop(0)
            if r.conn in self.links and self.links[r.conn].edge_open:
                self.inbox.append(("retry", (r.conn, r.stream_id)))
        else:
            self.faults[what] += 1
            if what == "cut":
                self.cut(arg)
            elif what == "crash_connector":
                self.crash_connector()
            elif what == "crash_worker":
                self.crash_worker(arg)
            elif what == "nack":
                self.nack()
            else:
                self.move()
        return True

    def finished(self) -> bool:
        streams = self.core.status()["streams"]
        return all(streams[name]["finished"] for name in self.sources)

    def applied(self, name: str) -> list[str]:
        seen = []
        for address in (A, B):
            app = self.workers[address].app_state
            seen += [p for p in app.get("seen", []) if p.startswith(name + ":")]
        return seen


def run_world(dialect: Dialect, seed: int, counts: dict[str, int], chaos: int) -> World:
    world = World(dialect, random.Random(seed), counts)
    for _ in range(chaos):
        world.step(faults=True)
    for _ in range(200_000):
        if not world.step(faults=False):  # quiet: nothing in flight, nothing to do
            break
    else:
        raise AssertionError(f"not quiet: {world.core.status()}")
    assert world.finished(), f"stuck: {world.core.status()}"
    for name, n in counts.items():
        assert world.applied(name) == [f"{name}:{k}" for k in range(1, n + 1)], (name, seed)
        sid = stream_id_for(name)
        held = B if sid in world.workers[B].streams else A  # where it went last
        s = world.workers[held].streams[sid]
        assert (s.machine.state.value, s.point) == ("closed", n), (name, seed, held)
    return world


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
def test_no_faults(dialect: Dialect) -> None:
    world = run_world(dialect, 1, {"s1": 40, "s2": 25}, chaos=0)
    assert world.workers[A].app_state["seen"][:1] in (["s1:1"], ["s2:1"])


@pytest.mark.parametrize("dialect", list(Dialect), ids=lambda d: d.value)
def test_a_move_without_other_faults(dialect: Dialect) -> None:
    world = World(dialect, random.Random(5), {"s1": 60, "s2": 40})
    for _ in range(120):
        world.step(faults=False)
    world.move()
    while world.step(faults=False):
        pass
    assert world.applied("s1") == [f"s1:{k}" for k in range(1, 61)]
    assert world.applied("s2") == [f"s2:{k}" for k in range(1, 41)]
    assert world.core.target == B and world.workers[B].app_state.get("seen")
    assert world.workers[A].app_state.get("seen")  # it moved mid-stream
    a = world.workers[A]
    assert a.move is not None and a.move.done(len(a.streams))
    for name, n in (("s1", 60), ("s2", 40)):
        s = world.workers[B].streams[stream_id_for(name)]
        assert (s.machine.state.value, s.point) == ("closed", n)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(list(Dialect)), st.integers(0, 2**32))
def test_exactly_once_through_random_faults(dialect: Dialect, seed: int) -> None:
    run_world(dialect, seed, {"s1": 30, "s2": 20}, chaos=1500)


def test_ids_of_the_simulated_streams_differ() -> None:
    assert stream_id_for("s1") != stream_id_for("s2")
