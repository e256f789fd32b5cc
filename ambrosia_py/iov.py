"""Buffers written as they are, never joined: the queue a socket sends them from.

Shared by the raw socket streams (``serving/socket_stream.py``: the binding's sockets
and the coordinator's side of them) and the coordinator's log files
(``coordinator/storage/files.py``).
"""

from __future__ import annotations

import operator
import socket
from collections import deque
from collections.abc import Callable, Sequence
from itertools import islice
from typing import Final

from .wire import Payload

__all__ = ["IOV_MAX", "advance", "byte_sized", "nbytes", "send_all", "unsent"]

IOV_MAX: Final = 1024  # buffers per sendmsg or writev call (Linux's UIO_MAXIOV)
_NBYTES = operator.attrgetter("nbytes")
_VIEW: Callable[[Payload], memoryview] = memoryview


def byte_sized(part: Payload) -> Payload:
    """``part`` as a buffer whose ``len`` counts bytes, as a socket or a file counts what
    it took: itself when it is ``bytes``, a ``bytearray`` or a flat view of bytes, else a
    view of it cast to bytes (nothing copied)."""
    if isinstance(part, memoryview) and (part.ndim != 1 or part.itemsize != 1):
        return part.cast("B")
    return part


def nbytes(parts: Sequence[Payload]) -> int:
    """The bytes in ``parts``, as a socket or a file counts them (what a view of wider
    items holds counts in bytes, not items), in C loops only: no Python call per part."""
    return sum(map(_NBYTES, map(_VIEW, parts)))


def advance(queue: deque[Payload], sent: int) -> None:
    """Drop ``sent`` bytes from the front of ``queue``; a buffer cut in two leaves a view
    of its rest (no copy)."""
    while sent:
        size = len(queue[0])
        if sent < size:
            queue[0] = memoryview(queue[0])[sent:]
            return
        queue.popleft()
        sent -= size


def unsent(parts: Sequence[Payload], sent: int) -> deque[Payload]:
    """What a write that took the first ``sent`` bytes of ``parts`` left, as a queue for
    :func:`advance` and :func:`send_all`: byte-sized, empty parts dropped, a part cut in
    two a view of its rest (no copy)."""
    queue: deque[Payload] = deque(v for v in map(byte_sized, parts) if len(v))
    advance(queue, sent)
    return queue


def send_all(sock: socket.socket, queue: deque[Payload]) -> None:
    """Send every buffer of ``queue`` on a blocking socket, resuming after short sends."""
    while queue:
        advance(queue, sock.sendmsg(list(islice(queue, IOV_MAX))))
