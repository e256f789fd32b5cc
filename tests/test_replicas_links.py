"""Two linked instances, each run as three replicas, calling each other through failovers
of either: every call crosses each link exactly once.

``relaya`` takes ``send("relayb", i)`` calls through its ingress; each forks
``note("relaya", i)`` to ``relayb``, whose handler forks ``ack(i)`` back
(tests/relay_service.py). While a caller sends, the primary of ``relaya`` and then the
primary of ``relayb`` lose their machines (every process SIGKILLed, the data dir deleted)
and rejoin empty. At the end ``relaya`` ran every send once, in order; ``relayb`` noted
each once, in order; and every acknowledgement came back once: a message lost or
delivered twice on either link, across either failover, shows in the states.

The logs roll every few kilobytes (``AMBROSIA_LOG_TRIGGER_MB``), so the secondaries take
checkpoints of their own all along, each holding the outboxes their replay filled and
the primary's trim points emptied, and the inbox their replay rebuilt.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py.client import Client
from ambrosia_py.testing import wait_for
from tests.relay_service import Relay
from tests.test_replicas_failover import (
    DEADLINE,
    Machine,
    Registry,
    current_term,
    installed,
    newer_term,
)

RELAY = Path(__file__).with_name("relay_service.py")

pytestmark = pytest.mark.timeout(300)


class Group:
    """The three replicas of one instance."""

    def __init__(self, root: Path, instance: str, registry: Registry, secret: Path) -> None:
        self.instance = instance
        self.registry = registry
        self.machines = [Machine(root, r, registry, secret, RELAY, instance) for r in range(3)]

    def start(self) -> None:
        for m in self.machines:
            m.start()

    def tails(self) -> str:
        """The end of what each replica printed, for a wait that timed out."""
        return "\n".join(
            f"--- {m.log.name}:\n{m.process.tail(1500)}" for m in self.machines if m.process
        )

    def ready(self) -> None:
        """A primary, and every other replica holding a checkpoint."""
        wait_for(
            f"a primary of {self.instance}",
            lambda: current_term(self.registry, self.instance) is not None,
            DEADLINE,
            context=self.tails,
        )
        term = current_term(self.registry, self.instance)
        assert term is not None
        for m in self.machines:
            if m.replica != term.replica:
                wait_for(
                    f"{m.log.name} to hold a checkpoint",
                    lambda m=m: installed(m),
                    DEADLINE,
                    context=self.tails,
                )

    def lose_primary(self) -> None:
        """The primary's machine is lost; a secondary takes over; it rejoins empty."""
        term = current_term(self.registry, self.instance)
        assert term is not None
        lost = self.machines[term.replica]
        lost.lose()
        wait_for(
            f"a new primary of {self.instance}", lambda: newer_term(self.registry, term), DEADLINE
        )
        lost.start()
        wait_for(f"{lost.log.name} to rejoin", lambda: installed(lost), DEADLINE)

    def stop(self) -> None:
        for m in self.machines:
            m.stop()


@pytest.fixture
def linked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Group, Group, Registry, Path]]:
    monkeypatch.setenv("AMBROSIA_LOG_TRIGGER_MB", "0.004")  # the replicas inherit it
    secret = tmp_path / "secret"
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o600)
    registry = Registry(str(tmp_path / "registry.sqlite3"), "ambrosia", tmp_path)
    a = Group(tmp_path, "relaya", registry, secret)
    b = Group(tmp_path, "relayb", registry, secret)
    try:
        a.start()
        b.start()
        a.ready()
        b.ready()
        yield a, b, registry, secret
    finally:
        a.stop()
        b.stop()


def client(registry: Registry, secret: Path, instance: str) -> Client:
    return Client.connect(
        instance=instance,
        registry=registry.spec,
        cluster=registry.cluster,
        secret_file=secret,
        timeout=DEADLINE,
    )


def test_calls_between_replicated_instances_cross_each_link_once_through_failovers(
    linked: tuple[Group, Group, Registry, Path],
) -> None:
    a, b, registry, secret = linked
    sent: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def sender() -> None:
        try:
            with client(registry, secret, "relaya") as c:
                i = 0
                while not stop.is_set():
                    assert c.call(Relay.send, "relayb", i) == i + 1  # its place in `sent`
                    sent.append(i)
                    i += 1
        except BaseException as exc:
            errors.append(exc)

    def more(n: int) -> None:
        target = len(sent) + n

        def enough() -> bool:
            if errors:
                raise errors[0]
            return len(sent) >= target

        wait_for(f"{n} more sends", enough, DEADLINE)

    thread = threading.Thread(target=sender)
    thread.start()
    try:
        more(30)
        a.lose_primary()
        more(30)
        b.lose_primary()
        more(30)
    finally:
        stop.set()
        thread.join(DEADLINE)
    if errors:
        raise errors[0]

    n = len(sent)
    want = list(range(n))

    def state(instance: str) -> dict[str, Any]:
        with client(registry, secret, instance) as c:
            result: dict[str, Any] = c.call(Relay.state)
            return result

    # Every acknowledgement makes its way back (links resend what was not confirmed).
    wait_for("every ack to come back", lambda: len(state("relaya")["acks"]) >= n, DEADLINE)
    sa, sb = state("relaya"), state("relayb")
    assert sa["sent"] == want
    assert sb["notes"] == {"relaya": want}
    assert sa["acks"] == want
