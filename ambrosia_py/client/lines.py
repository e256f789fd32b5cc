"""One request to a service's line-protocol port: a JSON object per line each way.

A service may offer its operators such a port beside its own protocol (the Wallaroo
worker's ``--control``: ``docs/wallaroo.md``, *Operators*). :func:`ask` is the whole
client: it connects, writes the request as one line, reads the one line that answers it
and closes. Whatever the port checks (a cookie, an ``op``) travels in the request; this
module knows no service's fields. Blocking, for command-line tools and tests.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping
from typing import Any

from .calls import client_address

__all__ = ["ask"]


def ask(address: str | tuple[str, int], request: Mapping[str, Any], timeout: float = 10.0) -> Any:
    """Send ``request`` to ``address`` (``HOST:PORT``) as one JSON line; its JSON answer.

    OSError (TimeoutError included) if the port cannot be reached or does not answer
    within ``timeout`` seconds, ConnectionError if it closes without answering,
    ValueError for an address that is not ``HOST:PORT`` (or ``PORT``, on the loopback)
    or an answer that is not JSON.
    """
    host, port = client_address(address)
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(json.dumps(dict(request)).encode() + b"\n")
        with sock.makefile("rb") as answers:
            line = answers.readline()
    if not line:
        raise ConnectionError(f"{host}:{port} closed the connection without an answer")
    return json.loads(line)
