"""The workflows and activities Temporal runs for ``bench compare``, and the worker
process that runs them (``python -c "...; work(ADDRESS, QUEUE)"``).

- ``AddOne.run(n)`` executes the activity ``add_one(n)`` and returns its ``n + 1``: a
  workflow with one activity, started and awaited by an ordinary program (the counter's
  value is carried by the caller, each step of it made durable by Temporal);
- ``Stamps.run(n)`` executes the activity ``stamp`` ``n`` times, one after the other,
  and returns when each ran (``time.monotonic``, one clock for every process of the
  machine): one workflow awaiting another's handler, timed between answers as ours is.

Temporal's defaults throughout (the sandboxed workflow runner, default retry policies
and task queue settings), but for one thing: the sandbox would import this module's
package again inside it, and ``ambrosia_py`` is passed through instead (this module
imports nothing but the standard library and ``temporalio`` itself). Annotations stay
evaluated (no ``from __future__ import annotations``): the SDK reads them to convert
arguments and results.
"""

import asyncio
import time
from datetime import timedelta

from temporalio import activity, workflow  # type: ignore[import-not-found,unused-ignore]

__all__ = ["AddOne", "Stamps", "add_one", "stamp", "work"]

ACTIVITY_TIMEOUT = timedelta(seconds=60)


# Where temporalio is not installed its decorators are untyped: the ignores say so.
@activity.defn(name="add_one")  # type: ignore[untyped-decorator,unused-ignore]
async def add_one(n: int) -> int:
    return n + 1


@activity.defn(name="stamp")  # type: ignore[untyped-decorator,unused-ignore]
async def stamp() -> float:
    return time.monotonic()


@workflow.defn(name="AddOne")
class AddOne:
    @workflow.run  # type: ignore[untyped-decorator,unused-ignore]
    async def run(self, n: int) -> int:
        got: int = await workflow.execute_activity(
            add_one, n, start_to_close_timeout=ACTIVITY_TIMEOUT
        )
        return got


@workflow.defn(name="Stamps")
class Stamps:
    @workflow.run  # type: ignore[untyped-decorator,unused-ignore]
    async def run(self, n: int) -> list[float]:
        stamps: list[float] = []
        for _ in range(n):
            stamps.append(
                await workflow.execute_activity(stamp, start_to_close_timeout=ACTIVITY_TIMEOUT)
            )
        return stamps


def work(address: str, queue: str) -> None:
    """The worker process: poll ``queue`` on the server at ``address`` until killed."""
    from temporalio.client import Client  # type: ignore[import-not-found,unused-ignore]
    from temporalio.worker import Worker  # type: ignore[import-not-found,unused-ignore]
    from temporalio.worker.workflow_sandbox import (  # type: ignore[import-not-found,unused-ignore]
        SandboxedWorkflowRunner,
        SandboxRestrictions,
    )

    # The sandbox imports this module again, and its package with it: ambrosia_py is
    # passed through (used as imported here) instead; the workflows still run sandboxed.
    restrictions = SandboxRestrictions.default.with_passthrough_modules("ambrosia_py")

    async def run() -> None:
        client = await Client.connect(address)
        worker = Worker(
            client,
            task_queue=queue,
            workflows=[AddOne, Stamps],
            activities=[add_one, stamp],
            workflow_runner=SandboxedWorkflowRunner(restrictions=restrictions),
        )
        await worker.run()

    asyncio.run(run())
