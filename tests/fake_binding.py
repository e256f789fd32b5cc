"""A binding that speaks raw bytes to a real coordinator process (no project code here).

Everything is written from the protocol text: ZigZag varints, the 24-byte record header
with XXH64 check bytes, the message framing, and the binding-token preamble (docs/protocol.md,
*The binding's preamble*). Tests use it to assert the exact records a coordinator sends.
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import xxhash

from ambrosia_py.testing import readline_within

HEADER = struct.Struct("<iiQq")
DEADLINE = 30.0
RECEIVE_SOCKET, SEND_SOCKET = 1, 2


def preamble(token: bytes, socket_kind: int) -> bytes:
    """magic "AMBPYLB1" | socket (1 receive, 2 send) | reserved 0 | 32-byte token"""
    assert len(token) == 32
    return b"AMBPYLB1" + bytes([socket_kind, 0]) + token


def token_file(data_dir: Path, instance: str, command: str = "coordinator") -> Path:
    suffix = ".debug-binding-token" if command == "debug" else ".binding-token"
    return data_dir / f"{instance}{suffix}"


def read_token(path: Path) -> bytes:
    """The token a coordinator wrote: 64 hex digits and a newline."""
    text = path.read_text()
    assert len(text) == 65 and text.endswith("\n"), repr(text)
    return bytes.fromhex(text)


def zz(value: int) -> bytes:
    n = (value << 1) ^ (value >> 63)
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def unzz(buf: bytes, pos: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if b < 0x80:
            return (n >> 1) ^ -(n & 1), pos
        shift += 7


def frame(mtype: int, data: bytes = b"") -> bytes:
    return zz(1 + len(data)) + bytes([mtype]) + data


def self_fork(method: int, args: bytes) -> bytes:
    """An outgoing fork RPC to the local instance (destination length 0)."""
    return frame(0, zz(0) + b"\x00" + zz(method) + b"\x01" + args)


def self_impulse(method: int, args: bytes) -> bytes:
    """An outgoing impulse to the local instance: input from the outside world."""
    return frame(0, zz(0) + b"\x00" + zz(method) + b"\x02" + args)


def incoming_impulse(method: int, args: bytes) -> bytes:
    return frame(0, b"\x00" + zz(method) + b"\x02" + args)


def incoming_fork(method: int, args: bytes) -> bytes:
    """What the coordinator logs for a self fork: the destination cut out."""
    return frame(0, b"\x00" + zz(method) + b"\x01" + args)


def checkpoint(blob: bytes) -> bytes:
    return frame(8, zz(len(blob))) + blob


def split_messages(body: bytes) -> list[tuple[int, bytes]]:
    """(type, data) of each framed message in a record body."""
    out = []
    pos = 0
    while pos < len(body):
        size, pos = unzz(body, pos)
        out.append((body[pos], body[pos + 1 : pos + size]))
        pos += size
    return out


@dataclass
class Record:
    committer: int
    seq: int
    body: bytes
    blob: bytes | None = None  # the checkpoint blob following a seq -2 record

    @property
    def messages(self) -> list[tuple[int, bytes]]:
        return split_messages(self.body)


@dataclass
class FakeBinding:
    receive_port: int
    send_port: int
    token: bytes | None = None  # None: no preamble (a coordinator with --binding-auth none)
    to_ic: socket.socket = field(init=False)
    from_ic: socket.socket = field(init=False)
    _buf: bytes = b""

    def connect(self) -> FakeBinding:
        return self.connect_receive().connect_send()

    def connect_receive(self) -> FakeBinding:
        # Receive port first (where we write), then the send port (where we read); the
        # coordinator only listens on the send port once the first connection is in.
        self.to_ic = _connect(self.receive_port)
        if self.token is not None:
            self.to_ic.sendall(preamble(self.token, RECEIVE_SOCKET))
        return self

    def connect_send(self) -> FakeBinding:
        self.from_ic = _connect(self.send_port)
        if self.token is not None:
            self.from_ic.sendall(preamble(self.token, SEND_SOCKET))
        self.from_ic.settimeout(DEADLINE)
        return self

    def send(self, data: bytes) -> None:
        self.to_ic.sendall(data)

    def _read(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = self.from_ic.recv(1 << 20)
            if not chunk:
                raise EOFError(f"coordinator closed the connection ({len(self._buf)} bytes left)")
            self._buf += chunk
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def record(self) -> Record:
        header = self._read(24)
        committer, length, check, seq = HEADER.unpack(header)
        body = self._read(length - 24)
        if seq == -2:
            assert check == 0
        else:
            assert check == xxhash.xxh64_intdigest(body), f"bad check bytes on seq {seq}"
        rec = Record(committer, seq, body)
        for mtype, data in rec.messages:
            if mtype == 8:
                blob_len, _ = unzz(data, 0)
                rec.blob = self._read(blob_len)
        return rec

    def close(self) -> None:
        for name in ("to_ic", "from_ic"):
            if hasattr(self, name):
                getattr(self, name).close()


def ready_token(
    fields: dict[str, str], data_dir: Path, instance: str, command: str = "coordinator"
) -> bytes | None:
    """The token to send, after a ready line with ``fields`` (``binding_auth=token|none``)."""
    if fields.get("binding_auth") != "token":
        return None
    return read_token(token_file(data_dir, instance, command))


def _connect(port: int) -> socket.socket:
    deadline = time.monotonic() + DEADLINE
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=DEADLINE)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.005)  # polling a port that is about to open, with a deadline


@dataclass
class Coordinator:
    proc: subprocess.Popen[str]
    ready: str
    log: IO[bytes]  # its stderr: a file, so a chatty coordinator never fills a pipe

    def stderr(self) -> str:
        """Everything it logged, once it has exited (within the deadline)."""
        self.proc.wait(timeout=DEADLINE)
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def start_coordinator(data_dir: Path, instance: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ambrosia_py.cli",
            "coordinator",
            "--instance",
            instance,
            "--data-dir",
            str(data_dir),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextmanager
def coordinator(
    data_dir: Path,
    instance: str,
    *extra: str,
    command: str = "coordinator",
) -> Iterator[tuple[Coordinator, FakeBinding]]:
    """A real coordinator process and a fake binding attached to it; killed at the end."""
    args = [
        sys.executable,
        "-m",
        "ambrosia_py.cli",
        command,
        "--instance",
        instance,
        "--data-dir",
        str(data_dir),
        *extra,
    ]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        binding: FakeBinding | None = None
        try:
            assert proc.stdout is not None
            line = readline_within(proc.stdout, DEADLINE)
            if not line.startswith("ready"):
                proc.wait(timeout=DEADLINE)
                log.seek(0)
                raise AssertionError(
                    f"no ready line: {line!r} {log.read().decode('utf-8', 'replace')}"
                )
            fields = dict(kv.split("=") for kv in line.split() if "=" in kv)
            binding = FakeBinding(
                int(fields["receive_port"]),
                int(fields["send_port"]),
                ready_token(fields, data_dir, instance, command),
            ).connect()
            yield Coordinator(proc, line, log), binding
        finally:
            if binding is not None:
                binding.close()
            if proc.poll() is None:
                proc.kill()
            proc.wait()
