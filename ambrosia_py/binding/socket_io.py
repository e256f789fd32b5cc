"""The binding's end of its two coordinator sockets: connecting to the coordinator, and
the stream each is read and written through.

Raw sockets, not asyncio's streams or transports: every byte of every call goes through
them, and those copy each read and write (the reasons, and how the stream avoids the
copies, are :mod:`ambrosia_py.serving.socket_stream`'s). What is the binding's own is
here: how it connects, and how much it lets wait for the coordinator.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Final

from ..serving.socket_stream import READ_SIZE
from ..serving.socket_stream import SocketStream as _SocketStream

__all__ = ["HIGH_WATER", "READ_SIZE", "SocketStream", "open_socket"]

# drain() waits while more than this is queued. Queued buffers are the encoder's own (no
# copy), so the mark bounds memory the binding holds anyway, not memory it adds; it is
# large enough that the binding goes on handling records while the coordinator takes a
# few 64 KiB calls (a socket buffer's worth, about a group commit's), small enough that a
# binding producing faster than its coordinator logs is held back within a few
# milliseconds of the coordinator's work.
HIGH_WATER: Final = 1 << 20


async def open_socket(host: str, port: int) -> socket.socket:
    """A non-blocking TCP connection to ``host:port`` (each address in turn), Nagle off.

    Nagle's algorithm off as asyncio's transports have it: the binding writes whole
    records and waits for answers, which Nagle would hold back for an acknowledgement.
    """
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    errors: list[OSError] = []
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setblocking(False)
            if family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await loop.sock_connect(sock, address)
        except OSError as exc:
            sock.close()
            errors.append(exc)
        except BaseException:
            sock.close()
            raise
        else:
            return sock
    if len(errors) == 1:
        raise errors[0]
    raise OSError(f"cannot connect to {host}:{port}: " + "; ".join(map(str, errors)))


class SocketStream(_SocketStream):
    """One of the binding's sockets to its coordinator (see
    :class:`ambrosia_py.serving.socket_stream.SocketStream`): the binding's high-water
    mark, and a lost connection named as the coordinator's."""

    def __init__(self, sock: socket.socket, high_water: int = HIGH_WATER) -> None:
        super().__init__(sock, high_water, "the connection to the coordinator")
