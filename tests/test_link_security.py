"""Links between coordinators as an attacker sees them:
a raw peer that sends calls with a malicious pickle, a squatter that says hello under
another instance's name, peers that declare huge frames or never finish the handshake;
wrong secrets on either side; TLS with and without a CA.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import ssl
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ambrosia_py.coordinator.links.config import LinkSettings, LinkSetupError, load_secret
from ambrosia_py.coordinator.storage.scan import LogScan
from ambrosia_py.testing import ImmortalRunner
from ambrosia_py.testing.ports import free_port
from tests.fake_binding import (
    FakeBinding,
    checkpoint,
    coordinator,
    frame,
    incoming_fork,
    zz,
)
from tests.link_peer import (
    AUTH_TOKEN,
    COMMIT,
    DEADLINE,
    MAGIC,
    PING_TOKEN,
    REPLAY_FROM,
    Peer,
    Receiver,
    connect_packet,
    flow_frame,
    hello,
    mac,
    sha,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "hello"))

from client import HelloClient
from server import HelloServer


class _Touch:
    """Unpickling this runs a shell command that creates the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def _malicious_fork(marker: Path) -> bytes:
    """A fork to HelloServer.hello whose pickled argument runs ``touch marker``."""
    (method,) = [i for i, s in HelloServer.rpc_methods().items() if s.name == "hello"]
    args = pickle.dumps(((_Touch(marker),), {}))
    return incoming_fork(method, args)


def _logged_bodies(data_dir: Path) -> list[bytes]:
    """Every record body in every log under ``data_dir``, read with the log scanner."""
    bodies = []
    for path in sorted(data_dir.glob("**/serverlog*")):
        scan = LogScan(path, committer_id=None, next_seq=None, last=True, repair=False)
        bodies += [bytes(raw.body) for raw in scan]
    return bodies


def _first_start(binding: FakeBinding) -> None:
    assert binding.record().seq == -1
    binding.send(frame(9, b"init") + checkpoint(b"cp1"))
    assert binding.record().seq == 0


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _write_secret(path: Path, data: bytes | None = None) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data if data is not None else os.urandom(32))
    os.close(fd)
    return path


# --- code execution through the link port ---------------------------------------------


def test_a_raw_peer_with_a_malicious_pickle_gets_nothing_logged_or_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    attack = _malicious_fork(marker)
    runner = ImmortalRunner(tmp_path)
    try:
        server = runner.start(HelloServer, "server")
        # 1. No authentication at all: ConnectPacket, a hello, the call.
        peer = Peer(tmp_path, "server")
        peer.sock.sendall(
            connect_packet() + flow_frame(hello("client", "server")) + flow_frame(attack)
        )
        assert peer.closed_by_peer()
        peer.close()
        # 2. The handshake with a wrong secret: refused at its CONFIRM.
        peer = Peer(tmp_path, "server")
        peer.connect()
        nonce = os.urandom(32)
        challenge = MAGIC + b"\x01" + nonce + sha("client") + sha("server")
        peer.send_raw(challenge, AUTH_TOKEN)
        token, response = peer.raw_frame()
        assert token == AUTH_TOKEN and len(response) == 73
        wrong = os.urandom(32)
        transcript = challenge + response[9:41]
        assert response[41:] != mac(wrong, b"ambrosia-link-v1 acceptor", transcript)
        confirm = MAGIC + b"\x03" + mac(wrong, b"ambrosia-link-v1 dialer", transcript)
        peer.sock.sendall(
            flow_frame(confirm, AUTH_TOKEN)
            + flow_frame(hello("client", "server") + bytes(16))
            + flow_frame(attack + bytes(16))
        )
        assert peer.closed_by_peer()
        peer.close()
        # 3. A frame claiming to come after a handshake that never happened.
        peer = Peer(tmp_path, "server")
        peer.sock.sendall(connect_packet() + flow_frame(attack + bytes(16)))
        assert peer.closed_by_peer()
        peer.close()
        # The service runs on, and nothing of the above was logged or run.
        assert server.state["calls"] == 0
        server.stop()
        assert not any(str(marker).encode() in body for body in _logged_bodies(tmp_path))
        assert not marker.exists()
        log = server.ic_log.read_text()
        assert "link from 'an unknown peer' at 127.0.0.1:" in log
        assert "the dialer's proof does not match" in log
        # Recovery replays the log: still nothing runs.
        server = runner.start(HelloServer, "server")
        assert server.state["calls"] == 0
        assert not marker.exists()
        # The control: a peer holding the secret is inside the trust boundary, and its
        # arguments are unpickled (docs/security.md says so).
        peer = Peer(tmp_path, "server")
        peer.open("client", "server")
        assert peer.control()[0] == REPLAY_FROM
        peer.send(attack)
        assert peer.control() == (COMMIT, 1, 1)
        deadline = time.monotonic() + DEADLINE
        while not marker.exists():
            assert time.monotonic() < deadline, "the trusted call never ran"
            time.sleep(0.01)  # polling for the marker, with a deadline
        peer.close()
    finally:
        runner.close()


# --- squatting --------------------------------------------------------------------------


def test_a_squatter_cannot_lock_an_instance_out(tmp_path: Path) -> None:
    """A peer without the secret says hello first as 'client' with a made-up
    incarnation: refused before its hello is read, so the real client links later."""
    runner = ImmortalRunner(tmp_path)
    try:
        runner.start(HelloServer, "server")
        for incarnation in (99, 12345):
            squatter = Peer(tmp_path, "server")
            squatter.sock.sendall(
                connect_packet() + flow_frame(hello("client", "server", incarnation))
            )
            assert squatter.closed_by_peer()
            squatter.close()
        client = runner.start(HelloClient, "client", count=5)
        state = client.wait_until(lambda s: s["done"])
        assert len(state["replies"]) == 5
    finally:
        runner.close()


# --- memory, timeouts, connection counts ------------------------------------------------


def _sender(sock: socket.socket, data: bytes) -> None:
    with contextlib.suppress(OSError):  # closed by the coordinator meanwhile: as wanted
        sock.sendall(data)


def test_memory_stays_bounded_under_huge_declared_frames(tmp_path: Path) -> None:
    huge = struct.pack("<IQ", 100 * 1024 * 1024, 0) + bytes(16)  # a 100 MiB frame's header
    junk = os.urandom(1 << 20)
    options = ("--link-max-frame-mb", "1", "--link-max-connections", "32")
    with coordinator(tmp_path, "server", *options) as (ic, binding):
        _first_start(binding)
        baseline = _rss_kib(ic.proc.pid)
        peers = []
        # Before authentication: the header is refused as soon as it is read.
        for _ in range(8):
            peer = Peer(tmp_path, "server")
            _sender(peer.sock, connect_packet() + huge + junk)
            peers.append(peer)
        # After it: frames above --link-max-frame-mb are refused the same way.
        for _ in range(4):
            peer = Peer(tmp_path, "server")
            peer.open()
            assert peer.control() == (REPLAY_FROM, 0, 0)
            _sender(peer.sock, huge + junk)
            peers.append(peer)
        for peer in peers:
            assert peer.closed_by_peer()
            peer.close()
        grown = _rss_kib(ic.proc.pid) - baseline
        # Without the limits, each connection buffered up to 100 MiB.
        assert grown < 32 * 1024, f"the coordinator grew by {grown} KiB"
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert "frame length 104857600 exceeds the limit 1024" in log
    assert "frame length 104857600 exceeds the limit 1048576" in log


def test_handshake_and_idle_timeouts_and_the_connection_limit(tmp_path: Path) -> None:
    options = (
        *("--link-handshake-timeout", "0.5", "--link-idle-timeout", "1"),
        *("--link-max-connections", "3"),
    )
    with coordinator(tmp_path, "server", *options) as (ic, binding):
        _first_start(binding)
        silent = Peer(tmp_path, "server")  # never sends a byte
        halfway = Peer(tmp_path, "server")  # a ConnectPacket, then nothing
        halfway.connect()
        idle = Peer(tmp_path, "server")  # authenticated, then silent
        idle.open()
        assert idle.control() == (REPLAY_FROM, 0, 0)
        # The fourth finds every slot taken: the oldest connection that has not
        # authenticated (silent) goes to make room for it (tests/test_flood_admission.py
        # has the rest of the rule).
        extra = Peer(tmp_path, "server")
        for peer in (silent, halfway, extra, idle):
            assert peer.closed_by_peer()
            peer.close()
        # Slots are free again.
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert "no handshake within 0.5 s" in log
    assert "link from 'client' at 127.0.0.1:" in log and "nothing received for 1 s" in log
    assert "all 3 connection slots are taken; the oldest connection that has not proved" in log


def test_a_peer_that_keeps_sending_stays_past_the_idle_timeout_and_is_closed_once_quiet(
    tmp_path: Path,
) -> None:
    """The idle timeout counts from the last frame, not from when the link opened: a
    peer sending a keep-alive every 0.2 s stays for three times the 1 s timeout, and is
    closed about a second after its last one."""
    options = ("--link-handshake-timeout", "2", "--link-idle-timeout", "1")
    with coordinator(tmp_path, "server", *options) as (ic, binding):
        _first_start(binding)
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        for _ in range(15):
            time.sleep(0.2)
            peer.send(b"", PING_TOKEN)
        peer.sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # open, and nothing to read
            peer.sock.recv(1)
        peer.sock.setblocking(True)
        last = time.monotonic()
        assert peer.closed_by_peer()
        assert time.monotonic() - last >= 0.9  # not before the timeout from the last ping
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        assert ic.stderr().count("nothing received for 1 s") == 1


# --- wrong secrets: the acceptor checks the dialer, the dialer the acceptor -----------------


def test_a_listener_without_the_secret_gets_no_output(tmp_path: Path) -> None:
    """The coordinator dials a fake 'server' that does not hold the secret: it sends
    its CONFIRM to nobody, and no call."""
    receiver = Receiver(tmp_path, "server")
    dest = b"server"
    attach = frame(1, dest)  # AttachTo, before the first call (seed 002)
    fork = attach + frame(0, zz(len(dest)) + dest + b"\x00" + zz(5) + b"\x01" + b"secret!")
    try:
        with coordinator(tmp_path, "client") as (ic, binding):
            _first_start(binding)
            binding.send(fork)
            peer = receiver.accept_raw()
            token, challenge = peer.raw_frame()
            assert token == AUTH_TOKEN and len(challenge) == 105
            nonce = os.urandom(32)
            wrong = mac(os.urandom(32), b"ambrosia-link-v1 acceptor", challenge + nonce)
            peer.send_raw(MAGIC + b"\x02" + nonce + wrong, AUTH_TOKEN)
            assert peer.read_all() == b""  # closed, and nothing more came
            peer.close()
            ic.kill()
            assert "the acceptor's proof does not match" in ic.stderr()
    finally:
        receiver.close()


def test_a_receiver_that_confirms_nothing_is_left_and_dialed_again(tmp_path: Path) -> None:
    """A receiver that takes calls and then goes quiet (stopped, or cut off without a
    FIN) is closed after the idle timeout and dialed again; the call is sent again."""
    receiver = Receiver(tmp_path, "server")
    dest = b"server"
    attach = frame(1, dest)  # AttachTo, before the first call (seed 002)
    fork = attach + frame(0, zz(len(dest)) + dest + b"\x00" + zz(5) + b"\x01" + b"again!")
    try:
        with coordinator(tmp_path, "client", "--link-idle-timeout", "1") as (ic, binding):
            _first_start(binding)
            binding.send(fork)
            first = receiver.accept("client", "server", 0)
            sent = first.frame()
            assert sent.endswith(b"again!")
            assert first.closed_by_peer()  # no Commit came: the dialer gave up on it
            first.close()
            second = receiver.accept("client", "server", 0)
            assert second.frame() == sent
            second.close()
            ic.kill()
            assert "'server' confirmed none of the 1 messages sent to it for 1 s" in ic.stderr()
    finally:
        receiver.close()


def test_a_frame_that_stops_mid_way_closes_the_link_well_before_the_idle_timeout(
    tmp_path: Path,
) -> None:
    """A flipped bit in a frame's length (no checksum covers it) leaves the receiver
    waiting for bytes that never come: a frame begun must keep arriving."""
    options = ("--link-handshake-timeout", "0.5", "--link-idle-timeout", "300")
    with coordinator(tmp_path, "server", *options) as (ic, binding):
        _first_start(binding)
        peer = Peer(tmp_path, "server")
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.sock.sendall(struct.pack("<I", 4096) + bytes(8) + b"only part of it")
        assert peer.closed_by_peer()  # within the socket's deadline, far below 300 s
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0
        log = ic.stderr()
    assert "a frame stayed incomplete for 0.5 s with" in log


def test_a_wrong_secret_file_on_one_side_stops_links_not_the_instance(tmp_path: Path) -> None:
    """Two data directories (as on two machines); the client has another secret."""
    secret = _write_secret(tmp_path / "secret")
    other = _write_secret(tmp_path / "other")
    with coordinator(tmp_path / "a", "server", "--secret-file", str(secret)) as (ic, binding):
        _first_start(binding)
        peer = Peer(tmp_path / "a", "server")
        peer.connect()
        with pytest.raises(AssertionError):
            peer.authenticate("client", "server", secret=other.read_bytes())
        peer.close()
        peer = Peer(tmp_path / "a", "server")
        peer.connect()
        peer.authenticate("client", "server", secret=secret.read_bytes())
        peer.send(hello("client", "server"))
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.close()
        assert not (tmp_path / "a" / "link-secret").exists()  # the given one is used
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0


def test_a_secret_file_that_others_can_read_is_refused(tmp_path: Path) -> None:
    secret = _write_secret(tmp_path / "secret")
    secret.chmod(0o644)
    with pytest.raises(LinkSetupError, match="chmod 600"):
        load_secret(LinkSettings(secret_file=secret), tmp_path)
    short = _write_secret(tmp_path / "short", b"x" * 8)
    with pytest.raises(LinkSetupError, match="8 bytes"):
        load_secret(LinkSettings(secret_file=short), tmp_path)
    # The coordinator reads it at start: one line, before it listens for a binding.
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "coordinator",
            "--instance",
            "x",
            "--data-dir",
            str(tmp_path / "d1"),
            "--secret-file",
            str(secret),
        ],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
    )
    assert started.returncode == 2 and started.stdout == "", started
    assert started.stderr.count("\n") == 1 and "chmod 600" in started.stderr
    # The default: made once, 0600, the same for every coordinator of the directory.
    made = load_secret(LinkSettings(), tmp_path / "d2")
    assert len(made) == 32 and load_secret(LinkSettings(), tmp_path / "d2") == made
    assert (tmp_path / "d2" / "link-secret").stat().st_mode & 0o777 == 0o600


# --- TLS ------------------------------------------------------------------------------------


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=DEADLINE)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    key, cert = directory / f"{name}.key", directory / f"{name}.pem"
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2"),
        *("-subj", f"/CN={name}"),
    )
    return cert, key


def _cert(directory: Path, name: str, ca: tuple[Path, Path]) -> tuple[Path, Path]:
    key, csr, cert = (directory / f"{name}{ext}" for ext in (".key", ".csr", ".pem"))
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"),
    )
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1])),
        *("-CAcreateserial", "-out", str(cert), "-days", "2"),
    )
    return cert, key


needs_openssl = pytest.mark.skipif(
    subprocess.run(["which", "openssl"], capture_output=True).returncode != 0,
    reason="the openssl command makes the test certificates",
)


def _client_context(cert: tuple[Path, Path] | None, ca: Path | None) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if ca is not None:
        ctx.load_verify_locations(ca)
        ctx.verify_mode = ssl.CERT_REQUIRED
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


@needs_openssl
def test_tls_without_a_ca_encrypts_and_the_secret_still_authenticates(tmp_path: Path) -> None:
    ca = _ca(tmp_path, "ca")
    cert, key = _cert(tmp_path, "server", ca)
    call = incoming_fork(5, b"over tls")
    tls = ("--tls-cert", str(cert), "--tls-key", str(key))
    with coordinator(tmp_path, "server", *tls) as (ic, binding):
        _first_start(binding)
        peer = Peer(tmp_path, "server", tls=_client_context(None, None))
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.send(call)  # the frame form without the checksum
        assert binding.record().body == call
        assert peer.control() == (COMMIT, 1, 1)
        peer.close()
        # TLS alone lets nobody in: the handshake still wants the secret.
        peer = Peer(tmp_path, "server", tls=_client_context(None, None))
        peer.sock.sendall(connect_packet() + flow_frame(hello("client", "server"), checksum=False))
        assert peer.closed_by_peer()
        peer.close()
        # A plain TCP peer gets nowhere either.
        peer = Peer(tmp_path, "server")
        peer.sock.sendall(connect_packet())
        assert peer.closed_by_peer()
        peer.close()
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0


@needs_openssl
def test_tls_with_a_ca_is_mutual_and_refuses_a_bad_cert(tmp_path: Path) -> None:
    ca = _ca(tmp_path, "ca")
    rogue_ca = _ca(tmp_path, "rogue-ca")
    server = _cert(tmp_path, "server", ca)
    client = _cert(tmp_path, "client", ca)
    rogue = _cert(tmp_path, "rogue", rogue_ca)
    tls = ("--tls-cert", str(server[0]), "--tls-key", str(server[1]), "--tls-ca", str(ca[0]))
    with coordinator(tmp_path, "server", *tls) as (ic, binding):
        _first_start(binding)
        peer = Peer(tmp_path, "server", tls=_client_context(client, ca[0]))
        peer.open()
        assert peer.control() == (REPLAY_FROM, 0, 0)
        peer.close()
        for bad in (_client_context(rogue, ca[0]), _client_context(None, ca[0])):
            # Refused in the TLS handshake (TLS 1.3 reports it on the first read).
            with pytest.raises((ssl.SSLError, ConnectionError, EOFError)):
                peer = Peer(tmp_path, "server", tls=bad)
                peer.connect()
            peer.close()
        # And the coordinator checks the server's side too: a peer trusting only the
        # rogue CA does not accept the coordinator.
        with pytest.raises(ssl.SSLCertVerificationError):
            Peer(tmp_path, "server", tls=_client_context(client, rogue_ca[0]))
        binding.close()
        assert ic.proc.wait(timeout=DEADLINE) == 0


@needs_openssl
def test_hello_across_data_directories_over_mutual_tls(tmp_path: Path) -> None:
    from tests.test_hello_e2e import _run

    ca = _ca(tmp_path, "ca")
    secret = _write_secret(tmp_path / "cluster-secret")
    server_port, client_port = free_port(), free_port()
    args = {}
    for name, port, other, other_port in (
        ("server", server_port, "client", client_port),
        ("client", client_port, "server", server_port),
    ):
        cert, key = _cert(tmp_path, name, ca)
        args[name] = (
            *("--link-port", str(port), "--link-to", f"{other}=127.0.0.1:{other_port}"),
            *("--secret-file", str(secret), "--tls-cert", str(cert), "--tls-key", str(key)),
            *("--tls-ca", str(ca[0])),
        )
    server = _run(tmp_path / "a", "server.py", "server", *args["server"])
    client = _run(tmp_path / "b", "client.py", "client", "--count", "51", *args["client"])
    try:
        client.wait_for_log("done:", DEADLINE)
        (done,) = [line for line in client.output().splitlines() if line.startswith("done:")]
        assert done.rstrip().endswith("(greeting #51)")
    finally:
        client.stop()
        server.stop()
