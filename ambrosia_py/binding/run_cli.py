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
import importlib
import importlib.util
import inspect
import logging
import os
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import click

from ..coordinator.binding_auth import (
    BindingTokenError,
    read_token,
    token_for_ready_line,
    token_path,
)
from ..coordinator.ic_cli import (
    coordinator_argv,
    link_argv,
    link_options,
    link_security_options,
    link_settings,
    pop_link_security,
)
from ..coordinator.link_config import LinkSetupError, load_secret
from ..ingress.keys import DEFAULT_KEEP_COUNT, DEFAULT_KEEP_SECONDS
from ..ingress.server import IngressServer, IngressSettings, parse_address
from .client import serve
from .dispatcher import Dispatcher
from .errors import BindingError
from .files import StateFiles, state_files_dir, use_state_files
from .immortal import Immortal

__all__ = ["load_service", "replay", "run"]

log = logging.getLogger("ambrosia_py.binding")


_loaded_files: dict[str, Path] = {}  # module name -> the service file loaded under it


def load_service(spec: str) -> type[Immortal]:
    """The Immortal subclass named by ``spec`` (see the module docstring)."""
    target, _, class_name = spec.partition(":")
    if target.endswith(".py") or Path(target).is_file():
        path = Path(target)
        if not path.is_file():
            raise click.BadParameter(f"no such file: {target}", param_hint="SERVICE")
        # As ``python FILE`` would: the file's folder first on the path, the file a module
        # named after it. Another process (a caller unpickling this service's exception,
        # a replay) then finds its classes under the same name.
        module_name = path.stem
        if not module_name.isidentifier():
            raise click.BadParameter(
                f"{target}: {module_name!r} is not a module name", param_hint="SERVICE"
            )
        existing = sys.modules.get(module_name)
        if existing is not None and module_name not in _loaded_files:
            raise click.BadParameter(
                f"{target}: a module {module_name!r} is already loaded from "
                f"{getattr(existing, '__file__', 'elsewhere')}; rename the file",
                param_hint="SERVICE",
            )
        if existing is not None and _loaded_files[module_name] == path.resolve():
            module = existing
        else:
            _loaded_files[module_name] = path.resolve()
            sys.path.insert(0, str(path.resolve().parent))
            mod_spec = importlib.util.spec_from_file_location(module_name, path)
            if mod_spec is None or mod_spec.loader is None:
                raise click.BadParameter(f"cannot load {target}", param_hint="SERVICE")
            module = importlib.util.module_from_spec(mod_spec)
            sys.modules[module_name] = module
            mod_spec.loader.exec_module(module)
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise click.BadParameter(
                f"cannot import {target}: {exc}", param_hint="SERVICE"
            ) from None
    found = {
        name: obj
        for name, obj in vars(module).items()
        if inspect.isclass(obj)
        and issubclass(obj, Immortal)
        and obj is not Immortal
        and obj.__module__ == module.__name__
    }
    if class_name:
        if class_name not in found:
            raise click.BadParameter(
                f"{target} has no Immortal subclass {class_name!r} (it has {sorted(found)})",
                param_hint="SERVICE",
            )
        return found[class_name]
    if len(found) != 1:
        raise click.BadParameter(
            f"{target} defines {len(found)} Immortal subclasses {sorted(found)}: name one as "
            f"{target}:Class",
            param_hint="SERVICE",
        )
    return next(iter(found.values()))


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
            except click.BadParameter:
                service = None  # reported properly when the argument is parsed
            if service is not None:
                known = {p.name for p in self.params}
                for name, kind, default in service.option_fields():
                    if name in known:
                        raise click.UsageError(f"service option {name!r} clashes with run's own")
                    self.params.append(
                        click.Option(
                            [f"--{name.replace('_', '-')}", name],
                            type=kind,
                            default=default,
                            show_default=True,
                            help=f"{service.__name__} option.",
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


async def _run(
    service: type[Immortal],
    instance: str,
    data_dir: Path,
    separated: bool,
    receive_port: int | None,
    send_port: int | None,
    upgrade_to: type[Immortal] | None,
    upgrade_version: int | None,
    options: Any,
    timeout: float,
    links: list[str],
    on_primary: Callable[[Dispatcher], None] | None = None,
) -> int:
    if separated:
        if receive_port is None or send_port is None:
            raise click.UsageError("--separated needs --receive-port and --send-port")
        await serve(
            service,
            instance,
            receive_port,
            send_port,
            upgrade_to=upgrade_to,
            options=options,
            timeout=timeout,
            token=_separated_token(data_dir, instance),
            on_primary=on_primary,
        )
        return 0
    args = coordinator_argv(instance, data_dir, *links)
    if receive_port is not None:
        args += ["--receive-port", str(receive_port)]
    if send_port is not None:
        args += ["--send-port", str(send_port)]
    if upgrade_version is not None:
        args += ["--upgrade-version", str(upgrade_version)]
    ic = await asyncio.create_subprocess_exec(*args, stdout=asyncio.subprocess.PIPE)
    try:
        assert ic.stdout is not None
        line = (await ic.stdout.readline()).decode()
        if not line.startswith("ready"):
            code = await ic.wait()
            if code == 2:  # a refusal: it said why, in one line on stderr; nothing to add
                return code
            raise click.ClickException(f"the coordinator did not start (exit status {code})")
        fields = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
        click.echo(line.strip(), err=True)
        await serve(
            service,
            instance,
            int(fields["receive_port"]),
            int(fields["send_port"]),
            upgrade_to=upgrade_to,
            options=options,
            timeout=timeout,
            token=token_for_ready_line(fields, data_dir, instance),
            on_primary=on_primary,
        )
        return await ic.wait()
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
    ingress: IngressServer | None, main: Callable[..., Awaitable[int]]
) -> int:
    """``main`` (:func:`_run`), with the ingress bound before anything starts (a port in
    use is one line) and serving once the immortal is primary."""
    if ingress is None:
        return await main()
    wanted = f"{ingress.settings.host}:{ingress.settings.port}"
    try:
        host, port = await ingress.bind()
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc)
        raise click.ClickException(f"the ingress cannot listen on {wanted}: {why}") from None

    def attach(d: Dispatcher) -> None:
        ingress.attach(d)
        click.echo(f"ingress listening on {host}:{port}", err=True)

    try:
        return await main(on_primary=attach)
    finally:
        ingress.close()


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
        secret = load_secret(link_settings(**security), data_dir)
    except LinkSetupError as exc:
        raise click.ClickException(str(exc)) from None
    settings = IngressSettings(host, port, keep_count=keep, keep_seconds=keep_seconds)
    return IngressServer(secret, settings)


@click.command(cls=_ServiceCommand)
@click.argument("service_spec", metavar="SERVICE")
@click.option("--instance", help="Instance name (default: the class name, lower case).")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("ambrosia-data"),
    show_default=True,
    help="Where logs, checkpoints and the registry live.",
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
@link_options[0]
@link_options[1]
@link_options[2]
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
    link_host: str,
    link_port: int,
    link_to: tuple[tuple[str, str, int], ...],
    **service_options: Any,
) -> None:
    """Run an immortal service with its coordinator; run it again to recover.

    The service's own options (its nested ``Options`` class) appear below once SERVICE
    is given: ``ambrosia-py run SERVICE --help``.
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
    # Sealed state (``files.py``) lives beside the instance's files in the data dir.
    files = StateFiles(state_files_dir(data_dir, instance or service.__name__.lower()))
    ingress = _ingress(ingress_address, ingress_keep, ingress_keep_seconds, link_security, data_dir)
    try:
        with use_state_files(files):
            status = asyncio.run(
                _run_with_ingress(
                    ingress,
                    partial(
                        _run,
                        service,
                        instance or service.__name__.lower(),
                        data_dir,
                        separated,
                        receive_port,
                        send_port,
                        upgrade_to,
                        upgrade_version,
                        _options(upgrade_to or service, service_options),
                        connect_timeout,
                        link_argv(link_host, link_port, link_to, **link_security),
                    ),
                )
            )
    except (ConnectionRefusedError, BindingTokenError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        status = 0
    sys.exit(status)


@click.command()
@click.argument("service_spec", metavar="SERVICE")
@click.option("--instance", required=True, help="The instance whose history to replay.")
@click.option(
    "--data-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True, path_type=Path),
    help="Where its logs and checkpoints live.",
)
@click.option("--verify", is_flag=True, help="Find the first non-deterministic message.")
@click.option("--to-seq", type=int, help="Stop after this record.")
def replay(
    service_spec: str, instance: str, data_dir: Path, verify: bool, to_seq: int | None
) -> None:
    """Re-run an instance's recorded history offline with SERVICE's code, writing nothing.

    With --verify, two replays run in lockstep from every checkpoint and are compared
    after each message (state and outgoing calls), and each recomputed checkpoint with
    the recorded one: the first difference is reported with its record and method.
    """
    from .replay import replay_instance  # the coordinator's modules only when asked

    service = load_service(service_spec)
    try:
        result = replay_instance(service, data_dir, instance, verify=verify, to_seq=to_seq)
    except BindingError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"replayed {result.records} records ({result.messages} messages) from checkpoint "
        f"{result.checkpoint}, last seq {result.last_seq}"
    )
    if result.divergence is not None:
        click.echo(f"NOT DETERMINISTIC at {result.divergence}", err=True)
        sys.exit(1)
    if verify:
        click.echo("deterministic: both replays and every recorded checkpoint agree")
    for key, value in sorted(result.state.items()):
        text = repr(value)
        click.echo(f"  {key} = {text if len(text) <= 100 else text[:97] + '...'}")
