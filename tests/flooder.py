"""A connection flood for tests, in a process of its own: ``connections`` sockets to one
address that send nothing, each opened again as soon as the server closes it.

It runs in another process so that it competes with the server for CPU as a real
attacker does, and not with the honest client for the test process's interpreter. It
prints how many connections it has opened, a line at a time; :attr:`Flood.made` is the
last count, so a test can see the attack still going after its honest call returned.
It stops when its standard input closes (the test ended, or died).

    python -m tests.flooder HOST PORT CONNECTIONS SOURCE[,SOURCE...]
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from ambrosia_py.testing.processes import wait_for

__all__ = ["Flood", "flooding"]

_REPORT_S = 0.02  # how often the count is printed


def flood(address: tuple[str, int], connections: int, sources: Sequence[str]) -> None:
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin, selectors.EVENT_READ, None)
    made = 0

    def open_one(i: int) -> None:
        nonlocal made
        sock = socket.socket()
        sock.setblocking(False)
        sock.bind((sources[i % len(sources)], 0))
        sock.connect_ex(address)  # in progress, or refused: readable either way
        selector.register(sock, selectors.EVENT_READ, i)
        made += 1

    for i in range(connections):
        open_one(i)
    reported = 0.0
    while True:
        for key, _ in selector.select(timeout=_REPORT_S):
            if key.data is None:  # stdin: closed (or anything) ends the flood
                return
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if sock.recv(4096):
                    continue  # a HELLO or a ConnectPacket: never answered
            except BlockingIOError:
                continue
            except OSError:
                pass  # reset (evicted or refused), or the connect failed
            selector.unregister(sock)
            sock.close()
            open_one(key.data)
        if time.monotonic() - reported >= _REPORT_S:
            reported = time.monotonic()
            print(made, flush=True)


class Flood:
    """The flood's process, and the count it last printed."""

    def __init__(self, address: tuple[str, int], connections: int, sources: Sequence[str]) -> None:
        self.connections = connections
        self.made = 0  # connections opened so far (the first ones, then one per close)
        root = Path(__file__).resolve().parent.parent
        argv = [*map(str, address), str(connections), ",".join(sources)]
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "tests.flooder", *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=root,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self.made = int(line)

    def wait_until_under_way(self, timeout: float = 60.0) -> None:
        """Every socket opened, and the server closing them as fast as it can."""

        def going() -> bool:
            if self._proc.poll() is not None:
                raise RuntimeError(f"the flood exited ({self._proc.returncode})")
            return self.made > 2 * self.connections

        wait_for("the flood to get under way", going, timeout)

    def stop(self) -> None:
        assert self._proc.stdin is not None
        with contextlib.suppress(OSError):
            self._proc.stdin.close()
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._reader.join(30)


@contextlib.contextmanager
def flooding(
    address: tuple[str, int], connections: int, sources: Sequence[str] = ("127.0.0.1",)
) -> Iterator[Flood]:
    """A flood of ``address`` for the ``with`` block, from ``sources`` in turn, under
    way when the block starts."""
    attack = Flood(address, connections, sources)
    try:
        attack.wait_until_under_way()
        yield attack
    finally:
        attack.stop()


if __name__ == "__main__":
    host, port, count, names = sys.argv[1:]
    flood((host, int(port)), int(count), names.split(","))
