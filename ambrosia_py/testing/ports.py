"""Free TCP ports on 127.0.0.1, for the servers that tests, demos and benches start.

A port found by binding port 0 comes from the kernel's ephemeral range, the range it
also takes every outgoing connection's source port from. Between the moment such a port
is found free and the moment a server binds it, any connection made on the machine may
take it, and the server fails with "Address already in use". So ports are picked at
random below that range (Linux: ``/proc/sys/net/ipv4/ip_local_port_range``), where only
an explicit bind can take them, each checked free by binding it; the ports of one call
are held together while it picks, so they differ, and a process does not hand out the
same port twice in a row of :data:`REMEMBERED` picks. Where the range cannot be read or
leaves no room below it, the kernel's own port-0 choice is used.
"""

from __future__ import annotations

import collections
import contextlib
import random
import socket
from pathlib import Path
from typing import Final

__all__ = ["LOWEST", "REMEMBERED", "free_port", "free_ports", "ephemeral_start"]

LOWEST: Final = 10000
"""The lowest port picked: below it lie many services' well-known ports."""
REMEMBERED: Final = 4096
"""How many picks a process remembers, not to hand a port out twice meanwhile."""
_ATTEMPTS: Final = 1000
_RANGE_FILE: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")

_rng = random.Random()  # seeded from the OS: processes pick differently
_given: collections.deque[int] = collections.deque(maxlen=REMEMBERED)


def ephemeral_start() -> int | None:
    """The first port of the kernel's ephemeral range, if it can be read."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now (see the module)."""
    start = ephemeral_start()
    with contextlib.ExitStack() as held:
        picked: list[int] = []
        if start is not None and start - LOWEST >= n:
            for _ in range(_ATTEMPTS):
                if len(picked) == n:
                    break
                port = _rng.randrange(LOWEST, start)
                if port in picked or port in _given:
                    continue
                s = held.enter_context(socket.socket())
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use (or lingering): another
                picked.append(port)
        while len(picked) < n:  # no room below the range, or all tried were taken
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            picked.append(int(s.getsockname()[1]))
        _given.extend(picked)
        return picked


def free_port() -> int:
    """One TCP port free on 127.0.0.1 right now (for a service to listen on)."""
    return free_ports(1)[0]
