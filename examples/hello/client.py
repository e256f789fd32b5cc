"""The hello client: greets a list of names through the server, one awaited call at a time.

    ambrosia-py run examples/hello/server.py --instance server &
    ambrosia-py run examples/hello/client.py --instance client --count 100

Both instances share a data directory (and so its registry), where each coordinator
publishes the address its links from other coordinators arrive at. The options count
only on the client's first start: they go into the one call it forks itself then. On first start the
client forks itself one call, ``greet_all``, which awaits ``server.hello(name)`` for each
name in turn and keeps the replies. Kill either process (or its coordinator) with SIGKILL
at any point and run the same command again: the client carries on where it was, and
the server greets every name exactly once.
"""

from __future__ import annotations

from server import HelloServer, Refused  # this folder is on the path under `run`

from ambrosia_py import Immortal, rpc


def _report(replies: int, refusals: int, last: str) -> None:
    print(f"done: {replies} replies, {refusals} refusals; last reply: {last}", flush=True)


class HelloClient(Immortal):
    class Options:
        server: str = "server"  # the instance name of the server
        count: int = 10  # how many names to greet

    def __init__(self) -> None:
        self.replies: list[str] = []
        self.refusals: list[str] = []
        self.done = False

    def on_first_start(self) -> None:
        self.me.greet_all.fork(self.options.server, self.options.count)

    @rpc
    async def greet_all(self, server_name: str, count: int) -> None:
        server = self.proxy(server_name, HelloServer)
        for i in range(count):
            name = "nobody" if i % 10 == 9 else f"friend-{i}"
            try:
                self.replies.append(await server.hello(name))
            except Refused as exc:
                self.refusals.append(str(exc))
        self.done = True
        self.effect(_report, len(self.replies), len(self.refusals), self.replies[-1])
