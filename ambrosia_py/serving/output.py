"""Back-pressure on what a server writes: a peer that reads nothing cannot fill memory.

A server writes replies into its transport's buffer and moves on; a peer that stops
reading would make that buffer grow without bound. Every stream server therefore sets
the high-water mark of each connection to its ``max_buffered_output``
(:func:`limit_output`) and, before it reads the next request, waits for room
(:func:`wait_for_room`): a connection over the bound is not read, so it cannot ask for
more, and one that stays over it for ``output_stall_s`` is closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from .admission import ConnectionLimits

__all__ = ["OutputStalled", "buffered_output", "limit_output", "reset", "wait_for_room"]

_LINGER_NONE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: the close resets


class OutputStalled(TimeoutError):
    """A peer left more than the bound of our output unread for too long."""


def limit_output(writer: asyncio.StreamWriter, limits: ConnectionLimits) -> None:
    """Pause the connection's writer (``drain`` waits) past ``max_buffered_output``."""
    writer.transport.set_write_buffer_limits(high=limits.max_buffered_output)


def buffered_output(writer: asyncio.StreamWriter) -> int:
    """Bytes written to the connection and not yet taken by the kernel."""
    return writer.transport.get_write_buffer_size()


async def wait_for_room(writer: asyncio.StreamWriter, limits: ConnectionLimits) -> None:
    """Return once the connection's unsent output is under the bound (at once if it
    is); raise :class:`OutputStalled` if it stays over for ``output_stall_s``."""
    if buffered_output(writer) <= limits.max_buffered_output:
        return
    try:
        async with asyncio.timeout(limits.output_stall_s):
            await writer.drain()
    except TimeoutError:
        raise OutputStalled(
            f"the peer left {buffered_output(writer)} bytes of output unread for "
            f"{limits.output_stall_s:g} s (the bound is {limits.max_buffered_output})"
        ) from None


def reset(writer: asyncio.StreamWriter) -> None:
    """Drop a connection now, with a reset rather than a FIN.

    For a connection the server drops (evicted, refused, stalled): a plain close would
    leave the kernel sending what is queued (megabytes, to a peer that reads nothing)
    before its FIN, and a TIME_WAIT behind for each connection of a flood; and a client
    sees a failed connection, which it retries, not an orderly close, which some
    protocols read as an answer (the ingress's client takes a close after its proof for
    a wrong secret).
    """
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError, ValueError):  # ValueError: closed already
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
    writer.transport.abort()
