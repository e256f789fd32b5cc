"""The smallest immortal service: a counter that survives crashes.

    ambrosia-py run examples/counter.py --ingress 7000       # the service
    python examples/counter.py 127.0.0.1:7000 add 5          # a program calling it
    python examples/counter.py 127.0.0.1:7000 get

The counter's state is ``count``; ``add`` and ``get`` are its handlers. There is no
front end to write: ``--ingress`` takes calls to any ``@rpc`` method from programs
using :mod:`ambrosia_py.client`, authenticated with the cluster secret (the client reads
it from the service's data dir). The coordinator logs each call, with its idempotency
key, before the handler runs; the answer goes out only once that is durable. Kill either
process with SIGKILL and run the same command again: the client's call is sent again
with the same key and gets its answer, every ``add`` counted exactly once.
"""

from __future__ import annotations

import sys

from ambrosia_py import Immortal, rpc


class Counter(Immortal):
    def __init__(self) -> None:
        self.count = 0

    @rpc
    def add(self, n: int) -> int:
        self.count += n
        return self.count

    @rpc
    def get(self) -> int:
        return self.count


def main(argv: list[str]) -> None:
    """``counter.py ADDRESS add N | get [--data-dir DIR]``: one call, exactly once."""
    from ambrosia_py.client import Client

    data_dir = "ambrosia-data"
    if "--data-dir" in argv:
        at = argv.index("--data-dir")
        data_dir = argv[at + 1]
        del argv[at : at + 2]
    address, command, *args = argv
    with Client(address, data_dir=data_dir) as client:
        if command == "add":
            print(client.call(Counter.add, int(args[0])))
        elif command == "get":
            print(client.call(Counter.get))
        else:
            sys.exit(f"unknown command {command!r}: say add N or get")


if __name__ == "__main__":
    main(sys.argv[1:])
