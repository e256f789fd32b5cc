"""Applications the Wallaroo worker tests run: ``--app tests.wallaroo_apps:NAME``.

An application is ``function(state: dict, payload: bytes) -> None``, called once per
message in log order with the worker's application state (part of its immortal state),
so it must be deterministic, as a handler is.
"""

from __future__ import annotations

from typing import Any


def word_count(state: dict[str, Any], payload: bytes) -> None:
    """Count the words of each message, and the messages."""
    counts = state.setdefault("counts", {})
    for word in payload.decode("utf-8").split():
        counts[word] = counts.get(word, 0) + 1
    state["messages"] = state.get("messages", 0) + 1


def record(state: dict[str, Any], payload: bytes) -> None:
    """Keep every payload in order: what the worker applied, and how often."""
    state.setdefault("payloads", []).append(payload)


def explode(state: dict[str, Any], payload: bytes) -> None:
    """Raise on a payload that says so; record the others."""
    if payload == b"boom":
        raise RuntimeError("boom")
    record(state, payload)
