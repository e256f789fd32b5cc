"""The demo's verdict: the pipeline's aggregates against exactly-once processing.

The producer's manifest says what it produced: the number of readings and, per sensor,
their count and sum. Exactly once means the worker's application state holds exactly
those numbers: a reading lost or applied twice changes its sensor's count (and almost
surely its sum). Separately, the hub's stream is read back whole: it must hold each
reading once, in the order produced (sequence numbers 0, 1, 2, ...), which is what the
Publisher's de-duplication after each hub crash promises.
"""

from __future__ import annotations

from typing import Any

import attrs

from .. import eventloop

__all__ = ["StreamContents", "Verdict", "compare", "read_stream"]


@attrs.frozen
class StreamContents:
    """What the hub's stream holds: how many readings, and whether each once, in order."""

    messages: int
    in_order_once: bool
    problem: str  # the first reading out of place, or ""


async def _read(host: str, port: int, stream_name: str, timeout: float) -> StreamContents:
    from immortals.ockam.client import OckamClient

    client = await OckamClient.connect(host, port)
    try:
        stream = await client.create(stream_name, timeout=timeout)
        index = 0
        problem = ""
        while True:
            batch = await client.pull(stream, index, 1000, timeout=timeout)
            if not batch:
                break
            for message in batch:
                # The payload ends with ",<seq>" (examples/pipeline/sensors.py).
                seq = int(message.data.rsplit(b",", 1)[1])
                if seq != message.index and not problem:
                    problem = f"index {message.index} holds reading #{seq}"
            index = batch[-1].index + 1
        return StreamContents(index, not problem, problem)
    finally:
        await client.close()


def read_stream(host: str, port: int, stream_name: str, timeout: float = 30.0) -> StreamContents:
    """Read the whole stream from the hub (a pull at a time)."""
    return eventloop.run(_read(host, port, stream_name, timeout))


@attrs.frozen
class Verdict:
    """Whether the aggregates equal exactly-once processing, and the lines that say so."""

    ok: bool
    summary: str
    details: tuple[str, ...]


def compare(
    manifest: dict[str, Any], app_state: dict[str, Any], stream: StreamContents, kills: int
) -> Verdict:
    """The worker's application state against the producer's manifest, sensor by sensor,
    and the hub's stream against what was produced."""
    produced = int(manifest["events"])
    aggregated = int(app_state.get("events", 0))
    want_counts: dict[str, int] = manifest["counts"]
    want_sums: dict[str, int] = manifest["sums"]
    got_counts: dict[str, int] = app_state.get("counts", {})
    got_sums: dict[str, int] = app_state.get("sums", {})
    details = []
    for key in sorted(set(want_counts) | set(got_counts), key=_sensor_order):
        wc, gc = want_counts.get(key, 0), got_counts.get(key, 0)
        ws, gs = want_sums.get(key, 0), got_sums.get(key, 0)
        if (wc, ws) != (gc, gs):
            details.append(
                f"{key}: aggregated {gc:,} readings summing to {gs:,}; "
                f"produced {wc:,} summing to {ws:,}"
            )
    if stream.messages != produced or not stream.in_order_once:
        where = stream.problem or f"{stream.messages:,} readings for {produced:,} produced"
        details.insert(0, f"the hub's stream: {where}")
    ok = not details and aggregated == produced
    sensors = len(want_counts)
    total = sum(want_sums.values())
    if ok:
        summary = (
            f"exactly once: {produced:,} readings produced, {stream.messages:,} stored "
            f"(each once, in order), {aggregated:,} aggregated; "
            f"the counts and sums of all {sensors} sensors equal the producer's "
            f"(sum of values {total:,}) through {kills} SIGKILLs"
        )
    else:
        summary = (
            f"NOT exactly once: {produced:,} readings produced, {stream.messages:,} stored, "
            f"{aggregated:,} aggregated; {len(details)} problems"
        )
    return Verdict(ok, summary, tuple(details[:10]))


def _sensor_order(key: str) -> tuple[int, str]:
    number = key.rpartition("-")[2]
    return (int(number), key) if number.isdigit() else (-1, key)
