"""Sensor readings, and the Wallaroo application that aggregates them.

A reading is one line of text, ``sensor-<k>,<value>,<seq>``: the sensor's name, an
integer value (tenths of a degree), and the producer's sequence number. The sequence
number makes every payload distinct, which the Ockam :class:`Publisher` needs to tell,
after a hub crash, which unconfirmed pushes the hub did store (``docs/ockam.md``).

:func:`aggregate` is the application the Wallaroo worker runs
(``--app examples.pipeline.sensors:aggregate``): it is called once per message, in log
order, with the worker's application state, which the worker checkpoints and replays
with the rest of its immortal state. It must be deterministic, as any handler: it only
reads the payload and the state.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

__all__ = ["aggregate", "format_reading", "parse_reading", "readings"]


def format_reading(key: str, value: int, seq: int) -> bytes:
    """The payload of one reading."""
    return f"{key},{value},{seq}".encode()


def parse_reading(payload: bytes) -> tuple[str, int, int]:
    """(sensor, value, seq) of a payload; ValueError naming the payload if malformed."""
    try:
        key, value, seq = payload.decode("ascii").split(",")
        return key, int(value), int(seq)
    except ValueError:
        raise ValueError(f"not a reading (sensor-<k>,<value>,<seq>): {payload[:80]!r}") from None


def readings(seed: int, sensors: int) -> Iterator[tuple[str, int, int]]:
    """An endless, reproducible run of readings: (sensor, value, seq), seq from 0.

    Each sensor has its own level, and each reading wanders around it.
    """
    rng = random.Random(seed)
    levels = [rng.randint(-100, 300) for _ in range(sensors)]
    seq = 0
    while True:
        k = rng.randrange(sensors)
        yield f"sensor-{k}", levels[k] + rng.randint(-50, 50), seq
        seq += 1


def aggregate(state: dict[str, Any], payload: bytes) -> None:
    """Per sensor: how many readings, and their sum; and the readings in all."""
    key, value, _ = parse_reading(payload)
    counts = state.setdefault("counts", {})
    sums = state.setdefault("sums", {})
    counts[key] = counts.get(key, 0) + 1
    sums[key] = sums.get(key, 0) + value
    state["events"] = state.get("events", 0) + 1
