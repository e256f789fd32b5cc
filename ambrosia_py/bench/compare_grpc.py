"""The non-durable peer for ``bench compare``: gRPC client-streaming between two processes.

What the AMBROSIA paper compared itself with, and what a user would pick for calls
between Python services that need no durability. Raw bytes, as ours: a generic handler
with no serializers on either side (grpcio passes ``bytes`` through untouched), so no
protobuf and no generated code. The server (:func:`serve`, a process of its own) counts
the messages of each client stream and answers the count; the figure is messages over
the time from the first message to that answer.

grpcio is optional (the ``bench`` extra); :func:`available` says whether it is installed.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..extras import missing
from .compare_limits import ServerProcess

__all__ = ["available", "grpc_server", "measure_grpc", "serve"]

_SERVICE = "ambrosia.bench.Compare"
_METHOD = f"/{_SERVICE}/Stream"
# 64 KiB messages pass the 4 MiB default anyway; no limit should decide a figure.
_OPTIONS = [
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
]


def available() -> bool:
    """grpcio is installed (``pip install -e '.[bench]'``)."""
    return not missing("grpc")


def _count(requests: Iterable[bytes], context: Any) -> bytes:
    n = 0
    for _ in requests:
        n += 1
    return n.to_bytes(8, "big")


def serve(port_file: str) -> None:
    """The server process: listen on a free port, write it to ``port_file``, count."""
    from concurrent import futures

    import grpc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=_OPTIONS)
    handler = grpc.stream_unary_rpc_method_handler(_count)  # no (de)serializers: bytes
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(_SERVICE, {"Stream": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(port_file).write_text(str(port))
    server.wait_for_termination()


def grpc_server(directory: Path) -> ServerProcess:
    """The gRPC server (:func:`serve`) in its own process."""
    return ServerProcess(__name__, directory / "grpc.port", 60.0)


def measure_grpc(port: int, size: int, count: int) -> float:
    """Messages per second of ``size`` bytes in one client-streaming call."""
    import grpc  # type: ignore[import-untyped,import-not-found,unused-ignore]

    payload = b"x" * size
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS) as channel:
        grpc.channel_ready_future(channel).result(timeout=30)
        stream = channel.stream_unary(_METHOD)  # no (de)serializers: bytes both ways
        start = time.perf_counter()
        answer = stream(payload for _ in range(count))
        elapsed = time.perf_counter() - start
    got = int.from_bytes(answer, "big")
    if got != count:
        raise RuntimeError(f"gRPC server counted {got} messages of {size} B, sent {count}")
    return count / elapsed
