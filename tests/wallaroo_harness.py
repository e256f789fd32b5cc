"""A harness for the worker's sans-IO core: a :class:`WorkerCore` with its connections,
driven as the immortal drives it (connection events and the frames of one read in) but
speaking frames rather than bytes, its replies read back with the codec.
"""

from __future__ import annotations

from typing import Any

from immortals.wallaroo import (
    DRAFT_VERSION,
    V3_VERSION,
    Dialect,
    Error,
    Frame,
    FrameReader,
    Hello,
    Message,
    Ok,
    encode,
    end_of_stream,
)
from immortals.wallaroo.worker_core import Replies, WorkerConfig, WorkerCore

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


def decode_all(wire: bytes, dialect: Dialect) -> list[Frame]:
    reader = FrameReader(dialect)
    reader.feed(wire)
    frames = list(reader)
    reader.close()
    return frames


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
