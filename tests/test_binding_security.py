"""Spoofed replies and squatted sockets: replies are checked against calls; the binding
sockets are served only to the binding started for this coordinator.

Spoofed replies are fed to the dispatcher sans-IO (records in, messages out), and once
through a real coordinator and a raw link peer. The binding sockets are probed with raw
sockets against a real coordinator process.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import pickle
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from ambrosia_py import Immortal, rpc
from ambrosia_py.binding import Dispatcher, RemoteError, UnknownMethodError
from ambrosia_py.binding import codec as binding_codec
from ambrosia_py.binding.checkpoint import decode_snapshot
from ambrosia_py.coordinator.core.binding_auth import Socket, TokenGate, encode_preamble
from ambrosia_py.coordinator.core.binding_link import MAX_UNPROVEN, Listener
from ambrosia_py.coordinator.core.intake import Intake
from ambrosia_py.coordinator.links.protocol import LinkError
from ambrosia_py.testing import readline_within
from ambrosia_py.testing.ports import free_port
from ambrosia_py.testing.runner import ImmortalRunner, RunningImmortal
from ambrosia_py.wire import (
    Checkpoint,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    LogRecord,
    Message,
    OutgoingReturnValue,
    OutgoingRpc,
    ReturnType,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    encode_message,
)
from tests.fake_binding import (
    DEADLINE,
    RECEIVE_SOCKET,
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    preamble,
    read_token,
    self_fork,
    start_coordinator,
    token_file,
)

P = pickle.HIGHEST_PROTOCOL


class Marker:
    """A pickle that creates a file when it is loaded: the proof of code execution."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return open, (str(self.path), "w")


class Server(Immortal):
    @rpc(codec="json")
    def answer(self, x: int) -> int:
        return x + 1


class JsonWaiter(Immortal):
    """A json-only service that awaits one call to ``server`` per ``ask``."""

    def __init__(self) -> None:
        self.got: list[object] = []
        self.errors: list[str] = []

    @rpc(codec="json")
    async def ask(self, x: int) -> None:
        try:
            y = await self.proxy("server", Server).answer(x)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        else:
            self.got.append(y)


def rec(seq: int, *messages: Message) -> LogRecord:
    return LogRecord(1, seq, messages)


def started(cls: type[Immortal] = JsonWaiter, instance: str = "waiter") -> Dispatcher:
    d = Dispatcher(cls, instance)
    d.handle(rec(-1, TakeBecomingPrimaryCheckpoint()))
    d.handle(rec(0, InitialMessage(b"")))
    return d


def ask(x: int) -> IncomingRpc:
    spec = JsonWaiter.rpc_methods_by_name()["ask"]
    return IncomingRpc(spec.id, RpcType.FORK, json.dumps({"x": x}).encode())


def returned(sender: str, call_seq: int, kind: ReturnType, value: bytes) -> IncomingReturnValue:
    return IncomingReturnValue(kind, sender, call_seq, value)


def evil(marker: Path) -> bytes:
    return pickle.dumps(Marker(marker), protocol=P)


def spoofs(marker: Path) -> list[IncomingReturnValue]:
    """Replies nobody may take: a sender never called, and a call nothing awaits."""
    return [
        returned("mallory", 1, ReturnType.EXCEPTION, evil(marker)),
        returned("mallory", 1, ReturnType.VALUE, b"666"),
        returned("server", 99, ReturnType.EXCEPTION, evil(marker)),
        returned("server", 99, ReturnType.VALUE, b"666"),
        returned("waiter", 1, ReturnType.EXCEPTION, evil(marker)),  # not a self-call
    ]


def test_the_marker_pickle_does_run_when_loaded(tmp_path: Path) -> None:
    """The probe itself: loading it creates the file (so its absence below means something)."""
    marker = tmp_path / "ran"
    pickle.loads(evil(marker)).close()
    assert marker.exists()


def test_spoofed_replies_are_dropped_logged_and_never_decoded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "ran"
    d = started()
    (_attach, call) = d.handle(rec(1, ask(41)))
    assert isinstance(call, OutgoingRpc) and (call.destination, call.call_seq) == ("server", 1)
    caplog.set_level(logging.WARNING, "ambrosia_py.binding")
    for i, spoof in enumerate(spoofs(marker)):
        assert d.handle(rec(2 + i, spoof)) == []
    assert not marker.exists()
    assert isinstance(d.immortal, JsonWaiter)
    assert (d.immortal.got, d.immortal.errors) == ([], [])
    dropped = [r.getMessage() for r in caplog.records if "dropped a return value" in r.message]
    assert len(dropped) == 5
    assert "from 'mallory' for call 1 in record 2: call 1 went to 'server'" in dropped[0]
    assert "from 'server' for call 99 in record 4: no handler awaits call 99" in dropped[2]
    assert "EXCEPTION" in dropped[0] and "not decoded" in dropped[0]
    # The real reply still resumes the caller.
    assert d.handle(rec(7, returned("server", 1, ReturnType.VALUE, b"42"))) == []
    assert d.immortal.got == [42]


def test_a_json_method_never_unpickles_an_exception(tmp_path: Path) -> None:
    """Even from the right sender for the waiting call: json methods decode json only."""
    marker = tmp_path / "ran"
    d = started()
    d.handle(rec(1, ask(1)))
    d.handle(rec(2, returned("server", 1, ReturnType.EXCEPTION, evil(marker))))
    assert not marker.exists()
    d.handle(rec(3, ask(2)))
    err = json.dumps({"error": "ValueError", "message": "no such x"}).encode()
    d.handle(rec(4, returned("server", 2, ReturnType.EXCEPTION, err)))
    assert isinstance(d.immortal, JsonWaiter)
    assert d.immortal.errors[0].startswith("RemoteError: an exception that is not the json form")
    assert d.immortal.errors[1] == "RemoteError: ValueError: no such x"


def test_the_same_replies_are_dropped_in_replay_and_from_a_checkpoint_tail(
    tmp_path: Path,
) -> None:
    """The check reads only state built from logged input: live, replayed from the start,
    and restored from a checkpoint taken while the handler waits, it drops the same
    replies and takes the same one."""
    marker = tmp_path / "ran"
    records = [rec(1, ask(41)), rec(2, ask(7))]
    records += [rec(3 + i, s) for i, s in enumerate(spoofs(marker))]
    real = returned("server", 1, ReturnType.VALUE, b"42")
    late = [rec(8, real), rec(9, returned("server", 2, ReturnType.VALUE, b"8"))]

    live = started()
    outputs = [live.handle(r) for r in records]
    (cp,) = live.handle(rec(-1, TakeCheckpoint()))
    assert isinstance(cp, Checkpoint)
    outputs += [live.handle(r) for r in late]

    replayed = started()
    assert [replayed.handle(r) for r in records + late] == outputs

    restored = Dispatcher(JsonWaiter, "waiter")
    assert restored.handle(rec(-2, Checkpoint(cp.blob))) == []
    for r in late:
        restored.handle(r)
    assert not marker.exists()
    for d in (live, replayed, restored):
        assert isinstance(d.immortal, JsonWaiter)
        assert (d.immortal.got, d.immortal.errors) == ([42, 8], [])
    # Dropped replies changed nothing, so the checkpoint's tail does not keep them.
    assert len(decode_snapshot(cp.blob).tail) == 2


def test_a_self_call_is_answered_only_by_the_instance_itself() -> None:
    class Selfish(Immortal):
        def __init__(self) -> None:
            self.got: list[int] = []

        @rpc
        def double(self, x: int) -> int:
            return 2 * x

        @rpc
        async def relay(self, x: int) -> None:
            self.got.append(await self.me.double(x))

    d = started(Selfish, "selfish")
    spec = Selfish.rpc_methods_by_name()["relay"]
    d.handle(rec(1, IncomingRpc(spec.id, RpcType.FORK, pickle.dumps(((3,), {}), protocol=P))))
    six = pickle.dumps(6, protocol=P)
    d.handle(rec(2, returned("other", 1, ReturnType.VALUE, pickle.dumps(99, protocol=P))))
    d.handle(rec(3, returned("selfish", 1, ReturnType.VALUE, six)))
    assert isinstance(d.immortal, Selfish) and d.immortal.got == [6]


def test_exceptions_travel_in_the_method_codec() -> None:
    boom = ValueError("boom")
    as_json = binding_codec.encode_exception("json", boom)
    assert json.loads(as_json) == {"error": "ValueError", "message": "boom"}
    back = binding_codec.decode_exception("json", as_json)
    assert isinstance(back, RemoteError) and str(back) == "ValueError: boom"
    # A pickle method's caller takes both forms; the binding's own errors come back as such.
    unknown = binding_codec.encode_exception("json", UnknownMethodError("no method 5"))
    back = binding_codec.decode_exception("pickle", unknown)
    assert type(back) is UnknownMethodError and str(back) == "no method 5"
    pickled = binding_codec.decode_exception(
        "pickle", binding_codec.encode_exception("pickle", boom)
    )
    assert type(pickled) is ValueError and str(pickled) == "boom"
    for bad in (b"[1]", b'{"error": 1}', b"\x80garbage"):
        assert isinstance(binding_codec.decode_exception("json", bad), RemoteError)


def test_an_unknown_method_is_answered_in_json_which_any_caller_reads() -> None:
    d = started()
    out = d.handle(rec(1, IncomingRpc(12345, RpcType.ASYNC_AWAIT, b"{}", "caller", 3)))
    (reply,) = out
    assert isinstance(reply, OutgoingReturnValue)
    assert (reply.destination, reply.return_type, reply.call_seq) == (
        "caller",
        ReturnType.EXCEPTION,
        3,
    )
    assert json.loads(bytes(reply.value))["error"] == "UnknownMethodError"


# -- replies end to end: a real coordinator per instance, links between them ------------


def test_spoofed_replies_through_real_coordinators_are_dropped_live_and_in_recovery(
    ambrosia: ImmortalRunner, caplog: pytest.LogCaptureFixture
) -> None:
    """``mallory``, a member of the cluster, sends the waiting ``waiter`` an exception
    whose pickle would create a file, and values, for the call it made to ``server``
    and for a call it never made. They are logged (they came in on a link) but dropped
    undecoded, live and again when the waiter recovers; ``server``'s reply resumes it."""
    caplog.set_level(logging.WARNING, "ambrosia_py.binding")
    marker = ambrosia.data_dir.parent / "ran"
    waiter = ambrosia.start(AskingWaiter, "waiter")
    waiter.impulse.ask(41)
    waiter.wait_until(lambda s: s["asked"] == [41])
    mallory = ambrosia.start(Mallory, "mallory")
    for spoof in (
        OutgoingReturnValue("waiter", ReturnType.EXCEPTION, "mallory", 1, evil(marker)),
        OutgoingReturnValue("waiter", ReturnType.VALUE, "mallory", 1, b"666"),
        OutgoingReturnValue("waiter", ReturnType.EXCEPTION, "mallory", 99, evil(marker)),
    ):
        mallory._in_loop(functools.partial(_send, mallory, spoof))
    wait_for(lambda: len(drops(caplog)) == 3, "three dropped replies")
    ambrosia.start(Server, "server")
    waiter.wait_until(lambda s: s["got"] == [42])
    assert not marker.exists()
    assert "from 'mallory' for call 1" in drops(caplog)[0]

    waiter.kill()
    again = ambrosia.start(AskingWaiter, "waiter")
    assert again.wait_until(lambda s: s["got"] == [42])["errors"] == []
    assert len(drops(caplog)) == 6  # the same three, dropped again in replay
    assert not marker.exists()


class AskingWaiter(JsonWaiter):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[int] = []

    @rpc(codec="json")
    async def ask(self, x: int) -> None:
        self.asked.append(x)
        await JsonWaiter.ask(self, x)


class Mallory(Immortal):
    @rpc(codec="json")
    def nothing(self) -> None: ...


def _send(running: RunningImmortal, msg: Message) -> None:
    assert running.dispatcher.live_send is not None
    running.dispatcher.live_send(msg)


def drops(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "dropped a return value" in r.message]


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.01)  # polling a condition, with a deadline


def test_a_link_message_naming_another_sender_is_refused_whole() -> None:
    """The coordinator makes the sender a reply names true: the link's own peer."""
    intake = Intake("waiter")
    ok = encode_message(IncomingReturnValue(ReturnType.VALUE, "server", 1, b"1"))
    for lie in (
        IncomingReturnValue(ReturnType.EXCEPTION, "server", 1, b"x"),
        IncomingRpc(5, RpcType.ASYNC_AWAIT, b"{}", "server", 3),
    ):
        with pytest.raises(LinkError, match="on 'mallory''s link names sender 'server'"):
            intake.link_input("mallory", encode_message(lie))
    assert intake.link_input("server", ok) == 1
    assert intake.link_input("mallory", encode_message(IncomingRpc(5, RpcType.FORK, b"{}"))) == 1


# -- the binding sockets -------------------------------------------------------------------


def start_ic(
    data_dir: Path, instance: str, *extra: str
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    proc = start_coordinator(data_dir, instance, *extra)
    assert proc.stdout is not None
    line = readline_within(proc.stdout, DEADLINE)
    assert line.startswith("ready"), line
    return proc, dict(kv.split("=") for kv in line.split() if "=" in kv)


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    proc.wait(DEADLINE)
    assert proc.stderr is not None
    return proc.stderr.read()


def gets_nothing(sock: socket.socket, seconds: float = 0.5) -> bool:
    """Nothing arrives within ``seconds`` (a read with a deadline, not a sleep)."""
    sock.settimeout(seconds)
    try:
        sock.recv(1)  # a byte, or the end: either is something
    except TimeoutError:
        return True
    return False


def closed_without_a_byte(sock: socket.socket) -> bool:
    sock.settimeout(DEADLINE)
    try:
        return sock.recv(1 << 16) == b""
    except ConnectionResetError:
        return True


def test_a_squatter_gets_nothing_and_the_real_binding_recovers(tmp_path: Path) -> None:
    # History: a first start whose checkpoint is the state a squatter would want.
    with coordinator(tmp_path, "svc") as (ic, binding):
        assert binding.record().seq == -1
        binding.send(frame(9, b"init") + checkpoint(b"the whole state"))
        assert binding.record().seq == 0
        binding.send(self_fork(3, b"{}"))
        assert binding.record().seq == 1
        binding.close()
        assert ic.proc.wait(DEADLINE) == 0

    proc, fields = start_ic(tmp_path, "svc")
    try:
        receive, send = int(fields["receive_port"]), int(fields["send_port"])
        silent = socket.create_connection(("127.0.0.1", receive), timeout=DEADLINE)
        assert gets_nothing(silent)
        wrong = socket.create_connection(("127.0.0.1", receive), timeout=DEADLINE)
        wrong.sendall(preamble(bytes(32), RECEIVE_SOCKET))
        assert closed_without_a_byte(wrong)
        garbage = socket.create_connection(("127.0.0.1", receive), timeout=DEADLINE)
        garbage.sendall(bytes(42))
        assert closed_without_a_byte(garbage)

        token = read_token(token_file(tmp_path, "svc"))
        real = FakeBinding(receive, send, token).connect_receive()
        assert closed_without_a_byte(silent)  # the real binding proved it: nobody else
        # The send port opens now; a squatter there gets nothing either.
        squatter = _connect_when_listening(send)
        assert gets_nothing(squatter)
        real.connect_send()
        rec = real.record()
        assert (rec.seq, rec.blob) == (-2, b"the whole state")
        assert [real.record().seq for _ in range(3)] == [0, 1, -1]  # then become primary
        real.send(checkpoint(b"the whole state"))
        assert closed_without_a_byte(squatter)
        real.close()
        assert proc.wait(DEADLINE) == 0
    finally:
        log = stop(proc)
    assert "a wrong token" in log and "no preamble (first bytes 0000" in log
    assert "another connection proved the token first" in log
    assert log.count("refusing a binding connection from ('127.0.0.1'") == 4
    for s in (silent, wrong, garbage, squatter):
        s.close()


def test_the_token_file_is_0600_and_gone_once_the_binding_attached(tmp_path: Path) -> None:
    proc, fields = start_ic(tmp_path, "svc")
    try:
        assert fields["binding_auth"] == "token"
        path = token_file(tmp_path, "svc")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        token = read_token(path)
        binding = FakeBinding(int(fields["receive_port"]), int(fields["send_port"]), token)
        binding.connect()
        assert binding.record().seq == -1
        assert not path.exists()
        binding.close()
    finally:
        stop(proc)


def test_binding_auth_none_accepts_a_binding_without_a_token(tmp_path: Path) -> None:
    stale = token_file(tmp_path, "svc")
    stale.write_text("00" * 32 + "\n")
    with coordinator(tmp_path, "svc", "--binding-auth", "none") as (ic, binding):
        assert "binding_auth=none" in ic.ready and binding.token is None
        assert not stale.exists()  # nobody should send an earlier start's token
        assert binding.record().seq == -1
        binding.send(frame(9, b"init") + checkpoint(b"cp"))
        assert binding.record().seq == 0


def _connect_when_listening(port: int) -> socket.socket:
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"port {port} never opened"
            time.sleep(0.005)  # polling a port that is about to open, with a deadline


EXAMPLE = str(Path(__file__).resolve().parent.parent / "examples" / "counter.py")


def run_separated(data_dir: Path, fields: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "run",
            EXAMPLE,
            "--separated",
            "--data-dir",
            str(data_dir),
            "--receive-port",
            fields["receive_port"],
            "--send-port",
            fields["send_port"],
            "--ingress",
            "127.0.0.1:0",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_run_separated_proves_itself_with_the_token_file(tmp_path: Path) -> None:
    proc, fields = start_ic(tmp_path, "counter")
    service = run_separated(tmp_path, fields)
    try:
        assert service.stderr is not None
        while "ingress listening on" not in (line := readline_within(service.stderr, DEADLINE)):
            assert line, "the service never became primary"  # its end, or the deadline
        proc.terminate()  # the coordinator stops; the binding goes with it
        assert proc.wait(DEADLINE) == 0 and service.wait(DEADLINE) == 0
    finally:
        service.kill()
        service.wait(DEADLINE)
        stop(proc)


def test_run_separated_without_the_token_is_refused(tmp_path: Path) -> None:
    """The coordinator closes the receive connection once the preamble is late, and the
    binding says it was refused, not that nobody listens."""
    proc, fields = start_ic(tmp_path, "counter")
    token_file(tmp_path, "counter").unlink()  # as for a process that cannot read it
    service = run_separated(tmp_path, fields)
    try:
        _, err = service.communicate(timeout=DEADLINE)
        assert service.returncode == 1
        assert "no binding token at" in err and "it refused this binding" in err
    finally:
        service.kill()
        log = stop(proc)
    assert "refusing a binding connection" in log and "no preamble" in log


def test_silent_connections_cannot_keep_the_binding_out(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """More silent connections than may prove a token at once: the oldest are evicted,
    so the binding connecting after them still gets in (evicting one more); all of them
    get nothing."""
    caplog.set_level(logging.WARNING, "ambrosia_py.coordinator")

    async def main() -> None:
        gate = TokenGate.create(tmp_path / "t.binding-token")
        listener = Listener("receive", Socket.RECEIVE, gate)
        port = free_port()
        await listener.listen("127.0.0.1", port)
        try:
            silent = [
                await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_UNPROVEN + 4)
            ]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(encode_preamble(gate.token, Socket.RECEIVE))
            conn = await asyncio.wait_for(listener.accept(), DEADLINE)
            for reader, w in silent:
                assert await asyncio.wait_for(reader.read(), DEADLINE) == b""
                w.close()
            conn.close()
            writer.close()
        finally:
            listener.close()

    asyncio.run(main())
    # Twenty refusals from one address: the first five in full (the evictions, which come
    # first), the other fifteen counted in one line when the listener closes.
    refusals = [r.getMessage() for r in caplog.records if "refusing" in r.message]
    assert sum("newer connections came to prove a token" in m for m in refusals) == 5
    assert len(refusals) == 5, refusals
    summaries = [r.getMessage() for r in caplog.records if " more binding connections" in r.message]
    assert len(summaries) == 1 and summaries[0].startswith(
        "15 more binding connections refused on the receive port from 127.0.0.1 in the last"
    ), summaries
