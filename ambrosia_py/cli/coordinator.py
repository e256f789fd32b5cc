"""``ambrosia-py coordinator``: run an Immortal Coordinator in the foreground.

Its options and how it ends (:func:`run_to_exit`) are ``debug``'s too, which runs the
coordinator's debug mode. The links' options (where to accept links, the host published
for them, where other instances' coordinators accept them, the cluster secret, TLS, the
links' limits) are ``run``'s too, which passes them on to the coordinator it starts
(:func:`link_argv`) and gives its ingress the same secret and TLS (:func:`link_settings`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import click

from .. import eventloop
from ..coordinator.core.binding_auth import BindingAuth
from ..coordinator.core.checkpoint import StateFormatError
from ..coordinator.core.config import (
    DEFAULT_LOG_TRIGGER_MB,
    DEFAULT_MAX_PENDING_MB,
    CoordinatorConfig,
    CoordinatorError,
)
from ..coordinator.core.process import run_coordinator
from ..coordinator.links.config import (
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_OUTBOX_MB,
    MAX_OUTBOX_ENV,
    SECRET_ENV,
    LinkSettings,
    LinkSetupError,
)
from ..coordinator.registry.store import RegistryError
from ..coordinator.storage.files import StorageError
from .options import registry_options

__all__ = [
    "binding_auth_option",
    "coordinator",
    "instance_option",
    "link_argv",
    "link_options",
    "link_security_options",
    "link_settings",
    "pop_link_security",
    "port_options",
    "run_to_exit",
    "setup_logging",
]


def setup_logging(instance: str) -> None:
    """Log lines on stderr, each naming the instance."""
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format=f"%(asctime)s ic[{instance}] %(levelname)s %(message)s",
    )


def run_to_exit(main: Coroutine[Any, Any, int]) -> None:
    """Run a coordinator to its end and exit with its status; a refusal it can name (the
    data directory, the registry, a checkpoint, the links' setup) is one line, status 2."""
    try:
        status = eventloop.run(main)
    except (CoordinatorError, StorageError, RegistryError, LinkSetupError, StateFormatError) as exc:
        click.echo(f"ambrosia-py: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:  # start-up on a data directory it cannot use: say which file
        where = f": {exc.filename}" if exc.filename else ""
        click.echo(f"ambrosia-py: {exc.strerror or exc}{where}", err=True)
        sys.exit(2)
    sys.exit(status)


instance_option = click.option("--instance", required=True, help="The instance name.")
_data_dir = click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Where logs and checkpoints live (and the registry, unless --registry says).",
)


def _link_to(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> tuple[tuple[str, str, int], ...]:
    out = []
    for value in values:
        name, eq, address = value.partition("=")
        host, colon, port = address.rpartition(":")
        if not (name and eq and host and colon and port.isdigit() and 0 < int(port) < 65536):
            raise click.BadParameter(f"{value!r} is not NAME=HOST:PORT")
        out.append((name, host.strip("[]"), int(port)))
    return tuple(out)


link_options = [
    click.option(
        "--link-host",
        default="127.0.0.1",
        show_default=True,
        help="Where to accept links from other instances' coordinators (0.0.0.0: everywhere).",
    ),
    click.option(
        "--link-port", type=int, default=0, help="Port for those links (default: any free one)."
    ),
    click.option(
        "--link-to",
        multiple=True,
        callback=_link_to,
        metavar="NAME=HOST:PORT",
        help="Where instance NAME's coordinator accepts links, for instances the registry "
        "does not know (other machines, without a shared --registry). Repeatable.",
    ),
    click.option(
        "--advertise-host",
        metavar="HOST",
        help="The host published in the registry for this instance's link (and ingress) "
        "address: what other machines dial. Default: the listening address, or this "
        "machine's name for a wildcard (0.0.0.0).",
    ),
]


_file = click.Path(dir_okay=False, path_type=Path)
_LINK_DEFAULTS = LinkSettings()
_SECONDS = click.FloatRange(min=0, min_open=True)
_MAX_FRAME_MB = click.FloatRange(min=0.01, max=4095)  # a u32 length, and room for calls

# The links' secret, TLS and limits: (parameter, option, click attributes).
_SECURITY: list[tuple[str, str, dict[str, Any]]] = [
    (
        "secret_file",
        "--secret-file",
        dict(
            type=_file,
            envvar=SECRET_ENV,
            help="The cluster secret links authenticate with (16+ bytes, mode 0600) "
            f"[env {SECRET_ENV}; default: DATA_DIR/link-secret, made on first use].",
        ),
    ),
    (
        "tls_cert",
        "--tls-cert",
        dict(
            type=_file,
            envvar="AMBROSIA_TLS_CERT",
            help="TLS on links: this coordinator's certificate [env AMBROSIA_TLS_CERT].",
        ),
    ),
    (
        "tls_key",
        "--tls-key",
        dict(
            type=_file,
            envvar="AMBROSIA_TLS_KEY",
            help="Its private key (default: in the cert) [env AMBROSIA_TLS_KEY].",
        ),
    ),
    (
        "tls_ca",
        "--tls-ca",
        dict(
            type=_file,
            envvar="AMBROSIA_TLS_CA",
            help="Verify peers' certs against this CA: mutual TLS [env AMBROSIA_TLS_CA].",
        ),
    ),
    (
        "link_max_frame_mb",
        "--link-max-frame-mb",
        dict(
            type=_MAX_FRAME_MB,
            default=100.0,
            show_default=True,
            help="Largest link frame accepted from an authenticated peer.",
        ),
    ),
    (
        "link_handshake_timeout",
        "--link-handshake-timeout",
        dict(
            type=_SECONDS,
            default=DEFAULT_HANDSHAKE_TIMEOUT_S,
            show_default=True,
            help="Seconds a link connection has to authenticate.",
        ),
    ),
    (
        "link_idle_timeout",
        "--link-idle-timeout",
        dict(
            type=_SECONDS,
            default=DEFAULT_IDLE_TIMEOUT_S,
            show_default=True,
            help="Close an accepted link silent this long (senders ping at a third of it).",
        ),
    ),
    (
        "link_max_connections",
        "--link-max-connections",
        dict(
            type=click.IntRange(min=1),
            default=DEFAULT_MAX_CONNECTIONS,
            show_default=True,
            help="Most link connections accepted at once; past it a new one evicts the "
            "oldest not yet authenticated (refused only when all are).",
        ),
    ),
    (
        "link_max_pending_per_source",
        "--link-max-pending-per-source",
        dict(
            type=click.IntRange(min=1),
            default=_LINK_DEFAULTS.max_pending_per_source,
            show_default=True,
            help="Most link connections from one address that are not yet authenticated "
            "(past it that address's oldest is closed).",
        ),
    ),
    (
        "replica",
        "--replica",
        dict(
            type=click.IntRange(min=0),
            help="Run as replica N of the instance (each replica with its own data dir, "
            "normally on its own machine, all in one registry: docs/replication.md).",
        ),
    ),
    (
        "replicas",
        "--replicas",
        dict(
            type=click.IntRange(min=1),
            help="With --replica: how many replicas the instance has, numbered from 0 "
            "[default: 3].",
        ),
    ),
    (
        "replication_ack",
        "--replication-ack",
        dict(
            type=click.IntRange(min=1),
            help="With --replica: a record is committed once durable on this many "
            "replicas, this one counted [default: a majority].",
        ),
    ),
    (
        "replication_port",
        "--replication-port",
        dict(
            type=click.IntRange(min=0, max=65535),
            help="With --replica: where the other replicas reach this one (its host is "
            "--link-host's) [default: any free port].",
        ),
    ),
    (
        "max_outbox_mb",
        "--max-outbox-mb",
        dict(
            type=click.FloatRange(min=0, min_open=True),
            default=DEFAULT_MAX_OUTBOX_MB,
            envvar=MAX_OUTBOX_ENV,
            show_default=True,
            help="Output other instances have not confirmed yet, over all of them, past "
            "which the service waits (its coordinator stops reading it) until they do "
            f"[env {MAX_OUTBOX_ENV}].",
        ),
    ),
]


def link_security_options(f: Any) -> Any:
    """Add the links' secret, TLS and limit options to a command."""
    for param, flag, attrs in reversed(_SECURITY):
        f = click.option(flag, param, **attrs)(f)
    return f


def pop_link_security(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the link security options out of a command's keyword arguments."""
    return {param: kwargs.pop(param) for param, _, _ in _SECURITY if param in kwargs}


def link_settings(**security: Any) -> LinkSettings:
    """The :class:`LinkSettings` the link security options describe."""
    return LinkSettings(
        secret_file=security.get("secret_file"),
        tls_cert=security.get("tls_cert"),
        tls_key=security.get("tls_key"),
        tls_ca=security.get("tls_ca"),
        max_frame_bytes=int(security.get("link_max_frame_mb", 100.0) * 1024 * 1024),
        handshake_timeout_s=security.get("link_handshake_timeout", DEFAULT_HANDSHAKE_TIMEOUT_S),
        idle_timeout_s=security.get("link_idle_timeout", DEFAULT_IDLE_TIMEOUT_S),
        max_connections=security.get("link_max_connections", DEFAULT_MAX_CONNECTIONS),
        max_pending_per_source=security.get(
            "link_max_pending_per_source", _LINK_DEFAULTS.max_pending_per_source
        ),
        # At least a byte: a limit of a few bytes still works (one message at a time).
        max_outbox_bytes=max(
            1, int(security.get("max_outbox_mb", DEFAULT_MAX_OUTBOX_MB) * 1024 * 1024)
        ),
    )


def link_argv(
    link_host: str,
    link_port: int,
    link_to: tuple[tuple[str, str, int], ...],
    advertise_host: str | None = None,
    **security: Any,
) -> list[str]:
    """The link options again, as a command line (``run`` passes them on)."""
    args = ["--link-host", link_host, "--link-port", str(link_port)]
    for name, host, port in link_to:
        args += ["--link-to", f"{name}={host}:{port}"]
    if advertise_host is not None:
        args += ["--advertise-host", advertise_host]
    for param, flag, _ in _SECURITY:
        value = security.get(param)
        if value is not None:
            args += [flag, str(value)]
    return args


port_options = [
    click.option(
        "--receive-port", type=int, help="Port the binding writes to (default: registry)."
    ),
    click.option("--send-port", type=int, help="Port the binding reads from (default: registry)."),
]
binding_auth_option = click.option(
    "--binding-auth",
    type=click.Choice([a.value for a in BindingAuth]),
    default=BindingAuth.TOKEN.value,
    show_default=True,
    help="token: the binding must first show the token this start writes to "
    "DATA_DIR/INSTANCE.binding-token (mode 0600). none: for released AMBROSIA bindings, "
    "which cannot; then every local process that connects first is trusted with the "
    "service's state.",
)


@click.command()
@instance_option
@_data_dir
@click.option("--version", "version", type=int, help="Version to run (a new instance's first).")
@port_options[0]
@port_options[1]
@click.option(
    "--log-trigger-mb",
    type=float,
    default=DEFAULT_LOG_TRIGGER_MB,
    show_default=True,
    envvar="AMBROSIA_LOG_TRIGGER_MB",  # reaches the coordinator that `run` starts
    show_envvar=True,
    help="Roll to a new log file and take a checkpoint when a log passes this size.",
)
@click.option(
    "--max-pending-mb",
    type=click.FloatRange(min=0.0, min_open=True),
    default=DEFAULT_MAX_PENDING_MB,
    show_default=True,
    envvar="AMBROSIA_MAX_PENDING_MB",  # reaches the coordinator that `run` starts
    show_envvar=True,
    help="Stop reading the binding and links while this much input waits for the log (a "
    "message read whole still goes in): bounds the coordinator's memory; TCP slows senders.",
)
@click.option("--upgrade-version", type=int, help="Recover, then upgrade to this version.")
@binding_auth_option
@registry_options
@link_options[0]
@link_options[1]
@link_options[2]
@link_options[3]
@link_security_options
def coordinator(
    instance: str,
    data_dir: Path,
    version: int | None,
    receive_port: int | None,
    send_port: int | None,
    log_trigger_mb: float,
    max_pending_mb: float,
    upgrade_version: int | None,
    binding_auth: str,
    registry: str | None,
    cluster: str,
    link_host: str,
    link_port: int,
    link_to: tuple[tuple[str, str, int], ...],
    advertise_host: str | None,
    **security: Any,
) -> None:
    """Run one Immortal Coordinator in the foreground until its binding leaves."""
    setup_logging(instance)
    config = CoordinatorConfig(
        data_dir=data_dir,
        instance=instance,
        version=version,
        receive_port=receive_port,
        send_port=send_port,
        log_trigger_mb=log_trigger_mb,
        max_pending_mb=max_pending_mb,
        upgrade_version=upgrade_version,
        binding_auth=BindingAuth(binding_auth),
        link_host=link_host,
        link_port=link_port,
        link_to=link_to,
        advertise_host=advertise_host,
        link_settings=link_settings(**security),
        registry=registry,
        cluster=cluster,
        replica=security.get("replica"),
        replicas=security.get("replicas") or 3,
        replication_ack=security.get("replication_ack"),
        replication_port=security.get("replication_port") or 0,
    )
    run_to_exit(run_coordinator(config))
