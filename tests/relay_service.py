"""A service for the tests of instances that find each other by name in a registry.

``send(peer, index)`` (from a client, through the ingress) forks ``note(me, index)`` to
``peer``, whose handler forks ``ack(index)`` back: each call crosses the link both ways,
so both coordinators dial each other. ``state()`` says what arrived, in order: a call,
note or ack lost or delivered twice shows there.
"""

from __future__ import annotations

from typing import Any

from ambrosia_py import Immortal, rpc


class Relay(Immortal):
    def __init__(self) -> None:
        self.sent: list[int] = []  # the indices of send() calls, as they ran
        self.notes: dict[str, list[int]] = {}  # per sender, the notes it sent here
        self.acks: list[int] = []  # the notes acknowledged by the peer

    @rpc
    def send(self, peer: str, index: int) -> int:
        self.sent.append(index)
        self.proxy(peer, Relay).note.fork(self.instance_name, index)
        return len(self.sent)

    @rpc
    def note(self, sender: str, index: int) -> None:
        self.notes.setdefault(sender, []).append(index)
        self.proxy(sender, Relay).ack.fork(index)

    @rpc
    def ack(self, index: int) -> None:
        self.acks.append(index)

    @rpc
    def state(self) -> dict[str, Any]:
        return {"sent": self.sent, "notes": self.notes, "acks": self.acks}
