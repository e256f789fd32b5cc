"""``LinkConn``'s writes: large frames go to the socket as their parts, unjoined.

A frame of large parts is written with ``writev`` straight to the socket while the
transport holds nothing, and what the socket does not take goes to the transport; small
parts, and everything over TLS, take the joined path. Whatever the path, the peer reads
the same frames in the order written: checked here from the layouts (``tests/link_peer``),
with the socket's send buffer made small so that writes are cut anywhere.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import struct
from pathlib import Path

import pytest
import xxhash

from ambrosia_py.coordinator.links.conn import LinkConn
from ambrosia_py.iov import IOV_MAX
from ambrosia_py.serving.transport_stream import TransportStream
from tests.certs import needs_openssl
from tests.link_peer import LINK_TOKEN, PING_TOKEN, Keys
from tests.test_link_conn import _open, _pair, _tls

Writes = list[tuple[bytes, ...] | None]  # a frame's parts, or None for a ping


def _writes() -> Writes:
    """Large frames (the parts path) between small ones and pings (the joined path)."""
    big = [bytes([n]) * size for n, size in enumerate((65_600, 200_000, 4096, 70_001), 1)]
    out: Writes = []
    for i in range(12):
        out.append((big[i % 4], big[(i + 1) % 4]))  # ~135-270 KiB, two parts
        out.append((b"small %d" % i, b"x" * 20))
        if i % 3 == 0:
            out.append(None)
        out.append((big[i % 4],))
    out.append(None)  # the transport drained: the next frame goes to writev
    out.append(tuple(bytes([n % 256]) * 4096 for n in range(1100)))  # more than IOV_MAX
    return out


async def _read_frames(
    reader: asyncio.StreamReader, keys: Keys, n: int
) -> list[tuple[bytes, bytes]]:
    """``n`` frames as the peer reads them: (token, payload), checksum and tag checked
    (the checksummed form under TLS too: the test's FlowConnection is made so)."""
    out = []
    for _ in range(n):
        length, digest = struct.unpack("<IQ", await reader.readexactly(12))
        token = await reader.readexactly(16)
        message = await reader.readexactly(length - 16)
        assert xxhash.xxh3_64_intdigest(token + message) == digest
        out.append((token, keys.open(token, message)))
    return out


async def _write_all(
    tls: tuple[ssl.SSLContext, ssl.SSLContext] | None, writev_calls: list[int]
) -> None:
    conn, reader, writer = await _pair(tls)
    keys, _ = await _open(conn, writer)
    conn.flow.max_frame_length = 1 << 23
    packet = conn.flow.connect_packet_bytes()  # ours, before any frame
    conn.transport.write(packet)
    assert await reader.readexactly(len(packet)) == packet
    sock = conn.transport.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)  # writes cut anywhere
    writes = _writes()
    reading = asyncio.ensure_future(_read_frames(reader, keys, len(writes)))
    queued_at_some_point = False
    async with asyncio.timeout(60):
        for parts in writes:
            if parts is None:
                await conn.ping()  # waits for the transport to drain
            else:
                conn.write(*parts)  # does not
            queued_at_some_point |= conn.queued > 0
        got = await reading
    assert queued_at_some_point  # the socket did not take everything: the rest was queued
    expected = [
        (PING_TOKEN, b"") if parts is None else (LINK_TOKEN, b"".join(parts)) for parts in writes
    ]
    assert got == expected
    await conn.drain()
    assert conn.queued == 0
    if tls is None:
        assert writev_calls  # large frames went straight to the socket as parts
        assert max(writev_calls) == IOV_MAX  # at most IOV_MAX buffers in one call
    else:
        assert not writev_calls  # no raw socket to write to under TLS
    conn.close()
    writer.close()


def _count_writev(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = os.writev

    def writev(fd: int, buffers: list[bytes | memoryview]) -> int:
        calls.append(len(buffers))
        return real(fd, buffers)

    monkeypatch.setattr(os, "writev", writev)
    return calls


def test_large_frames_go_out_as_parts_in_order_with_small_ones_and_pings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asyncio.run(_write_all(None, _count_writev(monkeypatch)))


@needs_openssl
def test_over_tls_the_same_frames_go_out_through_the_transport(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asyncio.run(_write_all(_tls(tmp_path), _count_writev(monkeypatch)))


async def _write_after_reset() -> None:
    conn, _, writer = await _pair()
    await _open(conn, writer)
    conn.transport.write(conn.flow.connect_packet_bytes())
    peer = writer.transport.get_extra_info("socket")
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # a reset
    await asyncio.sleep(0)
    deadline = asyncio.get_running_loop().time() + 30
    # Writing on: the first writes may still be taken; then the transport meets the reset
    # on its own write, and the connection ends, as it does for the joined path.
    while not conn.closing:
        assert asyncio.get_running_loop().time() < deadline
        conn.write(b"z" * 100_000)
        await asyncio.sleep(0.01)
    with pytest.raises((ConnectionError, OSError)):
        async with asyncio.timeout(30):
            await conn.send(b"z" * 100_000)


def test_a_write_to_a_reset_connection_ends_it_without_raising_from_write() -> None:
    asyncio.run(_write_after_reset())


def _writes_to_its_socket(conn: LinkConn) -> bool:
    stream = conn.transport.get_protocol()
    assert isinstance(stream, TransportStream)
    return stream.direct


async def _fd_only_for_plain_tcp(tls: tuple[ssl.SSLContext, ssl.SSLContext] | None) -> None:
    conn, _, writer = await _pair(tls)
    assert _writes_to_its_socket(conn) == (tls is None)
    conn.close()
    writer.close()


@needs_openssl
def test_only_a_plain_tcp_connection_writes_to_its_socket(tmp_path: Path) -> None:
    asyncio.run(_fd_only_for_plain_tcp(None))
    asyncio.run(_fd_only_for_plain_tcp(_tls(tmp_path)))
