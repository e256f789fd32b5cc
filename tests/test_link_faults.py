"""Links between two coordinators through fault-injecting proxies: connections
cut inside frames, chunks delayed, split, reordered and replayed, bits flipped. Exactly
once must hold all the same: every call answered once, the server ran every call and
fork once, in order, and no damaged frame was ever logged or run.

Each instance has its own data directory, as on two machines. Each coordinator's
``--link-to`` names a proxy in front of the other's link port, so both links (client ->
server carrying calls, server -> client carrying replies) and both directions of each
(messages one way, ReplayFrom and Commits the other) go through a :class:`FaultProxy`.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding.replay import replay_instance
from ambrosia_py.coordinator.links.auth import (
    CHALLENGE_SIZE,
    CONFIRM_SIZE,
    RESPONSE_SIZE,
)
from ambrosia_py.flow.constants import CONNECT_PACKET_LENGTH, FRAME_HEADER_LENGTH
from ambrosia_py.testing import ImmortalRunner, RunningImmortal
from ambrosia_py.testing.ports import free_port
from examples.hello.server import HelloServer, Refused
from tests.certs import mutual_tls, needs_openssl
from tests.fault_proxy import KINDS, FaultPlan, FaultProxy, Faults

DEADLINE = 60.0
COUNT = 300  # messages the client sends the server under the heavy plan
# Short timeouts, so that a frame whose length field a flip made longer (the checksum
# does not cover the length, so it is noticed only once that many bytes arrived) costs a
# second, not the default five minutes.
TIMEOUTS = ("--link-handshake-timeout", "2", "--link-idle-timeout", "1")

_HEAVY_DIRECTION = Faults(
    cut=0.3,
    cut_after=(40, 3000),
    delay=0.1,
    max_delay=0.02,
    split=0.15,
    flip=0.012,
    duplicate=0.012,
    reorder=0.012,
)
HEAVY = FaultPlan(forward=_HEAVY_DIRECTION, backward=_HEAVY_DIRECTION)
# A TLS handshake carries a few KiB (certificates both ways), and every connection that
# fails before it opens backs the dialer off longer: cuts come a little later here.
_HEAVY_TLS_DIRECTION = dataclasses.replace(_HEAVY_DIRECTION, cut_after=(300, 12_000))
HEAVY_TLS = FaultPlan(forward=_HEAVY_TLS_DIRECTION, backward=_HEAVY_TLS_DIRECTION)

# Where the handshake runs on a plain link, in stream offsets: after the ConnectPacket,
# the CHALLENGE and CONFIRM frames from the dialer, the RESPONSE frame from the acceptor.
_CONNECT = 4 + CONNECT_PACKET_LENGTH
DIALER_HANDSHAKE = (_CONNECT, _CONNECT + 2 * FRAME_HEADER_LENGTH + CHALLENGE_SIZE + CONFIRM_SIZE)
ACCEPTOR_HANDSHAKE = (_CONNECT, _CONNECT + FRAME_HEADER_LENGTH + RESPONSE_SIZE)


class Caller(Immortal):
    """Sends the server ``count`` messages in one handler: mostly awaited calls, every
    third a fork, every tenth an awaited call the server refuses."""

    class Options:
        count: int = 10

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.refusals: list[str] = []
        self.done = False

    def on_first_start(self) -> None:
        self.me.call_all.fork(self.options.count)

    @rpc
    async def call_all(self, count: int) -> None:
        server = self.proxy("server", HelloServer)
        for i in range(count):
            kind, name = _message(i)
            if kind == "fork":
                server.hello.fork(name)
                continue
            try:
                self.replies.append(await server.hello(name))
            except Refused as exc:
                self.refusals.append(str(exc))
        self.done = True


def _message(i: int) -> tuple[str, str]:
    if i % 10 == 9:
        return "call", "nobody"
    return ("fork", f"fork-{i}") if i % 3 == 2 else ("call", f"call-{i}")


def _expected(count: int) -> tuple[list[str], list[str], dict[str, int]]:
    """Replies, refusals and the server's greetings if every message ran once, in order:
    the server handles the i-th message as its greeting number i + 1."""
    replies, refusals, greeted = [], [], {}
    for i in range(count):
        kind, name = _message(i)
        if name == "nobody":
            refusals.append("no greeting for 'nobody'")
            continue
        greeted[name] = 1
        if kind == "call":
            replies.append(f"Hello, {name}! (greeting #{i + 1})")
    return replies, refusals, greeted


class _Linked:
    """The server and the client, in their own data directories, linked through proxies."""

    def __init__(
        self, server: RunningImmortal, client: RunningImmortal, proxies: dict[str, FaultProxy]
    ) -> None:
        self.server = server
        self.client = client
        self.proxies = proxies  # by the instance each leads to

    def counts(self) -> dict[str, int]:
        total: collections.Counter[str] = collections.Counter(dict.fromkeys(KINDS, 0))
        for proxy in self.proxies.values():
            total.update(proxy.counts())
        return dict(total)

    def log(self, instance: str) -> str:
        running = self.server if instance == "server" else self.client
        return running.ic_log.read_text(errors="replace")

    def report(self) -> str:
        """The end of both coordinators' logs and the faults so far, for failures."""
        parts = [f"faults injected: {self.counts()}"]
        for name in ("server", "client"):
            tail = self.log(name).splitlines()[-25:]
            parts.append(f"--- {name} coordinator log (last lines):\n" + "\n".join(tail))
        return "\n".join(parts)

    def wait(
        self, running: RunningImmortal, predicate: Callable[[dict[str, Any]], bool]
    ) -> dict[str, Any]:
        def holds(state: dict[str, Any]) -> bool:
            for each in (self.server, self.client):  # fail at once, not at the deadline
                if each.ic.poll() is not None:
                    raise AssertionError(
                        f"the {each.instance} coordinator exited ({each.ic.returncode})\n"
                        + self.report()
                    )
            return predicate(state)

        try:
            return running.wait_until(holds, timeout=DEADLINE)
        except (TimeoutError, RuntimeError) as exc:
            raise AssertionError(f"{running.instance}: {exc}\n{self.report()}") from exc


def _write_secret(path: Path) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    return path


@contextmanager
def _linked(
    tmp_path: Path,
    plan: FaultPlan,
    count: int,
    seed: int,
    extra: dict[str, tuple[str, ...]] | None = None,
) -> Iterator[_Linked]:
    """Start the pair: each coordinator links to the other through a proxy with ``plan``
    (``extra``: more coordinator options per instance). Everything stops at the end."""
    secret = _write_secret(tmp_path / "cluster-secret")
    ports = {"server": free_port(), "client": free_port()}
    proxies = {
        name: FaultProxy(("127.0.0.1", port), plan, seed=seed * 2 + (name == "client"))
        for name, port in ports.items()
    }
    options = {}
    for name, other in (("server", "client"), ("client", "server")):
        options[name] = (
            *("--link-port", str(ports[name])),
            *("--link-to", f"{other}=127.0.0.1:{proxies[other].port}"),
            *("--secret-file", str(secret), *TIMEOUTS, *(extra or {}).get(name, ())),
        )

    runners = [
        ImmortalRunner(tmp_path / d, timeout=DEADLINE, coordinator_options=options[name])
        for d, name in (("a", "server"), ("b", "client"))
    ]
    try:
        server = runners[0].start(HelloServer, "server")
        client = runners[1].start(Caller, "client", count=count)
        yield _Linked(server, client, proxies)
    finally:
        for runner in runners:
            runner.close()
        for proxy in proxies.values():
            proxy.close()


def _check_exactly_once(pair: _Linked, count: int) -> None:
    """Every call answered once with the greeting number of its single run (so the
    server ran the messages in order, none twice, none lost), every fork run once."""
    replies, refusals, greeted = _expected(count)
    state = pair.wait(pair.client, lambda s: s["done"])
    assert (state["replies"], state["refusals"]) == (replies, refusals), pair.report()
    server = pair.wait(pair.server, lambda s: s["calls"] >= count)
    assert server["calls"] == count, pair.report()
    assert server["greeted"] == greeted, pair.report()


def _check_log_replays(tmp_path: Path, count: int) -> None:
    """Both logs hold exactly what ran: replayed offline, they give the same states (a
    damaged call or reply that had been logged would show here, or fail to decode)."""
    replies, refusals, greeted = _expected(count)
    server = replay_instance(HelloServer, tmp_path / "a", "server").state
    assert (server["calls"], server["greeted"]) == (count, greeted)
    client = replay_instance(Caller, tmp_path / "b", "client").state
    assert (client["replies"], client["refusals"], client["done"]) == (replies, refusals, True)


# Rejections as the coordinators log them (link from/to ... closed: <why>).
CHECKSUM = "does not match its token and message"
TAG = "fails its tag"
TLS_ERRORS = re.compile(r"closed: .*(SSL|record|decrypt|bad mac)", re.IGNORECASE)


def _closed_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if " closed: " in line]


def _rejections(logs: str) -> dict[str, int]:
    """Why links were closed, numbers masked, most frequent first (printed under -s)."""
    why: collections.Counter[str] = collections.Counter()
    for line in _closed_lines(logs):
        reason = line.split(" closed: ", 1)[1]
        why[re.sub(r"0x[0-9a-f]+|\d+", "N", reason)[:70]] += 1
    return dict(why.most_common())


@pytest.mark.parametrize("seed", [1, 2])
def test_plain_links_stay_exactly_once_under_heavy_faults(tmp_path: Path, seed: int) -> None:
    """Without TLS the flow checksum catches flipped bits and broken framing, and the
    per-frame tags catch whole frames replayed or reordered."""
    with _linked(tmp_path, HEAVY, COUNT, seed) as pair:
        _check_exactly_once(pair, COUNT)
        counts = pair.counts()
        assert all(counts[kind] > 0 for kind in KINDS), pair.report()
        logs = pair.log("server") + pair.log("client")
        assert CHECKSUM in logs, pair.report()
        assert TAG in logs, pair.report()
        print(f"plain, seed {seed}: {COUNT} messages checked; faults {counts}")
        print(f"rejections logged: {_rejections(logs)}")
    _check_log_replays(tmp_path, COUNT)


@needs_openssl
@pytest.mark.parametrize("seed", [1])
def test_tls_links_stay_exactly_once_under_heavy_faults(tmp_path: Path, seed: int) -> None:
    """Over mutual TLS, frames carry no checksum: TLS's record integrity catches every
    flipped, replayed or reordered byte before the flow reader or the tags see it."""
    extra = mutual_tls(tmp_path, ("server", "client"))
    with _linked(tmp_path, HEAVY_TLS, COUNT, seed, extra) as pair:
        _check_exactly_once(pair, COUNT)
        counts = pair.counts()
        assert all(counts[kind] > 0 for kind in KINDS), pair.report()
        logs = pair.log("server") + pair.log("client")
        assert "links use TLS, mutual" in logs
        assert TLS_ERRORS.search(logs), pair.report()
        # TLS let nothing damaged through to the frames and their tags.
        assert CHECKSUM not in logs and TAG not in logs, pair.report()
        print(f"TLS, seed {seed}: {COUNT} messages checked; faults {counts}")
        print(f"rejections logged: {_rejections(logs)}")
    _check_log_replays(tmp_path, COUNT)


@pytest.mark.parametrize(
    ("direction", "window"),
    [("forward", DIALER_HANDSHAKE), ("backward", ACCEPTOR_HANDSHAKE)],
    ids=["challenge-or-confirm", "response"],
)
def test_a_flip_in_the_handshake_is_refused_and_retried_never_accepted(
    tmp_path: Path,
    direction: str,
    window: tuple[int, int],
) -> None:
    """The first connections of each link get one flipped bit somewhere in the handshake
    frames (the dialer's CHALLENGE and CONFIRM, or the acceptor's RESPONSE). Each is
    refused and the link is dialed again; none is ever accepted as a link, and once the
    handshakes are clean the calls go through, exactly once."""
    faulty, count = 3, 20
    flips = Faults(flip_at=window)
    plan = FaultPlan(
        forward=flips if direction == "forward" else Faults(),
        backward=flips if direction == "backward" else Faults(),
        faulty_connections=faulty,
    )
    with _linked(tmp_path, plan, count, seed=7) as pair:
        _check_exactly_once(pair, count)
        for acceptor, proxy in pair.proxies.items():
            records = proxy.records()
            assert len(records) > faulty, pair.report()  # retried after the refusals
            log = pair.log(acceptor)
            for record in records[:faulty]:
                ((where, kind, offset),) = record.faults
                assert (where, kind) == (direction, "flip") and window[0] <= offset < window[1]
                peer = f"127.0.0.1:{record.upstream_port}"
                assert f"({peer}) open" not in log, pair.report()
                assert f"at {peer} closed: " in log, pair.report()
            assert not any(r.faults for r in records[faulty:])
            assert proxy.counts() == {**dict.fromkeys(KINDS, 0), "flip": faulty}
        logs = pair.log("server") + pair.log("client")
        print(f"{direction}: rejections logged: {_rejections(logs)}")
