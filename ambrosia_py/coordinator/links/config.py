"""How a coordinator secures its links: the cluster secret, TLS, and the limits.

The secret comes from ``--secret-file`` (or ``AMBROSIA_SECRET_FILE``); without either,
from ``<data-dir>/link-secret``, made on first use: 32 random bytes, mode 0600, created
atomically (written to a private temporary file, then hard-linked into place, which
fails if the name exists), so two coordinators starting at once in one data directory
end up with the same secret. A second machine joins by copying the file. A secret, a
data dir or a TLS key another user owns, or could replace, is refused
(:mod:`..storage.ownership`).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import ssl
import stat
from pathlib import Path

import attrs

from ...flow import PACKET_LIMIT
from ...serving import ConnectionLimits
from ..storage.modes import own_data_dir
from ..storage.ownership import (
    OwnershipError,
    Trusted,
    check_file,
    open_trusted,
)

__all__ = [
    "DEFAULT_HANDSHAKE_TIMEOUT_S",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_OUTBOX_MB",
    "MAX_OUTBOX_ENV",
    "DEFAULT_SECRET_NAME",
    "MIN_SECRET_BYTES",
    "PRE_AUTH_FRAME_LIMIT",
    "SECRET_ENV",
    "LinkSettings",
    "LinkSetupError",
    "load_secret",
    "tls_contexts",
]

SECRET_ENV = "AMBROSIA_SECRET_FILE"
DEFAULT_SECRET_NAME = "link-secret"
SECRET_BYTES = 32
MIN_SECRET_BYTES = 16
MAX_SECRET_BYTES = 4096
# Before the peer has authenticated, a frame may be this long at most (the largest
# handshake message is 105 bytes, plus its 16-byte token); a longer declared length is
# refused as soon as its 4 bytes are read, before anything of the frame is buffered.
PRE_AUTH_FRAME_LIMIT = 1024
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0
DEFAULT_IDLE_TIMEOUT_S = 300.0
DEFAULT_MAX_CONNECTIONS = 128
# Output not yet confirmed by its destinations, over all of them, before the binding waits
# (links.OutboxBudget); docs/security.md, *Outbox limit*.
DEFAULT_MAX_OUTBOX_MB = 256.0
MAX_OUTBOX_ENV = "AMBROSIA_MAX_OUTBOX_MB"
_SHARED = ConnectionLimits()  # every server's defaults (ambrosia_py.serving)


class LinkSetupError(Exception):
    """The link configuration cannot be used (secret file, certificates): start-up stops."""


@attrs.frozen
class LinkSettings:
    """Secret, TLS and limits of a coordinator's links (the command line's link options).

    ``max_frame_bytes`` bounds frames from authenticated peers; ``idle_timeout_s`` closes
    an accepted link that sent nothing for that long (dialers send a keep-alive at a
    third of it); ``max_connections`` bounds accepted link connections (past it a
    newcomer evicts the oldest not yet authenticated, and is refused only when all are);
    ``max_pending_per_source`` bounds those not yet authenticated from one address;
    ``max_outbox_bytes`` bounds the output kept for destinations that have not
    confirmed it (past it the binding is not read until they do).
    """

    secret_file: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    max_frame_bytes: int = PACKET_LIMIT
    handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_outbox_bytes: int = int(DEFAULT_MAX_OUTBOX_MB * 1024 * 1024)
    max_pending_per_source: int = _SHARED.max_pending_per_source  # as every server's

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


def _read_secret(path: Path) -> bytes:
    """The secret in ``path``: a regular file, ours (:mod:`..storage.ownership`, checked on the open
    file), that neither group nor others can read or write."""
    try:
        # Whoever chose the secret can send the service pickles. Not following a link,
        # nor waiting on a FIFO put where the secret should be.
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = open_trusted(path, flags, Trusted.SECRET)
    except OwnershipError as exc:
        raise LinkSetupError(str(exc)) from None
    except OSError as exc:
        raise LinkSetupError(f"link secret {path}: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise LinkSetupError(f"link secret {path} is not a regular file")
        if mode & 0o077:
            raise LinkSetupError(
                f"link secret {path} is readable or writable by others (mode "
                f"{stat.S_IMODE(mode):04o}); chmod 600 it"
            )
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if not MIN_SECRET_BYTES <= len(data) <= MAX_SECRET_BYTES:
        raise LinkSetupError(
            f"link secret {path} has {len(data)} bytes; it needs {MIN_SECRET_BYTES} to "
            f"{MAX_SECRET_BYTES} (e.g. head -c 32 /dev/urandom)"
        )
    return data


def _create_secret(path: Path) -> None:
    """Make ``path`` hold 32 fresh random bytes, unless it exists already."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secrets.token_bytes(SECRET_BYTES))
        os.fsync(fd)
        os.close(fd)
        try:
            os.link(tmp, path)  # atomic, and never replaces a secret made meanwhile
        except FileExistsError:
            pass
        else:
            dir_fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def load_secret(settings: LinkSettings, data_dir: Path) -> bytes:
    """The cluster secret: the given file's, ``$AMBROSIA_SECRET_FILE``'s, or the data
    directory's own (made on first use)."""
    path = settings.secret_file
    if path is None and os.environ.get(SECRET_ENV):
        path = Path(os.environ[SECRET_ENV])
    if path is not None:
        return _read_secret(path)
    path = data_dir / DEFAULT_SECRET_NAME
    try:
        own_data_dir(data_dir)  # before a secret of ours is made in another user's dir
        if not path.exists():
            _create_secret(path)
    except OwnershipError as exc:
        raise LinkSetupError(str(exc)) from None
    except OSError as exc:
        raise LinkSetupError(f"cannot create the link secret {path}: {exc.strerror}") from None
    return _read_secret(path)


def tls_contexts(settings: LinkSettings) -> tuple[ssl.SSLContext, ssl.SSLContext] | None:
    """(server, client) TLS contexts for links, or None without ``--tls-cert``.

    Both sides present their certificate. With a CA, each verifies the other's chain
    against it (mutual authentication; host names are not checked: coordinators are
    found by instance name, and the link handshake checks who the peer is). Without a
    CA, TLS only encrypts; the secret handshake still authenticates the peer.
    """
    if settings.tls_cert is None and settings.tls_key is None and settings.tls_ca is None:
        return None
    if settings.tls_cert is None:
        raise LinkSetupError("--tls-key and --tls-ca need --tls-cert")
    try:  # the key proves who we are: not one another user could have put there
        check_file(settings.tls_key or settings.tls_cert, Trusted.TLS_KEY)
    except OwnershipError as exc:
        raise LinkSetupError(str(exc)) from None
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
            if settings.tls_ca is not None:
                ctx.load_verify_locations(settings.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise LinkSetupError(
                f"TLS certificate {settings.tls_cert} / key {settings.tls_key} / CA "
                f"{settings.tls_ca}: {exc}"
            ) from None
        ctx.verify_mode = ssl.CERT_REQUIRED if settings.tls_ca is not None else ssl.CERT_NONE
    return server, client
