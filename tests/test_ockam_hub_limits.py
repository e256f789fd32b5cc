"""What a peer can make the Ockam hub hold: attacks on a real hub, and the decoders a
peer reaches before it has sent a valid frame, fuzzed.

The hub runs as ``ambrosia-py run immortals.ockam.hub`` (``HubProcess``, as in
``test_ockam_hub_e2e.py``); the attacks use plain sockets, the honest client
:class:`~immortals.ockam.hub_client.OckamClient`. Memory is the hub service process's
resident set (``VmRSS``), sampled while the attack runs; connections the hub holds are
its sockets on the hub's port (``/proc/PID/fd`` against ``/proc/net/tcp``). Every wait
has a deadline; nothing here asserts on wall time (the figures are printed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ambrosia_py.testing.processes import wait_for
from immortals.ockam import codec, pushes
from immortals.ockam.bench import HubProcess
from immortals.ockam.errors import OckamError
from immortals.ockam.hub_client import OckamClient
from immortals.ockam.hub_core import REPLY_BUDGET, StreamHub
from immortals.ockam.hub_transport import HUB_LIMITS
from immortals.ockam.routing import (
    MAX_FRAME,
    Address,
    AddressType,
    FrameReader,
    TransportMessage,
    decode_message,
    encode_message,
    frame,
)

from .strategies_ockam import chunked, requests, transport_messages

_ESTABLISHED = 1  # tcpi_state (linux/tcp.h)
_LISTEN = "0A"  # the st column of /proc/net/tcp


@contextlib.contextmanager
def running_hub(tmp_path: Path, *args: str) -> Iterator[HubProcess]:
    hub = HubProcess(tmp_path / "data")
    hub.args += args
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def tcp_state(sock: socket.socket) -> int:
    """The kernel's state of our end: ESTABLISHED until the hub closes or resets it."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]


def held_connections(pid: int, port: int) -> int:
    """Connections on ``port`` the process ``pid`` holds open (accepted, not closed)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    held = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local_port = int(fields[1].rsplit(":", 1)[1], 16)
        if local_port == port and fields[3] != _LISTEN and fields[9] in inodes:
            held += 1
    return held


class Sampler:
    """Samples a process's RSS (and anything else) in a thread until stopped."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.before = rss_mb(pid)
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.peak = max(self.peak, rss_mb(self.pid))
            self._stop.wait(0.01)  # the sampling period, not a synchronisation

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


async def honest_round_trip(port: int, name: str) -> float:
    """Seconds a fresh client takes to connect, create, push and pull (reported only)."""
    start = time.monotonic()
    client = await OckamClient.connect("127.0.0.1", port)
    try:
        stream = await client.create(name, timeout=30)
        assert await client.push(stream, b"honest", timeout=30) == 0
        assert [m.data for m in await client.pull(stream, 0, 10, timeout=30)] == [b"honest"]
    finally:
        await client.close()
    return time.monotonic() - start


# -- a peer that asks for much and reads nothing ------------------------------------------


async def test_unread_pulls_leave_the_hub_bounded_and_serving(tmp_path: Path) -> None:
    # A short stall deadline keeps the test short; it is still far longer than the
    # honest client takes, which the order of events below checks.
    with running_hub(
        tmp_path, "--output-stall-timeout", "8", "--max-buffered-output", str(256 * 1024)
    ) as hub:
        assert hub.proc is not None
        client = await OckamClient.connect("127.0.0.1", hub.port)
        stream = await client.create("victim")
        payloads = [b"%05d" % i + b"x" * 295 for i in range(200)]  # a 60 KB pull reply
        assert await client.push_many(stream, payloads) == list(range(200))
        await client.close()

        pull = frame(
            encode_message(
                TransportMessage(
                    1,
                    stream.route,
                    (Address.local("app"),),
                    codec.encode(codec.PullRequest(1, 0, 1000)),
                )
            )
        )
        count = 20_000
        attacker = socket.socket()
        attacker.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        attacker.connect(("127.0.0.1", hub.port))
        attacker.settimeout(60)  # a hub that stops reading blocks the send: not forever
        sampler = Sampler(hub.proc.pid)
        sent = threading.Event()

        def send() -> None:
            with contextlib.suppress(OSError):
                for _ in range(count // 100):
                    attacker.sendall(pull * 100)
            sent.set()

        threading.Thread(target=send, daemon=True).start()
        try:
            # The honest client starts once the attack is in (or the hub stopped
            # taking it), and is done while the attacker's socket is open and unread.
            await asyncio.to_thread(wait_for, "the attack to be sent", sent.is_set, 60)
            honest = await honest_round_trip(hub.port, "honest")
            assert tcp_state(attacker) == _ESTABLISHED
            # The hub closes the attacker once its unsent output stays over the bound.
            await asyncio.to_thread(
                wait_for,
                "the hub to close the attacker",
                lambda: tcp_state(attacker) != _ESTABLISHED,
                60,
                hub.tail,
            )
        finally:
            sampler.stop()
            attacker.close()
        growth = sampler.peak - sampler.before
        print(
            f"unread pulls: {len(pull)}-byte frames x {count}; hub RSS {sampler.before:.0f} MB "
            f"before, {sampler.peak:.0f} MB at peak; honest round trip {honest:.2f} s"
        )
        assert growth < 100, f"the hub grew by {growth:.0f} MB"
        assert "output unread" in hub.output()
        assert await honest_round_trip(hub.port, "after") >= 0  # still serving


# -- connections that never send a frame --------------------------------------------------


def _raise_fd_limit(wanted: int) -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return soft


async def test_idle_connections_are_held_at_the_cap_and_honest_clients_get_in(
    tmp_path: Path,
) -> None:
    cap = HUB_LIMITS.max_connections
    flood = min(3000, _raise_fd_limit(3400) - 300)
    sources = [f"127.0.1.{k}" for k in range(1, 101)]  # under the per-source pending limit
    assert flood > 2 * cap
    with running_hub(tmp_path, "--handshake-timeout", "5", "--idle-timeout", "10") as hub:
        assert hub.proc is not None
        pid = hub.proc.pid
        most = 0
        idle: list[socket.socket] = []
        try:
            for k in range(flood):
                idle.append(
                    socket.create_connection(
                        ("127.0.0.1", hub.port), timeout=10, source_address=(sources[k % 100], 0)
                    )
                )
                if k % 100 == 0:
                    most = max(most, held_connections(pid, hub.port))

            def evicted_all_but_cap() -> bool:
                nonlocal most
                most = max(most, held_connections(pid, hub.port))
                return tcp_state(idle[flood - cap - 1]) != _ESTABLISHED

            await asyncio.to_thread(
                wait_for, "the hub to take the whole flood", evicted_all_but_cap, 30, hub.tail
            )
            assert held_connections(pid, hub.port) == cap
            # Every slot is pending: an honest client evicts the oldest and is served.
            honest_client = await OckamClient.connect("127.0.0.1", hub.port)
            stream = await honest_client.create("honest")
            assert await honest_client.push(stream, b"in") == 0
            most = max(most, held_connections(pid, hub.port))
            # A newcomer is accepted and the oldest pending dropped in one step, but asyncio
            # closes a dropped socket on the loop's next turn: a sample may catch both.
            assert cap <= most <= cap + 1
            states = [tcp_state(s) for s in idle]
            # The newest flood connections are the ones held; the oldest were evicted.
            assert all(s == _ESTABLISHED for s in states[flood - cap + 1 :])
            assert not any(s == _ESTABLISHED for s in states[: flood - cap + 1])

            # An established connection that then sends nothing goes at the idle timeout.
            probe = socket.create_connection(("127.0.0.1", hub.port), timeout=30)
            idle.append(probe)
            probe.sendall(frame(_wrapped((INDEX,), codec.encode(codec.GetIndex("c", "s")))))
            assert probe.recv(65536)  # answered: established

            # Past the handshake deadline the pending ones go; the established stay.
            await asyncio.to_thread(
                wait_for,
                "the pending connections to time out",
                lambda: held_connections(pid, hub.port) == 2,
                30,
                hub.tail,
            )
            assert await honest_client.push(stream, b"still") == 1
            await honest_client.close()
            await asyncio.to_thread(
                wait_for,
                "the hub to close an idle connection",
                lambda: tcp_state(probe) != _ESTABLISHED,
                60,
                hub.tail,
            )
            assert "sent nothing for 10 s" in hub.output()
        finally:
            for s in idle:
                s.close()
        closes = re.findall(r"closing 127\.0\.1\.(\d+):", hub.output())
        per_source = {src: closes.count(src) for src in set(closes)}
        print(
            f"idle flood: {flood} connections, hub held at most {most}; "
            f"{len(closes)} close lines logged in full"
        )
        # Five per source in full, then a count (an interval is 10 s: at most two here).
        assert max(per_source.values()) <= 10


# -- what a peer reaches before its first valid frame, fuzzed ----------------------------

INDEX = Address.local("stream_index_service")
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
VIA = Address.tcp("127.0.0.1", 50000)


def _valid_frames(msgs: list[TransportMessage]) -> bytes:
    return b"".join(frame(encode_message(m)) for m in msgs)


def _check_reader(chunks: list[bytes]) -> None:
    reader = FrameReader()
    for chunk in chunks:
        try:
            out = reader.feed(chunk)
        except OckamError:
            return
        assert all(0 < len(f) <= MAX_FRAME for f in out)
        assert reader.buffered < 2 + MAX_FRAME  # never more than one frame's worth held


@FUZZ
@given(st.data(), st.binary(max_size=600), st.lists(transport_messages, max_size=3))
def test_frame_reader_on_random_and_cut_bytes(
    data: st.DataObject, noise: bytes, msgs: list[TransportMessage]
) -> None:
    _check_reader(data.draw(chunked(noise)))
    good = _valid_frames(msgs)
    cut = data.draw(st.integers(0, len(good)))
    _check_reader(data.draw(chunked(good[:cut] + noise)))


def test_frame_reader_holds_one_frame_at_most() -> None:
    stream = (b"\xff\xff" + b"\x01" * MAX_FRAME) * 160  # maximal frames back to back
    reader = FrameReader()
    frames = 0
    for at in range(0, len(stream), 256 * 1024):  # reads that cut frames anywhere
        frames += len(reader.feed(stream[at : at + 256 * 1024]))
        assert reader.buffered < 2 + MAX_FRAME
    assert frames == 160


def _fuzz_one(buf: bytes) -> None:
    """Each decoder either decodes ``buf`` or raises an OckamError."""
    with contextlib.suppress(OckamError):
        decode_message(buf)
    with contextlib.suppress(OckamError):
        codec.decode_request(buf)
    with contextlib.suppress(OckamError):
        codec.decode_payload(buf)
    for start in range(min(len(buf), 4)):  # the fast path, on a header's end
        found = pushes.read_push_at(buf, start)
        assert found is None or isinstance(found, tuple)


@FUZZ
@given(st.binary(max_size=300), requests, transport_messages, st.data())
def test_decoders_decode_or_raise_ockam_errors(
    noise: bytes, request: codec.Request, msg: TransportMessage, data: st.DataObject
) -> None:
    _fuzz_one(noise)
    for good in (codec.encode(request), encode_message(msg)):
        cut = data.draw(st.integers(0, len(good)))
        _fuzz_one(good[:cut])
        flip = data.draw(st.integers(0, max(len(good) - 1, 0)))
        _fuzz_one(good[:flip] + bytes([good[flip] ^ 0xFF]) + good[flip + 1 :] if good else b"")


def _wrapped(onward: tuple[Address, ...], payload: bytes) -> bytes:
    return encode_message(TransportMessage(1, onward, (Address.local("app"),), payload))


@FUZZ
@given(st.lists(st.binary(max_size=120) | requests.map(codec.encode), max_size=12), st.data())
def test_the_hub_answers_any_frames_within_a_frame_and_never_raises(
    payloads: list[bytes], data: st.DataObject
) -> None:
    hub = StreamHub()
    create = _wrapped(
        (Address.local("stream_service"),), codec.encode(codec.CreateStreamRequest("s"))
    )
    hub.handle_frames([create], VIA, 0)
    targets = [
        Address.local("stream_service"),
        INDEX,
        hub.worker_address("s", 0),
        Address(AddressType.TCP, b"x" * 30_000),  # an error naming it must still fit
        Address.local("y" * 30_000),
    ]
    frames = [_wrapped((data.draw(st.sampled_from(targets)),), p) for p in payloads]
    frames += data.draw(st.lists(st.binary(min_size=1, max_size=80), max_size=4))
    replies = hub.handle_frames(frames, VIA, 1)
    got = FrameReader().feed(replies.wire)  # whole frames, each within the limit
    assert len(got) == replies.count
    for reply in got:
        decode_message(reply)


def test_one_reads_pulls_share_the_reply_budget() -> None:
    hub = StreamHub()
    service = Address.local("stream_service")
    (init,) = hub.handle(
        _wrapped((service,), codec.encode(codec.CreateStreamRequest("s"))), VIA, 0
    ).replies
    worker = init.return_route[0]
    for i in range(200):
        hub.handle(_wrapped((worker,), codec.encode(codec.PushRequest(i, b"x" * 300))), VIA, 0)
    pull = _wrapped((worker,), codec.encode(codec.PullRequest(1, 0, 1000)))
    replies = hub.handle_frames([pull] * 2000, VIA, 0)
    got = [
        codec.decode_response(decode_message(f).payload) for f in FrameReader().feed(replies.wire)
    ]
    assert len(got) == 2000  # every pull answered
    full = [r for r in got if isinstance(r, codec.PullResponse) and r.messages]
    assert full and all(r.messages[0].index == 0 for r in full)  # from its index, as asked
    assert len(replies.wire) < REPLY_BUDGET + 2000 * 64  # the budget, and empty answers
    # A lone pull is never cut below what one frame holds.
    (alone,) = FrameReader().feed(hub.handle_frames([pull], VIA, 0).wire)
    response = codec.decode_response(decode_message(alone).payload)
    assert isinstance(response, codec.PullResponse) and len(response.messages) == 200


def test_a_partitioned_create_whose_inits_do_not_fit_is_refused_before_it_creates() -> None:
    hub = StreamHub()
    long_route = tuple(Address.local("r" * 250) for _ in range(12))  # 3 KB of return route
    big = encode_message(
        TransportMessage(
            1,
            (Address.local("stream_service"),),
            long_route,
            codec.encode(codec.CreatePartitionedRequest("wide", 1024)),
        )
    )
    (reply,) = FrameReader().feed(hub.handle_frames([big], VIA, 0).wire)
    error = codec.decode_response(decode_message(reply).payload)
    assert isinstance(error, codec.Error) and "send it again" in error.reason
    assert ("wide", 0) not in hub.streams
