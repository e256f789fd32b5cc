"""The C twin of a small link frame's flow and tag work (``_clink.c``); the flow reader,
``encode_frame`` and ``LinkChannel.open``/``seal`` stay the reference."""

from collections.abc import Callable

def init(checksum: Callable[[bytes | memoryview], int], /) -> None: ...
def mac_state(key: bytes, /) -> bytes: ...
def hmac(state: bytes, data: bytes | memoryview, /) -> bytes: ...
def open_frame(
    data: bytes, max_length: int, state: bytes, counter: int, first: int, second: int, /
) -> bytes | None: ...
def seal_frame(
    parts: tuple[bytes, ...],
    max_length: int,
    state: bytes,
    counter: int,
    first: int,
    second: int,
    /,
) -> bytes | None: ...
