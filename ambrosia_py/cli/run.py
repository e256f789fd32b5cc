"""``ambrosia-py run SERVICE``: a service and its coordinator, started together.

SERVICE is a file path (``counter.py``, ``counter.py:Counter``) or ``module:Class``; a
file with one Immortal subclass needs no class name. Without ``--separated`` it starts
``ambrosia-py coordinator`` for the instance as a child process (registering the
instance on first use), waits for its ready line, and attaches; with ``--separated``
it attaches to a coordinator already listening on the given ports. The two live and die
together: when either goes away the other stops, and running the same command again
recovers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import click

from .. import eventloop
from ..binding.background_tasks import BackgroundFailure, BackgroundTaskError
from ..binding.client import ServiceFailedError, serve
from ..binding.dispatcher import Dispatcher
from ..binding.files import StateFiles, state_files_dir, use_state_files
from ..binding.immortal import Immortal
from ..binding.loading import load_service
from ..coordinator.core.binding_auth import (
    BindingTokenError,
    read_token,
    token_for_ready_line,
    token_path,
)
from ..coordinator.core.process import coordinator_argv
from ..coordinator.links.config import LinkSetupError, load_secret, tls_contexts
from ..coordinator.registry.port_users import PortTakenError, cannot_listen
from ..coordinator.registry.publish import IngressPublisher, advertised_host
from ..coordinator.storage.data_dir import DataDirError, History, earlier_history, writable_data_dir
from ..hashseed import instance_seed, run_under_seed
from ..ingress.keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS, KeyTable
from ..ingress.server import IngressServer, IngressSettings, parse_address
from ..oneline import OneLineError
from .coordinator import (
    link_argv,
    link_options,
    link_security_options,
    link_settings,
    pop_link_security,
)
from .exits import ExitStatus, coordinator_ended, verbose_option
from .option_help import option_help
from .options import data_dir_option, data_dir_origin, registry_options

__all__ = ["run"]

log = logging.getLogger("ambrosia_py.binding")


class _ServiceCommand(click.Command):
    """``run``: once SERVICE is known, its options become ``--flags`` (and show in --help)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        # The command object is shared by every invocation: start from its own params.
        base = self.__dict__.setdefault("_base_params", list(self.params))
        self.params = list(base)
        takes_value = {
            opt
            for p in self.params
            if isinstance(p, click.Option) and not p.is_flag
            for opt in p.opts
        }
        spec = _service_arg(args, takes_value)
        if spec is not None:
            try:
                service = load_service(spec)
            except click.ClickException:
                service = None  # reported properly when the command runs
            if service is not None:
                known = {p.name for p in self.params}
                options = getattr(service, "Options", None)
                helps = option_help(options) if options is not None else {}
                for name, kind, default in service.option_fields():
                    if name in known:
                        raise click.UsageError(f"service option {name!r} clashes with run's own")
                    self.params.append(
                        click.Option(
                            [f"--{name.replace('_', '-')}", name],
                            type=kind,
                            default=default,
                            show_default=True,
                            help=helps.get(name, f"{service.__name__} option."),
                        )
                    )
        return super().parse_args(ctx, args)


def _service_arg(args: list[str], takes_value: set[str]) -> str | None:
    """The first positional argument: SERVICE."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in takes_value:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def _options(service: type[Immortal], values: dict[str, Any]) -> Any:
    return service.make_options(**{name: values[name] for name, _, _ in service.option_fields()})


def _separated_token(data_dir: Path, instance: str) -> bytes | None:
    """The token of the coordinator already running: its file in the data directory."""
    path = token_path(data_dir, instance)
    if not path.exists():
        log.warning(
            "no binding token at %s: attaching without one (the coordinator must run with "
            "--binding-auth none)",
            path,
        )
        return None
    return read_token(path)


@attrs.frozen
class _Launch:
    """Everything ``run`` starts a service with."""

    service: type[Immortal]
    instance: str
    data_dir: Path
    data_dir_origin: str  # where --data-dir came from, for the start-up line
    separated: bool
    receive_port: int | None
    send_port: int | None
    upgrade_to: type[Immortal] | None
    upgrade_version: int | None
    options: Any
    timeout: float
    links: list[str]
    background_failure: BackgroundFailure
    registry: str | None  # the registry's spec (None: the data dir's own) ...
    cluster: str  # ... and its cluster
    advertise_host: str | None  # the host published for the ingress (None: chosen)


def _say_where(launch: _Launch, history: History | None) -> None:
    """Which data dir, and whether this is the instance's first start: a service run from
    another directory, or with a misspelled --data-dir, must not start from empty state
    unnoticed."""
    where = launch.data_dir.resolve()
    click.echo(f"data dir {where} ({launch.data_dir_origin})", err=True)
    if "--replica" in launch.links:  # its own log, from the others (docs/replication.md)
        replica = launch.links[launch.links.index("--replica") + 1]
        click.echo(
            f"replica {replica} of instance {launch.instance} in {where}: it follows the "
            "primary, or takes the role when the primary is lost",
            err=True,
        )
    elif history is None:
        click.echo(
            f"first start of instance {launch.instance} in {where} (no earlier log found)",
            err=True,
        )
    else:
        click.echo(
            f"instance {launch.instance} recovers from checkpoint {history.checkpoint} "
            f"(version {history.version}) in {where}",
            err=True,
        )


def _ready_line(line: str, coordinator_pid: int) -> str:
    """The coordinator's ready line with both processes' pids, labelled. ``pid=`` (the
    coordinator's, as it prints it) stays last for scripts that read it."""
    fields = [f for f in line.split() if not f.startswith("pid=")]
    return " ".join(
        [
            *fields,
            f"coordinator_pid={coordinator_pid}",
            f"service_pid={os.getpid()}",
            f"pid={coordinator_pid}",
        ]
    )


def _history(launch: _Launch) -> History | None:
    return earlier_history(launch.data_dir, launch.instance, launch.registry, launch.cluster)


async def _run(launch: _Launch, on_primary: Callable[[Dispatcher], None] | None = None) -> int:
    serving = partial(
        serve,
        launch.service,
        launch.instance,
        upgrade_to=launch.upgrade_to,
        options=launch.options,
        timeout=launch.timeout,
        on_primary=on_primary,
        background_failure=launch.background_failure,
        # With or without --ingress: the log may hold calls from a start that had it, and
        # replaying them needs the key table (binding/hooks.py).
        ingress=KeyTable,
    )
    if launch.separated:
        if launch.receive_port is None or launch.send_port is None:
            raise click.UsageError("--separated needs --receive-port and --send-port")
        _say_where(launch, _history(launch))
        await serving(
            launch.receive_port,
            launch.send_port,
            token=_separated_token(launch.data_dir, launch.instance),
        )
        click.echo("the coordinator closed the connection; the service stopped", err=True)
        return ExitStatus.OK
    history = _history(launch)  # before it starts
    args = coordinator_argv(
        launch.instance,
        launch.data_dir,
        *launch.links,
        registry=launch.registry,
        cluster=launch.cluster,
    )
    if launch.receive_port is not None:
        args += ["--receive-port", str(launch.receive_port)]
    if launch.send_port is not None:
        args += ["--send-port", str(launch.send_port)]
    if launch.upgrade_version is not None:
        args += ["--upgrade-version", str(launch.upgrade_version)]
    ic = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    try:
        assert ic.stdout is not None
        line = (await ic.stdout.readline()).decode()
        if not line.startswith("ready"):
            code = await ic.wait()
            if code == ExitStatus.USAGE:  # a refusal: it said why, in one line on stderr
                return code
            raise OneLineError(
                f"the coordinator did not start: {coordinator_ended(ic.pid, code)}",
                status=ExitStatus.COORDINATOR_DIED,
            )
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        click.echo(_ready_line(line, ic.pid), err=True)
        _say_where(launch, history)
        await serving(
            int(fields["receive_port"]),
            int(fields["send_port"]),
            token=token_for_ready_line(fields, launch.data_dir, launch.instance),
        )
        code = await ic.wait()
        if code != 0:  # it did not stop because it was asked to: say what happened, once
            raise OneLineError(coordinator_ended(ic.pid, code), status=ExitStatus.COORDINATOR_DIED)
        return ExitStatus.OK
    finally:
        if ic.returncode is None:
            # The binding's connection is closed by now: the coordinator sees it go, makes
            # what it holds durable and exits. Only if it does not is it signalled.
            try:
                await asyncio.wait_for(asyncio.shield(ic.wait()), 10)
            except (TimeoutError, asyncio.CancelledError):
                ic.terminate()
                await ic.wait()


async def _run_with_ingress(
    ingress: IngressServer | None, main: Callable[..., Awaitable[int]], launch: _Launch
) -> int:
    """``main`` (:func:`_run`), with the ingress bound before anything starts (a port in
    use is one line, naming the instance that holds it if the registry can tell) and
    serving once the immortal is primary, its address in the registry meanwhile (through
    one registry kept open: with etcd, the address lives under its lease). SIGTERM,
    what process managers send to stop a service, stops it as Ctrl-C does: the task is
    cancelled, the coordinator makes what it holds durable and exits, and ``run`` exits 0."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    if ingress is None:
        return await main()
    try:
        host, port = await ingress.bind()
    except OSError as exc:
        taken = PortTakenError("ingress", ingress.settings.host, ingress.settings.port, exc)
        why = cannot_listen(taken, launch.data_dir, instance=launch.instance)
        raise click.ClickException(why) from None
    publisher = IngressPublisher(launch.data_dir, launch.instance, launch.registry, launch.cluster)
    published: list[asyncio.Task[bool]] = []

    def attach(d: Dispatcher) -> None:
        ingress.attach(d)
        click.echo(f"ingress listening on {host}:{port}", err=True)
        # The instance is registered by now (its coordinator is ready).
        shown = advertised_host(host, launch.advertise_host)
        published.append(asyncio.ensure_future(asyncio.to_thread(publisher.publish, shown, port)))

    try:
        return await main(on_primary=attach)
    finally:
        ingress.close()
        if published:
            await asyncio.gather(*published, return_exceptions=True)
        await asyncio.to_thread(publisher.close)
        await _connections_closed()


async def _connections_closed() -> None:
    """Let the connection handlers the ingress just closed see their end and return.

    Left to ``asyncio.run`` they would be cancelled instead, and Python 3.11's stream
    server prints a CancelledError traceback for each (its done callback asks a
    cancelled task for its exception). Bounded: an effect still running is left to be
    cancelled.
    """
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=1.0)


def _ingress(
    address: str | None, keep: int, keep_seconds: float, security: dict[str, Any], data_dir: Path
) -> IngressServer | None:
    """The ingress ``--ingress`` asks for, with the links' secret (made on first use)."""
    if address is None:
        return None
    try:
        host, port = parse_address(address)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--ingress") from None
    try:
        links = link_settings(**security)
        secret = load_secret(links, data_dir)
        tls = tls_contexts(links)  # the ingress takes the links' TLS (docs/ingress.md)
    except LinkSetupError as exc:
        raise click.ClickException(str(exc)) from None
    settings = IngressSettings(host, port, keep_count=keep, keep_seconds=keep_seconds)
    return IngressServer(secret, settings, tls[0] if tls is not None else None)


@click.command(cls=_ServiceCommand)
@click.argument("service_spec", metavar="SERVICE")
@click.option("--instance", help="Instance name (default: the class name, lower case).")
@data_dir_option(
    "Where logs, checkpoints and the registry live; printed on every start. A data dir "
    "with no history for the instance means a first start, from empty state."
)
@click.option(
    "--separated",
    is_flag=True,
    help="Attach to a coordinator already running (proving it with the token it wrote to "
    "DATA_DIR/INSTANCE.binding-token).",
)
@click.option("--receive-port", type=int, help="The coordinator's receive port.")
@click.option("--send-port", type=int, help="The coordinator's send port.")
@click.option(
    "--upgrade-from",
    "upgrade_from",
    metavar="OLD_SERVICE",
    help="Replay with OLD_SERVICE's code, then upgrade to SERVICE (with --upgrade-version).",
)
@click.option("--upgrade-version", type=int, help="The version number to upgrade to.")
@click.option(
    "--connect-timeout",
    type=float,
    default=30.0,
    show_default=True,
    help="Seconds to keep trying the coordinator's ports.",
)
@click.option(
    "--ingress",
    "ingress_address",
    metavar="[HOST:]PORT",
    help="Take calls to the service's @rpc methods from programs (ambrosia_py.client) on "
    "this address (HOST default 127.0.0.1), authenticated with the cluster secret "
    "(--secret-file); docs/ingress.md.",
)
@click.option(
    "--ingress-keep",
    metavar="N",
    type=click.IntRange(min=0),
    default=DEFAULT_KEEP_COUNT,
    show_default=True,
    help="The ingress keeps the outcomes of the last N finished calls by key (0: no limit).",
)
@click.option(
    "--ingress-keep-seconds",
    metavar="S",
    type=click.FloatRange(min=0),
    default=DEFAULT_KEEP_SECONDS,
    show_default=True,
    help="...and none finished more than this many seconds ago, by logged time (0: no "
    "limit). A retry after its key was dropped runs the call again.",
)
@click.option(
    "--background-failure",
    type=click.Choice([f.value for f in BackgroundFailure]),
    default=BackgroundFailure.STOP.value,
    show_default=True,
    help="When a @background task raises (its traceback is logged either way): stop the "
    f"service (exit status {int(ExitStatus.BACKGROUND_TASK_FAILED)}), or restart the task "
    "after a delay that doubles with each failure in a row (0.1 s to 30 s).",
)
@verbose_option
@registry_options
@link_options[0]
@link_options[1]
@link_options[2]
@link_options[3]
@link_security_options
def run(
    service_spec: str,
    instance: str | None,
    data_dir: Path,
    separated: bool,
    receive_port: int | None,
    send_port: int | None,
    upgrade_from: str | None,
    upgrade_version: int | None,
    connect_timeout: float,
    ingress_address: str | None,
    ingress_keep: int,
    ingress_keep_seconds: float,
    background_failure: str,
    registry: str | None,
    cluster: str,
    link_host: str,
    link_port: int,
    link_to: tuple[tuple[str, str, int], ...],
    advertise_host: str | None,
    **service_options: Any,
) -> None:
    """Run an immortal service with its coordinator; run it again to recover.

    The service's own options (its nested ``Options`` class) appear below once SERVICE
    is given: ``ambrosia-py run SERVICE --help``. Exit statuses: 0 stopped, 1 an error
    (said in one line), 2 a wrong command line or a coordinator that refused to start,
    3 a @background task failed, 4 the coordinator was killed or failed, 5 the service
    could not go on (docs/operations.md).
    """
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.INFO,
        format="%(asctime)s binding %(levelname)s %(message)s",
    )
    link_security = pop_link_security(service_options)
    service = load_service(service_spec)
    upgrade_to: type[Immortal] | None = None
    if upgrade_from is not None:
        if upgrade_version is None:
            raise click.UsageError("--upgrade-from needs --upgrade-version")
        upgrade_to, service = service, load_service(upgrade_from)
    instance = instance or service.__name__.lower()
    try:  # before anything writes there: the ingress's secret, sealed state, the coordinator
        writable_data_dir(data_dir)
    except DataDirError as exc:
        raise OneLineError(str(exc), cause=exc.__cause__) from None
    # Sealed state (``files.py``) lives beside the instance's files in the data dir.
    files = StateFiles(state_files_dir(data_dir, instance))
    ingress = _ingress(ingress_address, ingress_keep, ingress_keep_seconds, link_security, data_dir)
    try:  # once the command line is known good: from here on the instance starts
        run_under_seed(instance_seed(data_dir, instance, create=True))
    except ValueError as exc:
        raise OneLineError(str(exc)) from None
    launch = _Launch(
        service,
        instance,
        data_dir,
        data_dir_origin(click.get_current_context()),
        separated,
        receive_port,
        send_port,
        upgrade_to,
        upgrade_version,
        _options(upgrade_to or service, service_options),
        connect_timeout,
        link_argv(link_host, link_port, link_to, advertise_host, **link_security),
        BackgroundFailure(background_failure),
        registry,
        cluster,
        advertise_host,
    )
    try:
        with use_state_files(files):
            status = eventloop.run(_run_with_ingress(ingress, partial(_run, launch), launch))
    except (ConnectionRefusedError, BindingTokenError) as exc:
        raise click.ClickException(str(exc)) from None
    except BackgroundTaskError as exc:  # its traceback is logged already
        raise OneLineError(str(exc), status=ExitStatus.BACKGROUND_TASK_FAILED) from None
    except ServiceFailedError as exc:
        raise OneLineError(str(exc), exc.__cause__, ExitStatus.SERVICE_FAILED) from None
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, SIGTERM
        status = ExitStatus.OK
    sys.exit(status)
