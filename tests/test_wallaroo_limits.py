"""What a peer can make the Wallaroo worker hold: the limits of its two ports.

Real processes on loopback (``tests/wallaroo_process.py``), two workers started side by
side: ``plain`` with the default limits, ``tight`` with a small connection cap and short
deadlines. Against them: forty connections each declaring a 4,000,000-byte frame before
HELLO (each closed at its first four bytes; the service process's peak resident memory
stays flat while an honest connector streams); more silent connections than the cap
(the oldest pending evicted, the honest connector served, the rest closed at the
handshake deadline); the operators' port (an over-long line, a line nested deep, a
silent connection). Then the edges in process, on real sockets, with a stand-in for the
worker core: HELLO alone before the OK, refusals that report nothing, back-pressure on
output, idle and mid-frame deadlines, the per-source cap. And a fuzz of every decoder a
peer reaches before the handshake. Every wait has a deadline; no test asserts wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ambrosia_py.serving import ConnectionLimits
from ambrosia_py.testing.processes import ServiceProcess, wait_for
from immortals.wallaroo import (
    DRAFT_VERSION,
    LENGTH_PREFIX_BYTES,
    V3_VERSION,
    ControlRequestError,
    Dialect,
    Hello,
    Notify,
    Ok,
    ProtocolError,
    WorkerConfig,
    encode,
)
from immortals.wallaroo.codec import decode_tagged, split_frames
from immortals.wallaroo.worker_control import ControlServer, parse_request
from immortals.wallaroo.worker_transport import LIMITS, WorkerTransport, screen_hello
from tests.wallaroo_process import (
    COOKIE,
    NOTHING_SEEN,
    V3Client,
    WorkerProcess,
    released_stream_id,
    v3_eos,
    v3_hello,
    v3_message,
)

ATTACKERS = 40
DECLARED = 4_000_000  # each attacker's frame length
SENT = 1 << 20  # the part of it each attacker sends
RSS_BOUND_KIB = 20 * 1024  # growth allowed: far below the +180 MB the attack cost before
TIGHT_CAP = 8
TIGHT_HANDSHAKE = 6.0  # s: long enough to see evictions first, short enough to wait out
DEADLINE = 60.0


def _kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


@pytest.fixture(scope="module")
def workers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, WorkerProcess]]:
    base = tmp_path_factory.mktemp("limits")
    credits = ("--max-credits", "100", "--refill-credits", "50")
    procs = {
        "plain": WorkerProcess(base / "plain", *credits),
        "tight": WorkerProcess(
            base / "tight",
            *credits,
            *("--max-connections", str(TIGHT_CAP), "--handshake-timeout", str(TIGHT_HANDSHAKE)),
            *("--control-timeout", "1.5", "--control-max-line", "4096"),
        ),
    }
    try:
        for w in procs.values():  # both start at once: half the wait
            ServiceProcess.start(w)
        for w in procs.values():
            w.wait_ready()
        yield procs
    finally:
        for w in procs.values():
            w.stop()


def honest(port: int, name: str, messages: int = 150) -> float:
    """HELLO, a stream, its messages and EOS, as the released connector does; the
    seconds from connecting to the OK (a figure, never asserted)."""
    began = time.monotonic()
    client = V3Client(port)
    try:
        client.handshake()
        to_ok = time.monotonic() - began
        sid = released_stream_id(name)
        assert client.notify(name, NOTHING_SEEN) == NOTHING_SEEN
        for i in range(1, messages + 1):
            client.wait_credits()
            client.send(v3_message(sid, i, b"honest words"))
            client.credits -= 1
        client.wait_credits()
        client.send(v3_eos(sid))
        deadline = time.monotonic() + DEADLINE
        while client.acked.get(sid) != messages:
            assert time.monotonic() < deadline, client.acked
            client.next_event()
    finally:
        client.close()
    return to_ok


def closed_by_peer(sock: socket.socket, timeout: float = DEADLINE) -> bool:
    """Read to the end: True once the worker closed (or reset) the connection."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


# --- the connectors' port, end to end -----------------------------------------------------


def test_frames_declared_before_hello_hold_nothing(workers: dict[str, WorkerProcess]) -> None:
    w = workers["plain"]
    assert w.proc is not None
    pid = w.proc.pid
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # the peak from here on
    before = _kib(pid, "VmRSS")
    socks: list[socket.socket] = []
    started = threading.Event()

    def attack() -> None:
        for n in range(ATTACKERS):
            s = socket.create_connection(("127.0.0.1", w.port), timeout=DEADLINE)
            socks.append(s)
            with contextlib.suppress(OSError):  # reset at its first four bytes: may fail
                s.sendall(struct.pack(">I", DECLARED) + bytes(SENT))
            if n == 4:
                started.set()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    assert started.wait(DEADLINE)
    to_ok = honest(w.port, "under attack")
    attacker.join(DEADLINE)
    assert not attacker.is_alive()
    try:
        assert all(closed_by_peer(s) for s in socks)
    finally:
        for s in socks:
            s.close()
    peak = _kib(pid, "VmHWM")
    print(f"\nRSS before {before} KiB, peak {peak} KiB (+{peak - before}); first OK {to_ok:.3f} s")
    assert peak - before < RSS_BOUND_KIB
    status = w.status()
    assert status["edge"]["closed_by_limits"]["hello_too_large"] == ATTACKERS
    assert status["app_state"]["messages"] == 150


def test_silent_connections_are_evicted_then_timed_out(workers: dict[str, WorkerProcess]) -> None:
    w = workers["tight"]
    before = w.status()["edge"]["closed_by_limits"]
    silent = [socket.create_connection(("127.0.0.1", w.port)) for _ in range(TIGHT_CAP + 2)]
    try:
        # The table holds TIGHT_CAP: the two oldest went to make room for the last two.
        wait_for("the two oldest evicted", lambda: not any(map(is_open, silent[:2])))
        assert all(is_open(s) for s in silent[2:])
        honest(w.port, "past the silent ones")  # evicts the next oldest to get in
        assert closed_by_peer(silent[2])
        # The rest never said HELLO: closed at the handshake deadline.
        assert all(closed_by_peer(s) for s in silent[3:])
    finally:
        for s in silent:
            s.close()
    after = w.status()["edge"]["closed_by_limits"]
    assert after.get("evicted", 0) - before.get("evicted", 0) == 3
    assert after["handshake_timeout"] - before.get("handshake_timeout", 0) == TIGHT_CAP - 1


def test_a_refused_hello_is_answered_at_the_edge(workers: dict[str, WorkerProcess]) -> None:
    w = workers["tight"]
    for first, reason in [
        (v3_hello("wrong"), "Bad cookie"),
        (b"\x00\x00\x00\x05\xffjunk", "v3 Frame.tag at offset 4: unknown tag 0xff"),
    ]:
        client = V3Client(w.port)
        try:
            client.send(first)
            with pytest.raises(Exception, match="ERROR"):
                client.next_event()
            assert client.errors == [reason]
        finally:
            client.close()
    assert w.status()["edge"]["closed_by_limits"]["hello_refused"] >= 2


# --- the operators' port ------------------------------------------------------------------


def _control(w: WorkerProcess) -> socket.socket:
    host, port = w.control.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=DEADLINE)


def test_the_operators_port_bounds_lines_and_waits(workers: dict[str, WorkerProcess]) -> None:
    w = workers["tight"]
    with _control(w) as long_line, long_line.makefile("rb") as answers:
        long_line.sendall(b'{"cookie": "' + b"x" * 10_000 + b'", "op": "status"}\n')
        answer = json.loads(answers.readline())
        assert answer == {"ok": False, "error": "a request line is at most 4096 bytes"}
        assert answers.readline() == b""  # and closed
    with _control(w) as deep, deep.makefile("rb") as answers:
        deep.sendall(b"[" * 3000 + b"\n")  # nested past the parser's recursion limit
        answer = json.loads(answers.readline())
        assert not answer["ok"] and answer["error"].startswith("not a JSON request")
        deep.sendall(json.dumps({"cookie": COOKIE, "op": "status"}).encode() + b"\n")
        assert json.loads(answers.readline())["ok"]  # the connection serves on
    with _control(w) as silent:
        assert closed_by_peer(silent)  # at the first request's deadline
    assert w.status()["applied"] >= 0  # and the port still answers


# --- the edges in process, on real sockets ------------------------------------------------


class FakeCore:
    """Stands in for the worker immortal: records the impulses and answers as an effect
    would, later: OK to a HELLO, ``reply`` to anything after it."""

    def __init__(self, reply: bytes = b"") -> None:
        self.events: list[tuple[Any, ...]] = []
        self.reply = reply
        self.transport: WorkerTransport | None = None

    def opened(self, conn: str, peer: str) -> None:
        self.events.append(("opened", conn))

    def frames(self, conn: str, now_ms: int, frames: list[bytes]) -> None:
        self.events.append(("frames", conn, frames))
        asyncio.get_running_loop().call_soon(self._answer, conn, frames)

    def _answer(self, conn: str, frames: list[bytes]) -> None:
        assert self.transport is not None
        if frames[0][0] == 0:  # v3 HELLO
            self.transport.write(conn, encode(Ok(100), Dialect.V3), False)
        elif self.reply:
            self.transport.write(conn, self.reply, False)

    def too_large(self, conn: str, offset: int, size: int) -> None:
        self.events.append(("too_large", conn, size))

    def closed(self, conn: str) -> None:
        self.events.append(("closed", conn))


CONFIG = WorkerConfig(cookie=COOKIE.encode(), dialect="v3", max_credits=100, refill_credits=50)


async def _edge(core: FakeCore, limits: ConnectionLimits = LIMITS) -> WorkerTransport:
    transport = core.transport = WorkerTransport(core, "i", CONFIG, limits)
    await transport.start("127.0.0.1", 0)
    return transport


async def _until(what: str, condition: Callable[[], bool], timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)  # polling a condition, bounded by the deadline
    assert condition(), what


async def test_hello_goes_alone_and_the_rest_waits_for_the_ok() -> None:
    core = FakeCore()
    transport = await _edge(core)
    try:
        reader, writer = await asyncio.open_connection(*transport.address)
        notify = encode(Notify(7, "s", 0), Dialect.V3)
        writer.write(v3_hello(COOKIE) + notify)
        await _until("both frames", lambda: len(core.events) == 3)
        hello_frame = v3_hello(COOKIE)[LENGTH_PREFIX_BYTES:]
        assert core.events == [
            ("opened", "i.1"),
            ("frames", "i.1", [hello_frame]),
            ("frames", "i.1", [notify[LENGTH_PREFIX_BYTES:]]),
        ]
        assert await reader.readexactly(9) == encode(Ok(100), Dialect.V3)
        assert transport.stats()["pending"] == 0 and transport.stats()["open"] == 1
        writer.close()
        await _until("closed", lambda: core.events[-1] == ("closed", "i.1"))
    finally:
        transport.close()


async def test_refusals_before_the_ok_report_nothing() -> None:
    core = FakeCore()
    limits = ConnectionLimits(max_pending_per_source=2, handshake_timeout_s=30.0)
    transport = await _edge(core, limits)
    try:
        big = await asyncio.open_connection(*transport.address)
        big[1].write(struct.pack(">I", 4097) + b"x" * 100)
        assert b"before the handshake" in await big[0].read()  # ERROR, then the end
        silent = [await asyncio.open_connection(*transport.address) for _ in range(3)]
        assert await silent[0][0].read() == b""  # a third from one address: the oldest goes
        await _until("counted", lambda: transport.closes["evicted"] == 1)
        assert transport.closes["hello_too_large"] == 1 and core.events == []
        for _, w in silent:
            w.close()
        big[1].close()
    finally:
        transport.close()


async def test_a_peer_that_reads_nothing_is_not_read_then_closed() -> None:
    core = FakeCore(reply=b"\x00" * (16 << 20))  # more than the kernel's buffers take
    limits = ConnectionLimits(max_buffered_output=64 * 1024, output_stall_s=0.5)
    transport = await _edge(core, limits)
    notify = encode(Notify(1, "s", 0), Dialect.V3)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(transport.address)
        sock.setblocking(False)
        _, writer = await asyncio.open_connection(sock=sock)
        writer.write(v3_hello(COOKIE) + notify)
        await _until("the frame after HELLO", lambda: len(core.events) == 3)
        writer.write(notify)  # the read under way when the answer landed takes this one
        await _until("the next", lambda: len(core.events) == 4)
        writer.write(notify * 50)  # none of these: the answers wait unread
        await _until("closed", lambda: ("closed", "i.1") in core.events)
        assert transport.closes["output_stalled"] == 1
        assert sum(len(e[2]) for e in core.events if e[0] == "frames") == 3
        writer.close()
    finally:
        transport.close()


async def test_idle_and_mid_frame_deadlines() -> None:
    core = FakeCore()
    limits = ConnectionLimits(handshake_timeout_s=1.0, idle_timeout_s=0.3)
    transport = await _edge(core, limits)
    try:
        for tail, kind in [(b"", "idle"), (b"\x00\x00\x00", "stalled")]:
            reader, writer = await asyncio.open_connection(*transport.address)
            writer.write(v3_hello(COOKIE) + tail)
            assert await reader.readexactly(9) == encode(Ok(100), Dialect.V3)
            assert await reader.read() == b""
            await _until(kind, lambda kind=kind: transport.closes[kind] == 1)
            writer.close()
        assert [e[0] for e in core.events].count("closed") == 2
    finally:
        transport.close()


async def test_the_last_frames_go_out_before_a_fin_not_a_reset() -> None:
    """The worker closes behind a RESTART (or an ERROR) while the connector's messages are
    still unread: the connector must read that frame, then the end of the stream. A
    close with unread input would reset the connection instead (RFC 2525, 2.17)."""
    core = FakeCore()
    transport = await _edge(core)
    try:
        reader, writer = await asyncio.open_connection(*transport.address)
        writer.write(v3_hello(COOKIE))
        assert await reader.readexactly(9) == encode(Ok(100), Dialect.V3)
        writer.write(v3_message(1, 1, b"m" * 1000) * 1000)  # more than the edge will read
        await _until("past its credits", lambda: len(core.events) > 2 and _reported(core) > 102)
        restart = struct.pack(">IBI", 20, 7, 15) + b"127.0.0.1:65000"  # reference, by hand
        transport.write("i.1", restart, True)
        assert await reader.read() == restart  # then the end: no ConnectionResetError
        writer.close()
        await _until("the rest read and dropped", lambda: transport.stats()["open"] == 0)
    finally:
        transport.close()


def _reported(core: FakeCore) -> int:
    return sum(len(e[2]) for e in core.events if e[0] == "frames")


async def test_the_operators_port_stops_reading_a_client_that_reads_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    big = {"state": "x" * (16 << 20)}  # more than the kernel's buffers take
    limits = ConnectionLimits(max_buffered_output=64 * 1024, output_stall_s=0.5)
    server = ControlServer(COOKIE, lambda: big, lambda n, r: None, limits)
    await server.start("127.0.0.1", 0)
    try:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(server.address)
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock, limit=32 << 20)
        writer.write((json.dumps({"cookie": COOKIE, "op": "status"}) + "\n").encode() * 20)
        await _until("closed", lambda: "of output unread" in caplog.text)
        answers = 0
        with contextlib.suppress(ConnectionResetError, asyncio.IncompleteReadError):
            while await reader.readuntil(b"\n"):
                answers += 1
        assert answers < 20  # it stopped answering, then closed
        writer.close()
    finally:
        server.close()


# --- every decoder before the handshake, fuzzed -------------------------------------------


def _bounded(call: Callable[[], object], data: bytes) -> None:
    """Run ``call``; what it allocated at its peak stays within a bound of its input."""
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        call()
        # Interpreter noise (a first call's lazy imports, a traceback) is well under this;
        # holding what a length declares, or a copy per byte, is not.
        assert tracemalloc.get_traced_memory()[1] - start < 256 * 1024 + 8 * len(data)
    finally:
        tracemalloc.stop()


def _hello(dialect: Dialect, cookie: bytes) -> bytes:
    version = DRAFT_VERSION if dialect is Dialect.DRAFT else V3_VERSION
    return encode(Hello(version, cookie, "prog", "inst"), dialect)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(Dialect)), st.data())
def test_fuzz_the_frame_splitter_and_hello(dialect: Dialect, data: Any) -> None:
    good = _hello(dialect, COOKIE.encode())
    kind = data.draw(st.sampled_from(["random", "cut", "good"]))
    if kind == "random":
        wire = bytearray(data.draw(st.binary(max_size=5000)))
    else:
        wire = bytearray(good[: data.draw(st.integers(0, len(good)))] if kind == "cut" else good)
    for at in data.draw(st.lists(st.integers(0, max(len(wire) - 1, 0)), max_size=4)):
        if wire:
            wire[at] = data.draw(st.integers(0, 255))
    wire_bytes = bytes(wire)
    order = "little" if dialect is Dialect.DRAFT else "big"
    config = WorkerConfig(cookie=COOKIE.encode(), dialect=dialect)
    limit = LIMITS.max_pre_handshake_frame

    def check() -> None:
        frames, used, oversize = split_frames(bytearray(wire_bytes), order, limit, most=1)
        assert len(frames) <= 1 and used <= len(wire_bytes)
        if oversize is not None:
            assert oversize[1] > limit and not frames
        for raw in frames:
            assert len(raw) <= limit
            with contextlib.suppress(ProtocolError):  # and nothing else
                decode_tagged(raw, dialect, LENGTH_PREFIX_BYTES)
            refusal = screen_hello(raw, config)
            assert refusal is None or isinstance(refusal, str)
            if wire_bytes == good:
                assert refusal is None

    _bounded(check, wire_bytes)


_requests = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.binary(max_size=5000),
        _requests.map(lambda r: json.dumps(r).encode()),
        st.fixed_dictionaries(
            {"cookie": _requests, "op": _requests},
            optional={"stream": _requests, "point": _requests, "target": _requests},
        ).map(lambda r: json.dumps(r).encode()),
        st.integers(1, 5000).map(lambda n: b"[" * n),
        st.integers(1, 5000).map(lambda n: b'{"a":' * n),
    ),
    st.integers(0, 5000),
)
def test_fuzz_the_operators_request_lines(line: bytes, cut: int) -> None:
    for text in (line, line[:cut]):

        def check(text: bytes = text) -> None:
            try:
                request = parse_request(text, 4096)
            except ControlRequestError:
                return
            assert isinstance(request, dict) and len(text) <= 4096
            assert isinstance(request.get("cookie") or "", str)

        _bounded(check, text)
