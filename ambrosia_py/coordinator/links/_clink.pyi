"""The C twin of a small link frame's flow and tag work (``_clink.c``: OpenSSL's
HMAC-SHA256, libxxhash's XXH3); the flow reader, ``encode_frame`` and
``LinkChannel.open``/``seal`` stay the reference. A MAC state is an opaque keyed
context (a capsule) that only :func:`mac_state` makes."""

def mac_state(key: bytes, /) -> object: ...
def hmac(state: object, data: bytes | memoryview, /) -> bytes: ...
def open_frame(
    data: bytes, max_length: int, state: object, counter: int, first: int, second: int, /
) -> bytes | None: ...
def seal_frame(
    parts: tuple[bytes, ...],
    max_length: int,
    state: object,
    counter: int,
    first: int,
    second: int,
    /,
) -> bytes | None: ...
