"""Which registry a process uses, from one spec: :func:`open_registry`.

- ``None``: the SQLite registry in the data dir (``<data dir>/registry.sqlite3``).
- a path: a SQLite registry file elsewhere, so processes with separate data dirs on one
  machine share one registry (and so one port allocation, one view of addresses).
- ``etcd://[USER@]HOST[:PORT][,HOST[:PORT]...][?OPTIONS]``: etcd (v3 API, 3.4+) at those
  endpoints (port 2379 if none is given), in plain HTTP; ``etcds://`` the same over TLS.
  Every key is under ``/<cluster>/``. The options, as query parameters:

  ``ca=PATH``        the CA that signed etcd's certificate (``etcds`` only; default: the
                     system's);
  ``cert=PATH``, ``key=PATH``  a client certificate and its key (``etcds`` only);
  ``password_file=PATH``  the password of USER, its first line (else from
                     ``$AMBROSIA_ETCD_PASSWORD``); a password written in the spec itself
                     is refused, as it would show in process lists and logs;
  ``lease_ttl=SECONDS``  the TTL of the lease this process's addresses live under
                     (default 5; etcd raises it to its minimum if lower);
  ``timeout=SECONDS``  of each request (default 5).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from .interface import DEFAULT_CLUSTER, InstanceRegistry, RegistryError
from .sqlite import SqliteRegistry
from .store import REGISTRY_FILE

if TYPE_CHECKING:
    from .etcd_client import EtcdSettings

__all__ = ["PASSWORD_ENV", "open_registry", "parse_etcd_spec", "registry_file"]

PASSWORD_ENV = "AMBROSIA_ETCD_PASSWORD"
_SCHEMES = {"etcd": "http", "etcds": "https"}
_OPTIONS = ("ca", "cert", "key", "password_file", "lease_ttl", "timeout")
_DEFAULT_PORT = 2379


def open_registry(
    spec: str | Path | None, data_dir: Path, cluster: str = DEFAULT_CLUSTER
) -> InstanceRegistry:
    """The registry ``spec`` names (module docstring), for a process of ``data_dir``;
    ``cluster`` is the etcd prefix (unused by SQLite)."""
    path = registry_file(spec, data_dir)
    if path is None:
        # Imported only for etcd: its HTTP client costs every coordinator that does not
        # use it megabytes of memory.
        from .etcd import EtcdRegistry

        return EtcdRegistry(parse_etcd_spec(str(spec)), cluster)
    if spec is None:
        return SqliteRegistry(data_dir)
    return SqliteRegistry(data_dir, path)


def registry_file(spec: str | Path | None, data_dir: Path) -> Path | None:
    """The SQLite file ``spec`` names (the data dir's own for ``None``), or ``None`` for
    etcd; a :class:`RegistryError` for a spec that is neither. Opens nothing."""
    if spec is None:
        return Path(data_dir) / REGISTRY_FILE
    text = str(spec)
    scheme, sep, _ = text.partition("://")
    if sep and scheme in _SCHEMES:
        return None
    if sep:
        raise RegistryError(
            f"registry {text!r}: unknown scheme {scheme!r} (give a file path, etcd:// or etcds://)"
        )
    path = Path(text).expanduser()
    if path.is_dir():
        raise RegistryError(f"registry {text!r} is a directory: give the registry file's path")
    return path.absolute()


def parse_etcd_spec(spec: str) -> EtcdSettings:
    """The :class:`EtcdSettings` of an ``etcd://`` or ``etcds://`` spec, or a
    :class:`RegistryError` saying what in it is wrong."""
    parts = urlsplit(spec)
    scheme = _SCHEMES.get(parts.scheme)
    if scheme is None:
        raise RegistryError(f"etcd registry {spec!r}: the scheme must be etcd:// or etcds://")
    if parts.path not in ("", "/") or parts.fragment:
        raise RegistryError(f"etcd registry {spec!r}: give only endpoints and ?options")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    if ":" in userinfo:
        raise RegistryError(
            f"etcd registry: no password in the spec (it would show in process lists); "
            f"give password_file= or ${PASSWORD_ENV}"
        )
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if name not in _OPTIONS:
            raise RegistryError(
                f"etcd registry {spec!r}: unknown option {name!r} (known: {', '.join(_OPTIONS)})"
            )
        if name in options:
            raise RegistryError(f"etcd registry {spec!r}: option {name!r} is given twice")
        options[name] = value
    if scheme == "http" and {"ca", "cert", "key"} & set(options):
        raise RegistryError(f"etcd registry {spec!r}: TLS options need etcds://")
    if ("cert" in options) != ("key" in options):
        raise RegistryError(f"etcd registry {spec!r}: give cert= and key= together")
    user = unquote(userinfo) or None
    from .etcd_client import EtcdSettings  # as EtcdRegistry: only for etcd

    return EtcdSettings(
        endpoints=tuple(_endpoint(spec, scheme, host) for host in hosts.split(",")),
        ca_file=options.get("ca"),
        cert_file=options.get("cert"),
        key_file=options.get("key"),
        user=user,
        password=_password(spec, user, options.get("password_file")),
        timeout=_number(spec, options, "timeout", 5.0),
        lease_ttl=int(_number(spec, options, "lease_ttl", 5, whole=True)),
    )


def _endpoint(spec: str, scheme: str, host: str) -> str:
    try:
        parts = urlsplit(f"//{host}")
        port = parts.port or _DEFAULT_PORT
        name = parts.hostname
    except ValueError as exc:
        raise RegistryError(f"etcd registry {spec!r}: endpoint {host!r}: {exc}") from None
    if not name:
        raise RegistryError(f"etcd registry {spec!r}: an endpoint has no host")
    return f"{scheme}://{f'[{name}]' if ':' in name else name}:{port}"


def _number(
    spec: str, options: dict[str, str], name: str, default: float, *, whole: bool = False
) -> float:
    if name not in options:
        return default
    try:
        value = int(options[name]) if whole else float(options[name])
    except ValueError:
        value = 0
    if not value > 0:
        kind = "a whole number of seconds" if whole else "seconds"
        raise RegistryError(f"etcd registry {spec!r}: {name}= must be {kind}, above 0")
    return value


def _password(spec: str, user: str | None, password_file: str | None) -> str | None:
    if user is None:
        if password_file is not None:
            raise RegistryError(f"etcd registry {spec!r}: password_file= needs a USER@")
        return None
    if password_file is not None:
        try:
            lines = Path(password_file).read_text().splitlines()
        except OSError as exc:
            raise RegistryError(
                f"etcd registry: cannot read password_file {password_file}: {exc.strerror}"
            ) from None
        if not lines or not lines[0]:
            raise RegistryError(f"etcd registry: password_file {password_file} is empty")
        return lines[0]
    password = os.environ.get(PASSWORD_ENV)
    if not password:
        raise RegistryError(
            f"etcd registry: user {user!r} needs a password: give password_file= or ${PASSWORD_ENV}"
        )
    return password
