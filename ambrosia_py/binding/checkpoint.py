"""The binding's checkpoint blob: ``b"AMBPYCK" | u16 format version | lz4 frame``.

The lz4 frame holds a cloudpickle of :class:`Snapshot`: the immortal's state (its
``__dict__``: attributes are state), the dispatcher's counters, its ingress hook (the
ingress's key table, framework state beside the immortal's: ``hooks.py``,
``ingress/keys.py``), and the *tail*: the messages handled since that state was taken.
The base and the tail are kept as records are handled by ``dispatch_state.py``.

Format 2 added the key table. Format 1 blobs still load, with an empty table (they were
written before there was one); a binding that knows only format 1 refuses format 2
rather than load it and lose the table.

Why a tail: the coordinator may ask for a checkpoint while handlers are suspended
awaiting replies, and a suspended coroutine cannot be pickled. So a checkpoint taken
when nothing is in flight holds the state and an empty tail; one taken while coroutines
wait holds the last such state plus every message handled since, and restoring it
replays those messages (with their outputs suppressed: they were sent before the
checkpoint) to rebuild the waiting coroutines exactly.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs
import cloudpickle
import lz4.frame

from .. import crashpoints
from .errors import CheckpointFormatError
from .hooks import IngressHook

__all__ = ["FORMAT_VERSION", "Snapshot", "decode_snapshot", "encode_snapshot"]

MAGIC = b"AMBPYCK"
FORMAT_VERSION = 2
_READABLE = (1, 2)
_HEADER = struct.Struct("<7sH")


@attrs.frozen
class Snapshot:
    """What a checkpoint restores."""

    class_name: str  # module:qualname of the immortal's class, for a clear error on mismatch
    class_version: int
    state: dict[str, Any]
    call_seq: int
    attached: frozenset[str]
    tail: tuple[bytes, ...] = ()  # framed incoming messages handled since ``state``
    # The ingress hook (``hooks.py``; the ingress's key table, ``ingress/keys.py``) as of
    # ``state``: pickled by reference to its class, so it loads as the class it was.
    ingress: IngressHook[Any] | None = None


def encode_snapshot(snapshot: Snapshot) -> bytes:
    body: bytes = lz4.frame.compress(cloudpickle.dumps(snapshot))
    crashpoints.reach("binding.checkpoint")  # taken, not yet handed to the coordinator
    return _HEADER.pack(MAGIC, FORMAT_VERSION) + body


def decode_snapshot(blob: bytes | bytearray | memoryview) -> Snapshot:
    data = bytes(blob)
    if len(data) < _HEADER.size:
        raise CheckpointFormatError(f"checkpoint of {len(data)} bytes is too short")
    magic, version = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointFormatError(f"not an ambrosia-py checkpoint (magic {magic!r})")
    if version not in _READABLE:
        raise CheckpointFormatError(
            f"checkpoint format version {version}, expected one of {list(_READABLE)}"
        )
    try:
        snapshot = cloudpickle.loads(lz4.frame.decompress(data[_HEADER.size :]))
    except Exception as exc:
        raise CheckpointFormatError(f"checkpoint body does not load: {exc}") from exc
    if not isinstance(snapshot, Snapshot):
        raise CheckpointFormatError(f"checkpoint holds a {type(snapshot).__name__}")
    if version == 1:  # pickled before the field existed: unpickling left it unset
        fields = {f.name: getattr(snapshot, f.name) for f in attrs.fields(Snapshot)[:-1]}
        snapshot = Snapshot(**fields, ingress=None)
    return snapshot
