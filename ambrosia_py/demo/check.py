"""The demo's verdict: the pipeline's aggregates against exactly-once processing.

The producer's manifest says what it produced: the number of readings and, per sensor,
their count and sum. Exactly once means the worker's application state holds exactly
those numbers: a reading lost or applied twice changes its sensor's count (and almost
surely its sum). Separately, the hub's stream is read back whole: it must hold each
reading once, in the order produced (sequence numbers 0, 1, 2, ...), which is what the
Publisher's de-duplication after each hub crash promises.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

__all__ = ["ReadBackError", "StreamContents", "Verdict", "compare", "read_stream"]


@attrs.frozen
class StreamContents:
    """What the hub's stream holds: how many readings, and whether each once, in order."""

    messages: int
    in_order_once: bool
    problem: str  # the first reading out of place, or ""


class ReadBackError(Exception):
    """The stream could not be read back: what the reading program said."""


def read_stream(
    hub: str, stream_name: str, *, cwd: Path, env: Mapping[str, str], timeout: float = 30.0
) -> StreamContents:
    """Read the whole stream from the hub at ``hub`` (``HOST:PORT``), as a program of the
    example does (``examples/pipeline/readback.py``, run from ``cwd`` with ``env``): the
    demo talks to the hub as any client would, over TCP."""
    argv = [sys.executable, "-m", "examples.pipeline.readback", "--hub", hub]
    argv += ["--stream", stream_name, "--timeout", str(timeout)]
    try:
        done = subprocess.run(
            argv, cwd=cwd, env=dict(env), capture_output=True, text=True, timeout=timeout * 4
        )
    except subprocess.TimeoutExpired:
        raise ReadBackError(f"no answer in {timeout * 4:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        said = done.stderr.strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        raise ReadBackError(said[0])
    answer = json.loads(lines[-1])
    problem = str(answer["problem"])
    return StreamContents(int(answer["messages"]), not problem, problem)


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
