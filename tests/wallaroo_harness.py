"""Harnesses for the two sans-IO cores, driven as their immortals drive them but
speaking frames rather than bytes: :class:`Worker`, a :class:`WorkerCore` with its
connections (connection events and the frames of one read in, its replies read back with
the codec), and :class:`Connector`, a :class:`ConnectorCore` whose actions are kept and
whose writes are decoded.
"""

from __future__ import annotations

from typing import Any

from immortals.wallaroo import (
    DRAFT_VERSION,
    NOTHING_SEEN,
    V3_VERSION,
    Dialect,
    Error,
    Frame,
    Hello,
    Message,
    NotifyAck,
    Ok,
    encode,
    end_of_stream,
    stream_id_for,
)
from immortals.wallaroo.connector_actions import Action, Actions, ConnectorConfig, Write
from immortals.wallaroo.connector_core import ConnectorCore
from immortals.wallaroo.worker_core import Replies, WorkerConfig, WorkerCore
from tests.wallaroo_reader import decode_all

APP = "tests.wallaroo_apps:record"


def hello(dialect: Dialect, cookie: bytes = b"secret") -> Hello:
    version = DRAFT_VERSION if dialect is Dialect.DRAFT else V3_VERSION
    return Hello(version, cookie, "prog", "inst")


def msg(dialect: Dialect, sid: int, mid: int, payload: bytes | None = b"x") -> Message:
    if dialect is Dialect.V3:
        return Message(sid, mid, payload or b"-", event_time=0)
    return Message(sid, mid, payload)


def eos(dialect: Dialect, sid: int, mid: int) -> Frame:
    return end_of_stream(dialect, sid, mid)


class Worker:
    """A WorkerCore with its connections, speaking frames rather than bytes."""

    def __init__(self, dialect: Dialect, **config: Any) -> None:
        self.dialect = dialect
        config.setdefault("cookie", b"secret")
        config.setdefault("max_credits", 10)
        config.setdefault("refill_credits", 5)
        config.setdefault("app", APP)
        self.core = WorkerCore()
        self.core.start("i1", WorkerConfig(dialect=dialect, **config))
        self.closed: set[str] = set()
        self.problems: list[str] = []
        self._n = 0

    def connect(self, handshake: bool = True) -> Conn:
        self._n += 1
        conn = Conn(self, f"i1.{self._n}")
        self.core.opened(conn.name, f"127.0.0.1:{self._n}")
        if handshake:
            (ok,) = conn.send(hello(self.dialect))
            assert isinstance(ok, Ok) and ok.initial_credits == 10
        return conn

    def outputs(self, replies: Replies) -> dict[str, list[Frame]]:
        self.problems += replies.problems
        out: dict[str, list[Frame]] = {}
        for send in replies.sends:
            out.setdefault(send.conn, []).extend(decode_all(send.wire, self.dialect))
            if send.close:
                self.closed.add(send.conn)
        return out

    @property
    def payloads(self) -> list[bytes]:
        return list(self.core.app_state.get("payloads", []))

    def stream(self, sid: int) -> Any:
        return self.core.streams[sid]


class Conn:
    def __init__(self, worker: Worker, name: str) -> None:
        self.worker = worker
        self.name = name

    def send(self, *frames: Frame) -> list[Frame]:
        """Frames as one read: the replies written back to this connection."""
        raw = [encode(f, self.worker.dialect)[4:] for f in frames]
        return self.send_raw(raw)

    def send_raw(self, raw: list[bytes]) -> list[Frame]:
        out = self.worker.outputs(self.worker.core.frames(self.name, raw))
        assert set(out) <= {self.name}
        return out.get(self.name, [])

    @property
    def closed(self) -> bool:
        return self.name in self.worker.closed

    @property
    def credits(self) -> int:
        return int(self.worker.core.connections[self.name].credits)


def only_error(frames: list[Frame]) -> str:
    assert isinstance(frames[-1], Error), frames
    return frames[-1].reason


# --- the connector's core --------------------------------------------------------------

S1, S2 = "gen://100?seed=1", "gen://50?seed=2"
ID1, ID2 = stream_id_for(S1), stream_id_for(S2)
WORKER, OTHER = "127.0.0.1:7100", "127.0.0.1:7200"


def nothing(dialect: Dialect) -> int:
    """What NOTIFY carries for a stream with no point: the draft's 0, v3's NOTHING_SEEN."""
    return 0 if dialect is Dialect.DRAFT else NOTHING_SEEN


class Connector:
    """A ConnectorCore driven with frames; its actions kept, its writes decoded."""

    def __init__(self, dialect: Dialect, streams: tuple[str, ...] = (S1,)) -> None:
        self.dialect = dialect
        self.config = ConnectorConfig(
            WORKER, streams, cookie=b"c", dialect=dialect, instance_name="conn"
        )
        self.core = ConnectorCore()
        self.problems: list[str] = []
        self.n = 0
        self.start("i1")

    def keep(self, actions: Actions) -> list[Action]:
        self.problems += actions.problems
        return list(actions.actions)

    def start(self, incarnation: str) -> list[Action]:
        return self.keep(self.core.start(incarnation, self.config))

    def connect(self, dial: int, address: str = WORKER) -> tuple[str, list[Action]]:
        self.n += 1
        conn = f"c.{self.n}"
        return conn, self.keep(self.core.connected(dial, conn, address))

    def receive(self, conn: str, *frames: Frame) -> list[Action]:
        raw = [encode(f, self.dialect)[4:] for f in frames]
        return self.keep(self.core.frames(conn, raw))

    def gen(self, sid: int = 0) -> int:
        """A stream's generation now (``sid`` 0: the first stream's)."""
        return self.core.streams[sid or stream_id_for(self.config.streams[0])].generation

    def written(self, actions: list[Action], conn: str | None = None) -> list[Frame]:
        out: list[Frame] = []
        for a in actions:
            if isinstance(a, Write) and (conn is None or a.conn == conn):
                out += decode_all(b"".join(a.frames), self.dialect)
        return out

    def streaming(self, credits: int = 10) -> tuple[str, list[Action]]:
        """Dial 1 connected and OK'd; the actions of the OK (its NOTIFYs)."""
        conn, _ = self.connect(self.core.dials)
        return conn, self.receive(conn, Ok(credits))

    def open(self, point: int = NOTHING_SEEN) -> str:
        """Streaming, every stream at ``point`` and running: in v3 from the NOTIFY_ACK;
        in the draft from the OK's list (seed 000, C1), then a NOTIFY_ACK that agrees."""
        conn, _ = self.connect(self.core.dials)
        ids = [stream_id_for(name) for name in self.config.streams]
        draft = self.dialect is Dialect.DRAFT and point != NOTHING_SEEN
        self.receive(conn, Ok(10, [(sid, point) for sid in ids] if draft else []))
        for sid in ids:
            self.receive(conn, NotifyAck(True, sid, point))
        return conn


def kinds(actions: list[Action]) -> list[str]:
    return [type(a).__name__ for a in actions]
