"""Operate a running worker through its ``--control`` port: the worker's client.

    python -m immortals.wallaroo.worker_client --control 127.0.0.1:7101 --cookie C status
    python -m immortals.wallaroo.worker_client --control ... nack STREAM [POINT]
    python -m immortals.wallaroo.worker_client --control ... move HOST:PORT --instance NAME

``status`` prints the worker's state as JSON (connections, streams with their points of
reference, the application's state). ``nack`` rewinds a stream (its name, or its id in
decimal) to POINT, or to its start without one: a NACK in the draft, an ACK with the
lower point in v3. ``move`` moves every stream to the worker instance NAME at HOST:PORT,
its state first, then its connector (MIGRATE in the draft, seed 001; RESTART in v3; see
:mod:`immortals.wallaroo.handoff`). Both are impulses: the worker logs them like frames,
and answers once it has handled them. The port speaks JSON lines
(:mod:`.worker_control`), so :func:`request` is the framework's line client
(:func:`ambrosia_py.client.lines.ask`) with the cookie added.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from ambrosia_py.client.lines import ask
from ambrosia_py.helpformat import Group

__all__ = ["request"]


def request(control: str, cookie: str, body: dict[str, Any], timeout: float = 10.0) -> Any:
    """Send one request to the worker's control port and return its JSON answer.

    OSError (or TimeoutError) if the port cannot be reached or does not answer in time,
    ValueError for a bad address or an answer that is not JSON (:func:`ask`).
    """
    return ask(control, {**body, "cookie": cookie}, timeout)


@click.group(cls=Group)
@click.option("--control", required=True, help="The worker's --control HOST:PORT.")
@click.option("--cookie", default="", help="The worker's --cookie.")
@click.option("--timeout", default=10.0, show_default=True, help="Seconds to wait.")
@click.pass_context
def main(ctx: click.Context, control: str, cookie: str, timeout: float) -> None:
    """Operate a Wallaroo worker: read its state, NACK a stream, move its connectors."""
    ctx.obj = (control, cookie, timeout)


def _run(ctx: click.Context, body: dict[str, Any]) -> None:
    control, cookie, timeout = ctx.obj
    try:
        answer = request(control, cookie, body, timeout)
    except (OSError, ValueError) as exc:
        raise click.ClickException(f"{control}: {exc}") from None
    click.echo(json.dumps(answer, indent=2, sort_keys=True))
    if not answer.get("ok"):
        sys.exit(1)


@main.command()
@click.pass_context
def status(ctx: click.Context) -> None:
    """The worker's connections, streams and application state."""
    _run(ctx, {"op": "status"})


@main.command()
@click.argument("stream")
@click.argument("point", type=int, required=False)
@click.pass_context
def nack(ctx: click.Context, stream: str, point: int | None) -> None:
    """Rewind STREAM to POINT (to its start without one)."""
    _run(ctx, {"op": "nack", "stream": stream, "point": point})


@main.command()
@click.argument("target")
@click.option("--instance", required=True, help="The worker instance listening at TARGET.")
@click.pass_context
def move(ctx: click.Context, target: str, instance: str) -> None:
    """Move every stream, then its connector, to the worker INSTANCE at TARGET."""
    _run(ctx, {"op": "move", "target": target, "instance": instance})


if __name__ == "__main__":
    main()
