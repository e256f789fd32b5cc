"""The binding's proof that it was started for this coordinator, not squatted by another process.

The released protocol serves the two binding sockets to whichever local process connects
first, and the first thing the coordinator sends is the service's checkpoint: its whole
state. So before the coordinator sends anything, a connecting binding must show a token
the coordinator made for this start:

* At every start the coordinator draws 32 random bytes and writes them, as 64 hex digits
  and a newline, to ``<data dir>/<instance>.binding-token`` (``ambrosia-py debug``:
  ``<instance>.debug-binding-token``), mode 0600, atomically (a temporary file renamed
  into place), *before* it prints its ready line. Only a process that may read the data
  directory can read it: the user who runs the service.
* A binding sends a 42-byte preamble first on **each** of its two sockets, before any
  AMBROSIA bytes: ``b"AMBPYLB1"`` (8 bytes) | socket (1 byte: 1 the receive socket, where
  the binding writes; 2 the send socket, where it reads) | reserved (1 byte, 0) | the
  token (32 bytes). The AMBROSIA protocol after the preamble is unchanged.
* The coordinator reads exactly those 42 bytes (with a deadline), compares the token with
  :func:`hmac.compare_digest`, and closes a connection whose preamble is wrong, absent or
  late without sending it a byte; its log names the peer and why.

A released AMBROSIA binding (C#, Node) cannot send the preamble: ``--binding-auth none``
turns the check off, and then, as in the released coordinator, every local process that
can connect to the ports is trusted.

This module is the format and the file; :mod:`.binding_link` applies it to sockets.
"""

from __future__ import annotations

import contextlib
import enum
import hmac
import os
import secrets
from pathlib import Path

import attrs

from ..storage.errors import StorageError

__all__ = [
    "MAGIC",
    "PREAMBLE_SIZE",
    "TOKEN_SIZE",
    "BindingAuth",
    "BindingTokenError",
    "Socket",
    "TokenGate",
    "encode_preamble",
    "open_gate",
    "read_token",
    "token_for_ready_line",
    "token_path",
    "write_token",
]

MAGIC = b"AMBPYLB1"
TOKEN_SIZE = 32
PREAMBLE_SIZE = len(MAGIC) + 2 + TOKEN_SIZE  # 42
TOKEN_SUFFIX = ".binding-token"
DEBUG_TOKEN_SUFFIX = ".debug-binding-token"


class BindingAuth(enum.Enum):
    """How the coordinator admits its binding (``--binding-auth``)."""

    TOKEN = "token"  # the default: the preamble with this start's token
    NONE = "none"  # the released protocol: the first local process to connect


class Socket(enum.IntEnum):
    """Which of the two sockets a preamble is sent on (the coordinator's port names)."""

    RECEIVE = 1  # the coordinator's receive port: the binding writes there
    SEND = 2  # the coordinator's send port: the binding reads there


class BindingTokenError(StorageError):
    """A token file that cannot be read or written; the message names the file."""


def token_path(data_dir: Path, instance: str, *, debug: bool = False) -> Path:
    """Where the coordinator of ``instance`` writes its binding token."""
    return data_dir / f"{instance}{DEBUG_TOKEN_SUFFIX if debug else TOKEN_SUFFIX}"


def write_token(path: Path) -> bytes:
    """Draw a fresh token and write it to ``path`` (mode 0600, atomically); return it."""
    token = secrets.token_bytes(TOKEN_SIZE)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.fchmod(fd, 0o600)  # whatever the umask
            os.write(fd, token.hex().encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise BindingTokenError(f"cannot write the binding token {path}: {exc}") from None
    return token


def read_token(path: Path) -> bytes:
    """The token in ``path`` (what :func:`write_token` wrote)."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise BindingTokenError(f"cannot read the binding token {path}: {exc}") from None
    try:
        token = bytes.fromhex(text)
    except ValueError:
        token = b""
    if len(token) != TOKEN_SIZE:
        raise BindingTokenError(
            f"{path} does not hold a binding token ({2 * TOKEN_SIZE} hex digits)"
        )
    return token


def encode_preamble(token: bytes, socket: Socket) -> bytes:
    """The 42 bytes a binding sends first on ``socket``."""
    if len(token) != TOKEN_SIZE:
        raise ValueError(f"a binding token has {TOKEN_SIZE} bytes, not {len(token)}")
    return MAGIC + bytes([socket, 0]) + token


@attrs.frozen
class TokenGate:
    """This start's token, and the check of a preamble against it (sans-IO)."""

    token: bytes = attrs.field(repr=False)
    path: Path

    @classmethod
    def create(cls, path: Path) -> TokenGate:
        return cls(write_token(path), path)

    def refusal(self, preamble: bytes, socket: Socket) -> str | None:
        """Why ``preamble`` (received on ``socket``) is refused, or None if it is good."""
        if len(preamble) < PREAMBLE_SIZE:
            return f"{len(preamble)} bytes instead of the {PREAMBLE_SIZE}-byte preamble"
        if preamble[: len(MAGIC)] != MAGIC:
            return f"no preamble (first bytes {preamble[: len(MAGIC)].hex()})"
        kind, reserved = preamble[len(MAGIC)], preamble[len(MAGIC) + 1]
        if kind != socket or reserved != 0:
            return f"a preamble for socket {kind} (reserved {reserved}) on the {socket.name} socket"
        if not hmac.compare_digest(preamble[len(MAGIC) + 2 : PREAMBLE_SIZE], self.token):
            return f"a wrong token (this start's is in {self.path})"
        return None

    def remove(self) -> None:
        """Delete the token file if it still holds this start's token."""
        with contextlib.suppress(BindingTokenError, OSError):
            if hmac.compare_digest(read_token(self.path), self.token):
                self.path.unlink()


def open_gate(
    data_dir: Path, instance: str, auth: BindingAuth, *, debug: bool = False
) -> TokenGate | None:
    """This start's gate: a fresh token file, or (``none``) no gate and no stale file."""
    path = token_path(data_dir, instance, debug=debug)
    if auth is BindingAuth.NONE:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    return TokenGate.create(path)


def token_for_ready_line(
    fields: dict[str, str], data_dir: Path, instance: str, *, debug: bool = False
) -> bytes | None:
    """The token a binding sends to the coordinator whose ready line had ``fields``.

    ``binding_auth=token``: this start's token, read from its file (read it after the
    ready line: the file is written before it). Anything else: none.
    """
    if fields.get("binding_auth") != BindingAuth.TOKEN.value:
        return None
    return read_token(token_path(data_dir, instance, debug=debug))
