"""The services Restate runs for ``bench compare``, written with its Python SDK and served
by hypercorn in a process of their own (``python -c "...; serve(PORT)"``).

- ``Counter``, a Virtual Object keyed by caller: ``add(by)`` reads the key's state, adds
  ``by``, writes it and returns it (what ours' ``IngressBench.add`` does);
- ``Callee.take(n)`` returns ``n + 1``;
- ``Caller.loop(n)`` awaits ``Callee.take`` ``n`` times, one after the other, through
  ``ctx.service_call``, checks each answer, and returns the time each answer arrived
  (``time.monotonic``, one clock for every process of the machine): one service awaiting
  another's handler, timed between answers as ours is. Reading the clock in a handler
  is what Restate asks handlers not to do (a replay would read it again); here it only
  measures, and a replay would show as a gap out of line, not as a wrong answer.

Imported only in that process: ``restate`` and ``hypercorn`` are the ``bench`` extra's.
Annotations stay evaluated (no ``from __future__ import annotations``): the SDK reads
the handlers' type hints to pick their serializers.
"""

import asyncio
import time

import restate  # type: ignore[import-not-found,unused-ignore]

__all__ = ["KEEP_ALIVE_REQUESTS", "add", "app", "loop", "serve", "take"]

# hypercorn closes a connection after this many requests (1,000 by default), and an
# invocation Restate sends over the HTTP/2 connection being closed then waits for the
# invoker's inactivity timeout (a minute). No run here makes this many.
KEEP_ALIVE_REQUESTS = 1_000_000_000


counter = restate.VirtualObject("Counter")
callee = restate.Service("Callee")
caller = restate.Service("Caller")


# Where restate is not installed its decorators are untyped: the ignores say so.
@counter.handler(name="add")  # type: ignore[untyped-decorator,unused-ignore]
async def add(ctx: restate.ObjectContext, by: int) -> int:
    value: int = (await ctx.get("value", type_hint=int)) or 0
    value += by
    ctx.set("value", value)
    return value


@callee.handler(name="take")  # type: ignore[untyped-decorator,unused-ignore]
async def take(ctx: restate.Context, n: int) -> int:
    return n + 1


@caller.handler(name="loop")  # type: ignore[untyped-decorator,unused-ignore]
async def loop(ctx: restate.Context, n: int) -> list[float]:
    stamps = [time.monotonic()]
    for i in range(n):
        got = await ctx.service_call(take, i)
        if got != i + 1:
            raise restate.TerminalError(f"Callee.take({i}) answered {got!r}")
        stamps.append(time.monotonic())
    return stamps


app = restate.app(services=[counter, callee, caller])


def serve(port: str) -> None:
    """Serve :data:`app` over HTTP (Restate connects with HTTP/2) on 127.0.0.1:``port``."""
    from hypercorn.asyncio import serve as hypercorn_serve  # type: ignore[import-not-found,unused-ignore]
    from hypercorn.config import Config  # type: ignore[import-not-found,unused-ignore]

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.keep_alive_max_requests = KEEP_ALIVE_REQUESTS
    asyncio.run(hypercorn_serve(app, config))
