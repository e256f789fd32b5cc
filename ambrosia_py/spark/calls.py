"""The rows of fork and impulse calls, read with numpy from the record bytes.

Most of a busy log is incoming fork and impulse calls: ``size | 00 (RPC) | 00 (a call) |
ZigZagInt method id | rpc type (1 fork, 2 impulse) | arguments to the end`` (reference
ambrosia.md, RPC layouts). Given where each message starts and ends (:mod:`.frames`),
every field of every such message in a buffer is read at once with numpy, and the
arguments become one Arrow binary column without a Python object per row: a
``binary_view`` array over the buffer (16 bytes per row, pointing into it), which Arrow
casts to ``binary`` in C. Python costs nothing per message here; the message walk does.

Any other message (async calls, return values, other types, anything malformed) is
flagged: :mod:`.rows` reads the records holding one on its general paths, so the rows are
the same either way (a test holds the paths to the wire decoder's rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
from numpy.lib.stride_tricks import sliding_window_view

from .schema import RPC_TYPE_NAMES

__all__ = ["CallRows", "fork_rows", "payloads"]

_PAD = 16  # zero bytes after the copied buffer, so fixed-width reads never run off it
_INLINE = 12  # binary_view: values up to this long are kept in the view itself
_MAX_OFFSET = (1 << 31) - 1
_RPC_TYPES = pa.array(list(RPC_TYPE_NAMES), pa.string())
_VIEWS = hasattr(pa, "binary_view")  # PyArrow 16 and later
_SHIFTS = (np.arange(5, dtype=np.uint64) * np.uint64(7)).astype(np.uint64)

CallRows = dict[str, Any]


def fork_rows(raw: bytes, lo: int, hi: int, starts: Any, ends: Any) -> CallRows | Any:
    """The message columns of the messages ``[starts[i], ends[i])`` of ``raw`` (all within
    ``raw[lo:hi]``), if every one is a fork or impulse call; otherwise a boolean array
    saying which messages are not."""
    data = np.zeros(hi - lo + _PAD, np.uint8)
    data[: hi - lo] = np.frombuffer(raw, np.uint8, hi - lo, lo)
    f = starts - lo
    stop = ends - lo
    n = len(f)
    # The size varint: one or two bytes but for large messages (the walk checked it).
    b0 = data[f]
    size_len = np.where(b0 < 0x80, 1, np.where(data[f + 1] < 0x80, 2, 0))
    long = size_len == 0
    if long.any():
        _, size_end, _ = _varint(data, f[long], stop[long])
        size_len[long] = size_end - f[long]
    q = f + size_len  # the type byte
    bad = (data[q] != 0) | (q + 2 >= stop) | (data[q + 1] != 0)
    method_at = q + 2
    method, after, ok = _varint(data, method_at, stop)
    bad |= ~ok | (method > 0xFFFFFFFF) | (after >= stop)
    after = np.where(bad, method_at, after)
    rpc = data[after]
    bad |= (rpc != 1) & (rpc != 2)
    if bad.any():
        return bad
    signed = (method >> np.uint64(1)).astype(np.int64) ^ -(method & np.uint64(1)).astype(np.int64)
    begin = after + 1
    lengths = stop - begin
    return {
        "msg_type": pa.repeat(pa.scalar("RPC", pa.string()), n),
        "method_id": pa.array(signed.astype(np.int32)),
        "rpc_type": _RPC_TYPES.take(pa.array(rpc)),
        "sender": pa.nulls(n, pa.string()),
        "call_seq": pa.nulls(n, pa.int64()),
        "payload_size": pa.array(lengths),
        "payload": payloads(data, begin, lengths),
        "return_type": pa.nulls(n, pa.string()),
    }


def _varint(data: Any, pos: Any, stop: Any) -> tuple[Any, Any, Any]:
    """The unsigned varints of at most five bytes at ``pos`` (each to end before its
    ``stop``): (values, end positions, which are well formed)."""
    first = data[pos]
    if (first < 0x80).all():
        return first.astype(np.uint64), pos + 1, pos < stop
    window = sliding_window_view(data, 5)[pos]
    last = window < 0x80
    length = last.argmax(axis=1) + 1
    ok = last.any(axis=1) & (pos + length <= stop)
    used = np.arange(5) < length[:, None]
    values = ((window & 0x7F).astype(np.uint64) << _SHIFTS) * used
    return values.sum(axis=1, dtype=np.uint64), pos + length, ok


def payloads(data: Any, begin: Any, lengths: Any) -> Any:
    """A ``binary`` array of ``data[begin[i] : begin[i] + lengths[i]]`` (``data`` padded
    with :data:`_PAD` zero bytes), built as views into ``data`` and cast in C."""
    n = len(begin)
    if len(data) > _MAX_OFFSET or not _VIEWS:  # a view's offset is 32-bit
        return _copied(data, begin, lengths)
    views = np.empty((n, 4), np.int32)
    raw = views.view(np.uint8).reshape(n, 16)
    raw[:, 4:] = sliding_window_view(data, _INLINE)[begin]  # inline value or prefix
    views[:, 0] = lengths
    inline = lengths <= _INLINE
    # Bytes of an inline value past its length must be zero.
    raw[:, 4:] *= (np.arange(_INLINE) < lengths[:, None]) | ~inline[:, None]
    views[:, 2] = np.where(inline, views[:, 2], 0)  # buffer index
    views[:, 3] = np.where(inline, views[:, 3], begin)  # offset
    array = pa.Array.from_buffers(
        pa.binary_view(), n, [None, pa.py_buffer(views), pa.py_buffer(data)]
    )
    try:
        return array.cast(pa.binary())
    except pa.ArrowNotImplementedError:  # a PyArrow that cannot cast views yet
        return _copied(data, begin, lengths)


def _copied(data: Any, begin: Any, lengths: Any) -> Any:
    """The same array, the values gathered into one buffer with numpy."""
    offsets = np.zeros(len(begin) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    index = np.repeat(begin - offsets[:-1], lengths) + np.arange(offsets[-1])
    values = pa.py_buffer(data[index])
    if offsets[-1] > _MAX_OFFSET:
        return pa.Array.from_buffers(
            pa.large_binary(), len(begin), [None, pa.py_buffer(offsets), values]
        ).cast(pa.binary())  # Arrow says what is too large
    return pa.Array.from_buffers(
        pa.binary(), len(begin), [None, pa.py_buffer(offsets.astype(np.int32)), values]
    )
