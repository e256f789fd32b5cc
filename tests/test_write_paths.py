"""The one-call write paths: a log append and a record to the binding go out in one
``pwritev`` / ``sendmsg`` when it takes everything, and anything cut short (a short write,
a full socket) goes on from the exact byte where it stopped, whatever the parts are."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ambrosia_py.coordinator.core.binding_link import BindingLink
from ambrosia_py.coordinator.storage import files as storage
from ambrosia_py.iov import nbytes

RAW = bytes(range(256)) * 64  # 16 KiB


def _parts() -> list[bytes | bytearray | memoryview]:
    return [
        RAW[:100],
        b"",
        memoryview(RAW)[100:4196].cast("I"),  # 4,096 bytes counted as 1,024 items
        bytearray(RAW[4196:5000]),
        memoryview(RAW)[5000:],
    ]


def test_nbytes_counts_bytes_not_items() -> None:
    parts = _parts()
    assert nbytes(parts) == len(RAW)
    assert sum(map(len, parts)) < len(RAW)  # what len alone would have said
    assert nbytes([]) == 0


@given(st.lists(st.integers(1, 3000), min_size=1, max_size=5))
def test_a_log_append_cut_short_goes_on_where_it_stopped(cuts: list[int]) -> None:
    """``pwritev`` made to take a few bytes at a time: the file still gets every byte of
    every part once, in order, from the offset asked for."""
    takes = iter(cuts)
    real = os.pwritev

    def short_pwritev(fd: int, buffers: list[bytes | memoryview], at: int) -> int:
        limit = next(takes, None)
        data = b"".join(bytes(b) for b in buffers)
        return real(fd, [data if limit is None else data[:limit]], at)

    with pytest.MonkeyPatch.context() as mp, _tempfile() as (fd, path):
        os.write(fd, b"before")
        mp.setattr(storage.os, "pwritev", short_pwritev)
        assert storage._write_all(fd, _parts(), 6) == len(RAW)
        assert path.read_bytes() == b"before" + RAW


class _tempfile:
    def __enter__(self) -> tuple[int, Path]:
        import tempfile

        self._dir = tempfile.TemporaryDirectory()
        path = Path(self._dir.name) / "log"
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        return self.fd, path

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)
        self._dir.cleanup()


def test_a_record_larger_than_the_socket_takes_reaches_the_binding_whole_and_in_order() -> None:
    """The first ``sendmsg`` takes part of a record (a small socket buffer, nobody
    reading yet); the rest, and a record written after it, follow in order."""

    async def main() -> bytes:
        receive, _unused = socket.socketpair()
        send, binding = socket.socketpair()
        send.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        link = BindingLink(receive, send)
        got = bytearray()
        reader = threading.Thread(target=lambda: _read(binding, got, 2 * len(RAW)))
        try:
            link.write(_parts())
            assert not link.flushed  # the socket did not take it all: the rest is queued
            link.write([RAW])  # behind it
            reader.start()
            await asyncio.wait_for(link.drain(), 30)
            reader.join(30)
        finally:
            link.close()
            binding.close()
            _unused.close()
        return bytes(got)

    assert asyncio.run(main()) == RAW + RAW


def _read(sock: socket.socket, into: bytearray, n: int) -> None:
    sock.settimeout(30)
    while len(into) < n:
        data = sock.recv(65536)
        if not data:
            return
        into += data
