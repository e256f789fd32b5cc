"""The C allocator primed at start: a small read into a 256 KiB request maps no memory.

Counted in page faults, not timed: each read that glibc serves with a fresh mapping
faults its first page in (two faults a read, seen here), one from the heap faults none
once warm. Run in a fresh interpreter, where nothing has raised glibc's threshold yet.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

READS = 500
_PROGRAM = f"""
import resource, socket, sys
from ambrosia_py.allocator import prime_allocator
if sys.argv[1] == "primed":
    prime_allocator()
a, b = socket.socketpair()
for _ in range(50):  # warm: the heap grown, the sockets' buffers faulted in
    a.send(b"x" * 20)
    b.recv(256 * 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range({READS}):
    a.send(b"x" * 20)
    b.recv(256 * 1024)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(how: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _PROGRAM, how], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_primed_reads_map_nothing() -> None:
    if _faults("as started") < READS:
        pytest.skip("this allocator serves 256 KiB requests from its heap from the start")
    assert _faults("primed") < READS // 10
