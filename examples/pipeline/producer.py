"""The producer: sensor readings pushed to an Ockam stream on the hub, each stored once.

    python -m examples.pipeline.producer --hub 127.0.0.1:4000 --stream readings \\
        --events 50000 --rate 2500 --manifest produced.json

A plain program, not an immortal: it needs no log of its own because the
:class:`~immortals.ockam.hub_client.Publisher` gets each reading stored exactly once even
when the hub is SIGKILLed mid-push. After a drop it reconnects and, before sending
again, reads the stream after its last confirmed index; the unconfirmed readings the hub
did store are taken as confirmed there, and only the rest is sent again. Each reading
carries a sequence number, so no two payloads are alike, which that scan relies on.
(Were the producer itself to crash it would start over; making it an immortal, or
resuming from the stream's last sequence number, is what a real gateway would add.)

Readings come at ``--rate`` per second (0: as fast as the hub takes them). Every tenth
of a second, what has come since is published as one pipelined batch; a batch that
waits for a hub to recover makes the next one bigger, as a gateway buffers. On stdout,
one JSON line of progress every tenth of a second (``produced``: readings made and
handed to the publisher; ``stored``: confirmed by the hub, so durable in its log;
``reconnects``; ``recovered``: readings found stored after a drop rather than sent
again). At the end ``--manifest`` gets what was produced: the number of readings and,
per sensor, their count and sum; the demo checks the pipeline's aggregates against it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from immortals.ockam.hub_client import Publisher

from .sensors import format_reading, readings

TICK = 0.1  # seconds between batches, and between progress lines
MAX_BATCH = 5000  # readings in one publish at most (a catch-up after an outage is split)


class Producer:
    """Makes readings at a rate and publishes them; counts what it made (the manifest)."""

    def __init__(self, host: str, port: int, stream: str, args: argparse.Namespace) -> None:
        self.host, self.port, self.stream = host, port, stream
        self.events: int = args.events
        self.rate: float = args.rate
        self.window: int = args.window
        self.retry_for: float = args.retry_for
        self.source = readings(args.seed, args.sensors)
        self.counts: dict[str, int] = {}
        self.sums: dict[str, int] = {}
        self.produced = 0
        self.stored = 0  # confirmed, in batches finished
        self.reconnects = 0
        self.recovered = 0
        self.current: Publisher | None = None

    def progress(self) -> dict[str, int]:
        current = self.current.confirmed if self.current is not None else 0
        reconnects = self.current.reconnects if self.current is not None else 0
        return {
            "produced": self.produced,
            "stored": self.stored + current,
            "reconnects": self.reconnects + reconnects,
            "recovered": self.recovered,
        }

    def _make(self, n: int) -> list[bytes]:
        batch = []
        for _ in range(n):
            key, value, seq = next(self.source)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.sums[key] = self.sums.get(key, 0) + value
            batch.append(format_reading(key, value, seq))
        self.produced += n
        return batch

    async def run(self) -> None:
        start = time.monotonic()
        while self.produced < self.events:
            elapsed = time.monotonic() - start
            due = self.events if self.rate <= 0 else min(self.events, int(self.rate * elapsed))
            if due <= self.produced:
                await asyncio.sleep(TICK)
                continue
            batch = self._make(min(due - self.produced, MAX_BATCH))
            publisher = Publisher(
                self.host, self.port, self.stream, window=self.window, retry_for=self.retry_for
            )
            self.current = publisher
            indexes = await publisher.publish(batch)
            if len(indexes) != len(batch):
                raise RuntimeError(f"{len(indexes)} of {len(batch)} readings confirmed")
            self.current = None
            self.stored += len(batch)
            self.reconnects += publisher.reconnects
            self.recovered += publisher.recovered

    def manifest(self) -> dict[str, Any]:
        return {
            "stream": self.stream,
            "events": self.produced,
            "counts": self.counts,
            "sums": self.sums,
        }


async def _report(producer: Producer) -> None:
    while True:
        print(json.dumps(producer.progress()), flush=True)
        await asyncio.sleep(TICK)


async def main_async(args: argparse.Namespace) -> None:
    host, _, port = args.hub.rpartition(":")
    producer = Producer(host, int(port), args.stream, args)
    reporter = asyncio.ensure_future(_report(producer))
    try:
        await producer.run()
    finally:
        reporter.cancel()
        print(json.dumps(producer.progress()), flush=True)
    path = Path(args.manifest)
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(producer.manifest()))
    os.replace(temporary, path)  # whole or absent: the demo reads it once it exists
    print(json.dumps({"done": producer.produced, "manifest": str(path)}), flush=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hub", required=True, help="the hub's HOST:PORT")
    parser.add_argument("--stream", default="readings", help="the Ockam stream's name")
    parser.add_argument("--events", type=int, default=50_000, help="how many readings")
    parser.add_argument("--rate", type=float, default=0.0, help="readings/s (0: no limit)")
    parser.add_argument("--sensors", type=int, default=100, help="how many sensors")
    parser.add_argument("--seed", type=int, default=1, help="the readings' random seed")
    parser.add_argument("--window", type=int, default=200, help="pushes in flight")
    parser.add_argument("--retry-for", type=float, default=120.0, help="seconds per outage")
    parser.add_argument("--manifest", required=True, help="where to write what was produced")
    return parser.parse_args(argv)


if __name__ == "__main__":
    try:
        asyncio.run(main_async(parse_args()))
    except (ConnectionError, RuntimeError) as exc:
        sys.exit(f"producer: {exc}")
