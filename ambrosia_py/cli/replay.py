"""``ambrosia-py replay SERVICE``: re-run an instance's recorded history offline.

The replay itself is the binding's (``binding/replay.py``), imported only when the
command runs; this is its command line and its report.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..binding.errors import BindingError
from ..binding.loading import load_service
from ..hashseed import instance_seed, run_under_seed
from ..oneline import OneLineError
from .exits import verbose_option
from .options import data_dir_option, registry_options

__all__ = ["replay"]


@click.command()
@click.argument("service_spec", metavar="SERVICE")
@click.option("--instance", required=True, help="The instance whose history to replay.")
@data_dir_option("Where its logs and checkpoints live.")
@click.option("--verify", is_flag=True, help="Find the first non-deterministic message.")
@click.option("--to-seq", type=int, help="Stop after this record.")
@registry_options
@verbose_option
def replay(
    service_spec: str,
    instance: str,
    data_dir: Path,
    verify: bool,
    to_seq: int | None,
    registry: str | None,
    cluster: str,
) -> None:
    """Re-run an instance's recorded history offline with SERVICE's code, writing nothing.

    With --verify, two replays run in lockstep and are compared by value after each
    message (state and outgoing calls), the second restored from every recorded
    checkpoint as a recovery would be; each recorded checkpoint is compared with the
    recomputed state. The first difference is reported with its record and method.
    """
    from ..binding.replay import replay_instance  # the coordinator's modules only when asked

    try:  # the run's set order, not this process's (hashseed.py); before the service loads
        run_under_seed(instance_seed(data_dir, instance, create=False))
    except ValueError as exc:
        raise OneLineError(str(exc)) from None
    service = load_service(service_spec)
    try:
        result = replay_instance(
            service,
            data_dir,
            instance,
            verify=verify,
            to_seq=to_seq,
            registry=registry,
            cluster=cluster,
        )
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
        click.echo(
            "deterministic: both replays (one recovered at each checkpoint) and every "
            "recorded checkpoint agree"
        )
    for n, hazard in result.hazards:  # order that nothing depended on, in this history
        click.echo(
            f"note: after a recovery at checkpoint {n}, {hazard}; nothing in this history "
            f"depended on that, but a handler that iterates it would: {hazard.fix}"
        )
    for key, value in sorted(result.state.items()):
        text = repr(value)
        click.echo(f"  {key} = {text if len(text) <= 100 else text[:97] + '...'}")
