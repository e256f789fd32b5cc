"""A raw link peer for tests: bytes built here from the layouts, not with project code.

Flow framing from shared/reference/flow-transport.md; the handshake and tags from the
layout in docs/security.md (*The link handshake, byte by byte*); the link hello from
coordinator/links/protocol.py. :class:`Peer` dials a coordinator's link endpoint, :class:`Receiver`
stands in for a destination's coordinator.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import socket
import ssl
import struct
import time
from pathlib import Path

import xxhash

from ambrosia_py.coordinator.registry.store import Registry
from tests.fake_binding import frame, unzz, zz

DEADLINE = 30
LINK_TOKEN = struct.pack("<QQ", 0xFFFF_FFFF_FFFF_FFFF, 0x414D_4252)
AUTH_TOKEN = struct.pack("<QQ", 0xFFFF_FFFF_FFFF_FFFF, 0x414D_4241)
PING_TOKEN = struct.pack("<QQ", 0xFFFF_FFFF_FFFF_FFFF, 1)
MAGIC = b"AMBAUTH1"
TAKE_CHECKPOINT, COMMIT, REPLAY_FROM = 2, 3, 4


def connect_packet(port: int = 1, version: int = 0x0FDB00B073000000) -> bytes:
    version |= 0x1000000000000000  # the object-serializer flag, as senders set it
    return struct.pack("<IQHQIH16s", 40, version, port, 7, 0x7F000001, 0, bytes(16))


def flow_frame(message: bytes, token: bytes = LINK_TOKEN, checksum: bool = True) -> bytes:
    if not checksum:  # the TLS form
        return struct.pack("<I", 16 + len(message)) + token + message
    digest = xxhash.xxh3_64_intdigest(token + message)
    return struct.pack("<IQ", 16 + len(message), digest) + token + message


def hello(sender: str, destination: str, incarnation: int = 7) -> bytes:
    """magic | zigzag len | sender | zigzag len | destination | zigzag incarnation"""
    names = b"".join(zz(len(n)) + n.encode() for n in (sender, destination))
    return b"AMBLINK1" + names + zz(incarnation)


def sha(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def secret_of(data_dir: Path) -> bytes:
    """The data directory's own secret, once its coordinator has made it."""
    path = data_dir / "link-secret"
    deadline = time.monotonic() + DEADLINE
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.01)  # polling for the file, with a deadline
    assert path.stat().st_mode & 0o777 == 0o600
    return path.read_bytes()


class Keys:
    """Both directions' keys and counters, from the transcript."""

    def __init__(self, secret: bytes, transcript: bytes, dialer: bool) -> None:
        to_acceptor = mac(secret, b"ambrosia-link-v1 key dialer->acceptor", transcript)
        to_dialer = mac(secret, b"ambrosia-link-v1 key acceptor->dialer", transcript)
        self.send_key, self.receive_key = (
            (to_acceptor, to_dialer) if dialer else (to_dialer, to_acceptor)
        )
        self.sent = self.received = 0

    def seal(self, token: bytes, payload: bytes) -> bytes:
        tag = mac(self.send_key, struct.pack("<Q", self.sent), token, payload)[:16]
        self.sent += 1
        return payload + tag

    def open(self, token: bytes, message: bytes) -> bytes:
        payload, tag = message[:-16], message[-16:]
        expected = mac(self.receive_key, struct.pack("<Q", self.received), token, payload)
        assert tag == expected[:16], "a frame from the coordinator fails its tag"
        self.received += 1
        return payload


class Peer:
    """A raw link peer: one TCP connection to a coordinator's link endpoint."""

    def __init__(
        self,
        data_dir: Path,
        instance: str,
        *,
        address: tuple[str, int] | None = None,
        tls: ssl.SSLContext | None = None,
        sock: socket.socket | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.checksum = tls is None
        self.keys: Keys | None = None
        self._buf = b""
        if sock is not None:
            self.sock = sock
            return
        if address is None:
            deadline = time.monotonic() + DEADLINE
            with Registry(data_dir) as registry:
                while (address := registry.link_address(instance)) is None:
                    assert time.monotonic() < deadline, "the coordinator never published a link"
                    time.sleep(0.01)  # polling the registry, with a deadline
        raw = socket.create_connection(address, timeout=DEADLINE)
        self.sock = tls.wrap_socket(raw) if tls is not None else raw

    def read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the coordinator closed the link")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def read_all(self) -> bytes:
        """Everything until the coordinator closes the connection."""
        out = self._buf
        self._buf = b""
        try:
            while chunk := self.sock.recv(1 << 16):
                out += chunk
        except (ConnectionResetError, ssl.SSLError):
            pass
        return out

    def connect(self) -> None:
        """ConnectPackets: ours, then the coordinator's."""
        self.sock.sendall(connect_packet())
        packet = self.read(44)
        assert struct.unpack_from("<I", packet)[0] == 40
        assert struct.unpack_from("<I", packet, 22)[0] == 0x7F000001  # 01 00 00 7f
        assert struct.unpack_from("<Q", packet, 4)[0] >> 60 == 1  # the object-serializer flag

    def raw_frame(self) -> tuple[bytes, bytes]:
        """The next frame: (token, message), its checksum checked (plain TCP)."""
        if self.checksum:
            length, digest = struct.unpack("<IQ", self.read(12))
            rest = self.read(length)
            assert xxhash.xxh3_64_intdigest(rest) == digest
        else:
            (length,) = struct.unpack("<I", self.read(4))
            rest = self.read(length)
        return rest[:16], rest[16:]

    def send_raw(self, message: bytes, token: bytes = LINK_TOKEN) -> None:
        self.sock.sendall(flow_frame(message, token, self.checksum))

    def authenticate(
        self, sender: str = "client", destination: str = "server", secret: bytes | None = None
    ) -> None:
        """The dialer's side of the handshake: CHALLENGE, RESPONSE checked, CONFIRM."""
        secret = secret if secret is not None else secret_of(self.data_dir)
        nonce = os.urandom(32)
        challenge = MAGIC + b"\x01" + nonce + sha(sender) + sha(destination)
        assert len(challenge) == 105
        self.send_raw(challenge, AUTH_TOKEN)
        token, response = self.raw_frame()
        assert token == AUTH_TOKEN and len(response) == 73 and response[:9] == MAGIC + b"\x02"
        transcript = challenge + response[9:41]
        assert response[41:] == mac(secret, b"ambrosia-link-v1 acceptor", transcript)
        self.send_raw(
            MAGIC + b"\x03" + mac(secret, b"ambrosia-link-v1 dialer", transcript), AUTH_TOKEN
        )
        self.keys = Keys(secret, transcript, dialer=True)

    def open(
        self, sender: str = "client", destination: str = "server", incarnation: int = 7
    ) -> None:
        """ConnectPackets, the handshake with the data directory's secret, the hello."""
        self.connect()
        self.authenticate(sender, destination)
        self.send(hello(sender, destination, incarnation))

    def send(self, payload: bytes, token: bytes = LINK_TOKEN) -> None:
        """A tagged frame (after the handshake)."""
        assert self.keys is not None
        self.send_raw(self.keys.seal(token, payload), token)

    def frame(self) -> bytes:
        """The next link frame's payload, its tag checked; keep-alives skipped."""
        assert self.keys is not None
        while True:
            token, message = self.raw_frame()
            payload = self.keys.open(token, message)
            if token == LINK_TOKEN:
                return payload
            assert token == PING_TOKEN and payload == b"", token

    def messages(self, size: int) -> bytes:
        """Frames until ``size`` bytes of messages have come (a sender batches freely)."""
        got = b""
        while len(got) < size:
            got += self.frame()
        return got

    def control(self) -> tuple[int, int, int]:
        """The next ReplayFrom or Commit: (type, seq, replayable seq)."""
        msg = self.frame()
        size, pos = unzz(msg, 0)
        assert len(msg) == pos + size
        seq, p = unzz(msg, pos + 1)
        replayable, _ = unzz(msg, p)
        return msg[pos], seq, replayable

    def closed_by_peer(self) -> bool:
        try:
            while self.sock.recv(1 << 16):
                pass
        except (ConnectionResetError, ssl.SSLError):
            pass
        return True

    def close(self) -> None:
        self.sock.close()


class Receiver:
    """A listening socket published in the registry as ``instance``'s link address."""

    def __init__(self, data_dir: Path, instance: str) -> None:
        self.data_dir = data_dir
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(DEADLINE)
        with Registry(data_dir) as registry:
            registry.register(instance)
            registry.set_link_address(instance, "127.0.0.1", self.listener.getsockname()[1])

    def accept_raw(self) -> Peer:
        """The next connection, after the ConnectPackets (the dialer's comes first)."""
        sock, _ = self.listener.accept()
        sock.settimeout(DEADLINE)
        peer = Peer(self.data_dir, "", sock=sock)
        packet = peer.read(44)
        assert struct.unpack_from("<I", packet)[0] == 40
        sock.sendall(connect_packet())
        return peer

    def accept(
        self, sender: str, destination: str, replay_from: int, secret: bytes | None = None
    ) -> Peer:
        """The next connection: ConnectPackets, the acceptor's side of the handshake, the
        sender's hello, our ReplayFrom."""
        peer = self.accept_raw()
        secret = secret if secret is not None else secret_of(self.data_dir)
        token, challenge = peer.raw_frame()
        assert token == AUTH_TOKEN and len(challenge) == 105 and challenge[:9] == MAGIC + b"\x01"
        assert challenge[41:73] == sha(sender) and challenge[73:] == sha(destination)
        nonce = os.urandom(32)
        transcript = challenge + nonce
        proof = mac(secret, b"ambrosia-link-v1 acceptor", transcript)
        peer.send_raw(MAGIC + b"\x02" + nonce + proof, AUTH_TOKEN)
        token, confirm = peer.raw_frame()
        assert confirm == MAGIC + b"\x03" + mac(secret, b"ambrosia-link-v1 dialer", transcript)
        peer.keys = Keys(secret, transcript, dialer=False)
        message = peer.frame()
        prefix = hello(sender, destination)[:-1]  # all but our incarnation byte
        assert message.startswith(prefix)
        incarnation, end = unzz(message, len(prefix))
        assert incarnation > 0 and end == len(message)  # the sender's committer id
        peer.send(frame(REPLAY_FROM, zz(replay_from) + zz(replay_from)))
        return peer

    def close(self) -> None:
        self.listener.close()
