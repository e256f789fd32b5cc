"""The smallest immortal service: a counter that survives crashes.

    ambrosia-py run examples/counter.py

The counter's state is ``count``. Clients reach it over TCP: the background task (the
outside world) turns each line ``add N`` into an impulse, which the coordinator logs
before the handler runs; the handler answers through an effect, which runs only in the
incarnation that handles the message for the first time (replay suppresses it).
Kill either process with SIGKILL and run the same command again: the count carries on,
every acknowledged ``add`` counted exactly once.
"""

from __future__ import annotations

import asyncio
import itertools
import sys

from ambrosia_py import Immortal, background, rpc

# Live client connections, by request id. Not state: they belong to this incarnation.
_waiting: dict[int, asyncio.StreamWriter] = {}
_request_ids = itertools.count(1)


def _reply(request: int, count: int) -> None:
    writer = _waiting.pop(request, None)
    if writer is not None:
        writer.write(f"ok {count}\n".encode())


class Counter(Immortal):
    class Options:
        port: int = 0  # where clients connect; 0 picks a free port

    def __init__(self) -> None:
        self.count = 0
        self.calls = 0

    @rpc
    def add(self, n: int, request: int = 0) -> int:
        self.count += n
        self.calls += 1
        self.effect(_reply, request, self.count)
        return self.count

    @rpc
    def get(self) -> int:
        return self.count

    @background
    async def serve_clients(self) -> None:
        async def client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                words = line.decode().split()
                if len(words) == 2 and words[0] == "add":
                    request = next(_request_ids)
                    _waiting[request] = writer
                    self.impulse.add(int(words[1]), request=request)
                elif words == ["get"]:
                    writer.write(f"count {self.count}\n".encode())
                else:
                    writer.write(b"error: say 'add N' or 'get'\n")

        port = self.options.port if self.options is not None else 0
        server = await asyncio.start_server(client, "127.0.0.1", port)
        port = server.sockets[0].getsockname()[1]
        print(f"counter listening on 127.0.0.1:{port}", file=sys.stderr, flush=True)
        async with server:
            await server.serve_forever()
