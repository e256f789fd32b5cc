"""``ambrosia-py debug``: replay an instance's history from a checkpoint, writing nothing.

The coordinator's debug mode (``coordinator/core/debug.py``) serves the checkpoint and the
logged records after it. With SERVICE the binding runs in this process too
(:mod:`.debug_session`, imported only then); without it the coordinator waits for a
binding of any language to attach to its ports.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..coordinator.core.binding_auth import BindingAuth
from ..coordinator.core.config import CoordinatorConfig
from ..coordinator.core.debug import run_debug
from ..coordinator.storage.data_dir import DataDirError, debuggable_instance
from .coordinator import (
    binding_auth_option,
    instance_option,
    port_options,
    run_to_exit,
    setup_logging,
)
from .exits import verbose_option
from .options import data_dir_option, registry_options

__all__ = ["debug"]


@click.command()
@click.argument("service_spec", metavar="[SERVICE]", required=False)
@instance_option
@data_dir_option("Where the instance's logs, checkpoints and registry live.")
@click.option("--checkpoint", type=int, required=True, help="The checkpoint to start from.")
@click.option(
    "--to-seq",
    type=int,
    help="With SERVICE: stop after this record (default: the last one logged).",
)
@click.option(
    "--pdb",
    "use_pdb",
    is_flag=True,
    help="With SERVICE: open pdb there, the service at hand as `immortal`, instead of "
    "printing its state.",
)
@click.option("--test-upgrade", is_flag=True, help="Send UpgradeService before the replay.")
@verbose_option
@port_options[0]
@port_options[1]
@binding_auth_option
@registry_options
def debug(
    service_spec: str | None,
    instance: str,
    data_dir: Path,
    checkpoint: int,
    to_seq: int | None,
    use_pdb: bool,
    test_upgrade: bool,
    receive_port: int | None,
    send_port: int | None,
    binding_auth: str,
    registry: str | None,
    cluster: str,
) -> None:
    """Replay an instance's history from a checkpoint, writing nothing (what-if testing).

    With SERVICE (a file or module, as `run` takes it) the binding runs here too: it
    restores the checkpoint, handles the logged records through --to-seq, and prints
    the service's state there (or opens pdb). Without it, the coordinator waits for a
    binding to attach to its ports. Refused while the instance runs.
    """
    try:  # before anything is created or listened on
        info = debuggable_instance(data_dir, instance, registry, cluster)
    except DataDirError as exc:
        click.echo(f"ambrosia-py: {exc}", err=True)
        sys.exit(2)
    if service_spec is not None:
        if test_upgrade:
            raise click.UsageError("--test-upgrade needs a binding of its own: omit SERVICE")
        # The binding's code only when it is asked for.
        from .debug_session import debug_command

        sys.exit(
            debug_command(
                service_spec,
                data_dir,
                instance,
                info.current_version,
                checkpoint,
                to_seq=to_seq,
                use_pdb=use_pdb,
                receive_port=receive_port,
                send_port=send_port,
                registry=registry,
                cluster=cluster,
            )
        )
    if to_seq is not None or use_pdb:
        raise click.UsageError("--to-seq and --pdb are for the binding: give SERVICE")
    setup_logging(instance)
    config = CoordinatorConfig(
        data_dir=data_dir,
        instance=instance,
        receive_port=receive_port,
        send_port=send_port,
        binding_auth=BindingAuth(binding_auth),
        registry=registry,
        cluster=cluster,
    )
    run_to_exit(run_debug(config, checkpoint, test_upgrade=test_upgrade))
