"""``coordinator/replicas/transport.py`` and a receiving replica in a process of its own,
killed with SIGKILL and started again on the same port: the sender dials it again, and
what it sent meanwhile and after arrives, once, in order."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ambrosia_py import eventloop
from ambrosia_py.coordinator.links.config import LinkSettings
from ambrosia_py.coordinator.registry.interface import Endpoint
from ambrosia_py.coordinator.replicas import ReplicaTransport
from ambrosia_py.coordinator.replication import Heartbeat, Message
from ambrosia_py.testing.ports import free_port
from tests.test_replica_transport import DEADLINE, INSTANCE, Group, _until, group, secret_file

__all__ = ["group", "secret_file"]  # fixtures, used through their names


# --- a receiver process, killed and started again -----------------------------------------


class Child:
    """A receiving replica (number 1) in its own process, started on ``port``: it writes
    ``ready``, then ``sender log_end`` for each heartbeat it gets, a line each to ``out``."""

    def __init__(self, port: int, secret: Path, out: Path) -> None:
        self.out = out
        argv = [
            sys.executable,
            "-m",
            "tests.test_replica_transport_restart",
            str(port),
            str(secret),
        ]
        self.proc = subprocess.Popen([*argv, str(out)], cwd=Path(__file__).resolve().parents[1])

    def lines(self) -> list[str]:
        text = self.out.read_text() if self.out.exists() else ""
        return text.split("\n")[:-1]  # whole lines only

    def got(self) -> list[int]:
        return [int(line.split()[1]) for line in self.lines()[1:] if line.startswith("0 ")]

    async def until(self, what: str, condition: Callable[[], bool]) -> None:
        """As :func:`_until`, failing at once if the process exits."""
        await _until(what, lambda: condition() or self.proc.poll() is not None)
        assert self.proc.poll() is None, f"the receiver exited ({self.proc.returncode})"

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL
        self.proc.wait(DEADLINE)


async def test_a_receiver_killed_and_restarted_gets_later_messages_once_in_order(
    group: Group, secret_file: Path, tmp_path: Path
) -> None:
    port = free_port()
    group.book[1] = Endpoint("127.0.0.1", port)
    sender = await group.add(0)
    first, second = Child(port, secret_file, tmp_path / "first"), None
    try:
        await first.until("the first start", lambda: first.lines()[:1] == ["ready"])
        for i in range(100):
            sender.send(1, Heartbeat(1, i, 0))
        await first.until("the first hundred", lambda: 99 in first.got())
        first.kill()
        await _until("the lost connection noticed", lambda: not sender.connected(1))
        for i in range(100, 200):  # queued while nothing listens
            sender.send(1, Heartbeat(1, i, 0))
        second = Child(port, secret_file, tmp_path / "second")
        await second.until("the second start", lambda: second.lines()[:1] == ["ready"])
        for i in range(200, 300):
            sender.send(1, Heartbeat(1, i, 0))
        await second.until("the later messages", lambda: 299 in second.got())
    finally:
        for child in (first, second):
            if child is not None:
                child.kill()
    assert first.got() == list(range(100))
    assert second.got() == list(range(100, 300))  # kept while it was down; none twice


# --- the receiving process of the SIGKILL test -------------------------------------------


def _child(port: int, secret: str, out: str) -> None:
    async def nowhere(replica: int) -> Endpoint | None:
        return None

    async def main() -> None:
        with open(out, "w") as lines:

            def got(sender: int, message: Message) -> None:
                assert isinstance(message, Heartbeat)
                lines.write(f"{sender} {message.log_end}\n")
                lines.flush()

            settings = LinkSettings(secret_file=Path(secret))
            transport = ReplicaTransport(INSTANCE, 1, settings, got, nowhere)
            await transport.listen("127.0.0.1", port)
            lines.write("ready\n")
            lines.flush()
            await asyncio.Event().wait()

    eventloop.run(main())


if __name__ == "__main__":
    _child(int(sys.argv[1]), sys.argv[2], sys.argv[3])
