"""A Wallaroo worker as real processes, and a v3 client built by hand, for process tests.

:class:`WorkerProcess` runs ``ambrosia-py run immortals.wallaroo.worker`` (and so its
coordinator) on free loopback ports, with an operators' port, and SIGKILLs the service
process, the coordinator or both. :class:`V3Client` speaks v3 as the released Python
connector does (``machida/lib/wallaroo/experimental/connectors.py``): every byte it sends
is built here with ``struct`` from the reference's layouts, not by our encoder, and it
reads OK, ERROR, NOTIFY_ACK and ACK by hand. Every wait has a deadline.
"""

from __future__ import annotations

import hashlib
import os
import socket
import struct
from pathlib import Path
from typing import Any

from ambrosia_py.testing.ports import free_port
from ambrosia_py.testing.processes import ServiceProcess, wait_for
from immortals.wallaroo.worker_client import request

ROOT = Path(__file__).resolve().parents[1]
COOKIE = "e2e-cookie"
NOTHING_SEEN = 2**64 - 1


class WorkerProcess(ServiceProcess):
    """One ``ambrosia-py run immortals.wallaroo.worker`` and its coordinator child."""

    def __init__(
        self, data_dir: Path, *extra: str, dialect: str = "v3", instance: str = "worker"
    ) -> None:
        self.dialect = dialect
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.control = f"127.0.0.1:{free_port()}"
        super().__init__(
            "immortals.wallaroo.worker",
            instance,
            data_dir,
            [
                *("--listen", f"127.0.0.1:{self.port}", "--control", self.control),
                *("--cookie", COOKIE, "--dialect", dialect, *extra),
                *("--app", "tests.wallaroo_apps:word_count"),
            ],
            log=data_dir / f"{instance}.run.log",
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def start(self, timeout: float = 60.0) -> None:
        """Start it and wait until its operators' port answers."""
        super().start()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the operators' port answers (stopping it if it never does)."""

        def answers() -> bool:
            try:
                request(self.control, COOKIE, {"op": "status"}, timeout=2)
                return True
            except (OSError, ValueError):
                self.check_alive()
                return False

        try:
            wait_for("the worker's operators' port", answers, timeout, self.tail)
        except BaseException:
            self.stop()
            raise

    def status(self) -> dict[str, Any]:
        answer = request(self.control, COOKIE, {"op": "status"})
        assert answer["ok"], answer
        return dict(answer["status"])


# --- v3 as the released connector writes it, byte by byte -------------------------------


def _short(text: bytes) -> bytes:
    return struct.pack(">H", len(text)) + text


def _frame(tag: int, body: bytes) -> bytes:
    return struct.pack(">IB", 1 + len(body), tag) + body


def v3_hello(cookie: str) -> bytes:
    body = _short(b"0.0.1") + _short(cookie.encode()) + _short(b"e2e") + _short(b"client")
    return _frame(0, body)


def v3_notify(stream_id: int, name: str, point: int) -> bytes:
    return _frame(
        3, struct.pack(">Q", stream_id) + _short(name.encode()) + struct.pack(">Q", point)
    )


def v3_message(stream_id: int, message_id: int, payload: bytes) -> bytes:
    # stream id, message id, event time (i64), an empty key, then the payload
    return _frame(5, struct.pack(">QQqH", stream_id, message_id, 0, 0) + payload)


def v3_eos(stream_id: int) -> bytes:
    return _frame(8, struct.pack(">Q", stream_id))


def released_stream_id(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:16], 16)


class Closed(Exception):
    """The worker closed the connection (or sent ERROR)."""


class V3Client:
    """One connection, reading frames by hand: OK, ERROR, NOTIFY_ACK, ACK."""

    def __init__(self, port: int, cookie: str = COOKIE, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.credits = 0
        self.acked: dict[int, int] = {}
        self.errors: list[str] = []

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def read_frame(self) -> tuple[int, bytes]:
        while True:
            if len(self.buf) >= 4:
                (size,) = struct.unpack(">I", self.buf[:4])
                if len(self.buf) >= 4 + size:
                    tag, body = self.buf[4], self.buf[5 : 4 + size]
                    self.buf = self.buf[4 + size :]
                    return tag, body
            data = self.sock.recv(65536)
            if not data:
                raise Closed("connection closed")
            self.buf += data

    def next_event(self) -> tuple[str, Any]:
        """The next frame, with ACKs applied: ("ok", credits), ("notify_ack", (success,
        stream, point)), ("ack", pairs). ERROR raises Closed."""
        tag, body = self.read_frame()
        if tag == 1:
            (self.credits,) = struct.unpack(">I", body)
            return "ok", self.credits
        if tag == 2:
            (n,) = struct.unpack(">H", body[:2])
            self.errors.append(body[2 : 2 + n].decode())
            raise Closed(f"ERROR {self.errors[-1]}")
        if tag == 4:
            success, sid, point = struct.unpack(">BQQ", body)
            return "notify_ack", (bool(success), sid, point)
        if tag == 6:
            credits, count = struct.unpack(">II", body[:8])
            self.credits += credits
            pairs = [struct.unpack(">QQ", body[8 + 16 * i : 24 + 16 * i]) for i in range(count)]
            for sid, point in pairs:
                self.acked[sid] = point
            return "ack", pairs
        raise AssertionError(f"unexpected tag {tag}")

    def handshake(self) -> int:
        self.send(v3_hello(COOKIE))
        kind, credits = self.next_event()
        assert kind == "ok"
        return int(credits)

    def notify(self, name: str, point: int) -> int:
        """NOTIFY, then the point NOTIFY_ACK says to resume after (ACKs meanwhile kept)."""
        sid = released_stream_id(name)
        self.send(v3_notify(sid, name, point))
        self.credits -= 1
        while True:
            kind, value = self.next_event()
            if kind == "notify_ack":
                success, stream, resume = value
                assert success and stream == sid, value
                return int(resume)

    def wait_credits(self) -> None:
        while self.credits <= 0:
            self.next_event()

    def close(self) -> None:
        self.sock.close()
