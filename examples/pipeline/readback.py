"""Read an Ockam stream of readings back whole, and say whether it holds each once, in order.

    python -m examples.pipeline.readback --hub 127.0.0.1:4000 --stream readings

Pulls the stream from index 0 to its end, a pull at a time, and checks that the reading
at index ``i`` carries sequence number ``i`` (:func:`.sensors.parse_reading`): what the
producer's :class:`~immortals.ockam.hub_client.Publisher` promises across hub crashes. On
stdout, one JSON line: ``{"messages": N, "problem": "..."}``, the problem being the first
reading out of place, or empty. The demo runs it once the pipeline is done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from immortals.ockam.errors import OckamError
from immortals.ockam.hub_client import OckamClient

from .sensors import parse_reading

PULL = 1000  # messages asked for per pull


async def read_back(host: str, port: int, stream_name: str, timeout: float) -> tuple[int, str]:
    """(readings in the stream, the first one out of place or "")."""
    client = await OckamClient.connect(host, port)
    try:
        stream = await client.create(stream_name, timeout=timeout)
        index = 0
        problem = ""
        while True:
            batch = await client.pull(stream, index, PULL, timeout=timeout)
            if not batch:
                break
            for message in batch:
                seq = parse_reading(message.data)[2]
                if seq != message.index and not problem:
                    problem = f"index {message.index} holds reading #{seq}"
            index = batch[-1].index + 1
        return index, problem
    finally:
        await client.close()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", required=True, help="the hub's HOST:PORT")
    parser.add_argument("--stream", default="readings", help="the Ockam stream's name")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    host, _, port = args.hub.rpartition(":")
    try:
        messages, problem = asyncio.run(read_back(host, int(port), args.stream, args.timeout))
    except (OSError, TimeoutError, OckamError) as exc:
        sys.exit(f"readback: {args.hub}: {exc}")
    print(json.dumps({"messages": messages, "problem": problem}), flush=True)


if __name__ == "__main__":
    main()
