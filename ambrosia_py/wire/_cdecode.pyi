"""The C accelerator of ``decoding.decode_messages`` and ``routing.count_replayable``
(``_cdecode.c``); their general paths in Python are the references it is held to."""

from .messages import IncomingReturnValue, IncomingRpc, Message, ReturnType, RpcType

def init(
    cls: type[IncomingRpc], descriptors: tuple[object, ...], rpc_types: tuple[RpcType, ...], /
) -> None: ...
def init_returns(
    cls: type[IncomingReturnValue],
    descriptors: tuple[object, ...],
    return_types: tuple[ReturnType, ...],
    /,
) -> None: ...
def decode_calls(mv: memoryview, pos: int, end: int, out: list[Message], /) -> int: ...
def count_replayable(body: bytes | bytearray | memoryview, start: int = 0, /) -> int: ...
