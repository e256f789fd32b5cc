"""Free ports for the servers tests start are picked below the kernel's ephemeral range,
where no outgoing connection's source port can take them before the server binds."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from ambrosia_py.testing import ports


def kernel_range() -> tuple[int, int]:
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    return int(low), int(high)


def test_ports_are_distinct_free_and_below_the_ephemeral_range() -> None:
    low, _ = kernel_range()
    picked = ports.free_ports(64)
    assert len(set(picked)) == 64
    assert all(ports.LOWEST <= p < low for p in picked)
    for port in picked:  # each free: a server can bind it now
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert not set(picked) & set(ports.free_ports(64))  # not handed out again at once


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        # A range of one port below the ephemeral start, the taken one: the picker
        # falls back to the kernel's choice rather than return it.
        monkeypatch.setattr(ports, "LOWEST", port)
        monkeypatch.setattr(ports, "ephemeral_start", lambda: port + 1)
        monkeypatch.setattr(ports, "_given", ports.collections.deque(maxlen=8))
        got = ports.free_ports(1)
    assert got != [port]


def test_without_the_kernel_range_the_kernel_chooses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_start", lambda: None)
    low, high = kernel_range()
    picked = ports.free_ports(3)
    assert len(set(picked)) == 3 and all(low <= p <= high for p in picked)
