"""The rows of calls and return values, read with numpy from the record bytes.

Most of a busy log is incoming calls and return values: ``size | 00 (RPC) | 00 (a call)
| ZigZagInt method id | rpc type (0 async, 1 fork, 2 impulse) | async only: sender,
ZigZagLong call seq | arguments to the end``, or ``size | 00 | return type (1 value, 2
none, 3 exception) | sender | call seq | value and exception only: ZigZagInt length,
bytes`` (reference ambrosia.md, RPC layouts). Given where each message starts and ends
(:mod:`.frames`), every field of every such message in a buffer is read at once with
numpy, and the payloads become one Arrow binary column without a Python object per row:
a ``binary_view`` array over the buffer (16 bytes per row, pointing into it), which
Arrow casts to ``binary`` in C. Python costs nothing per message here; the walk does.

Sender names are decoded once per distinct name. Any other message (other types, a
varint longer than this reads, a sender that is not UTF-8, anything malformed) is
flagged: :mod:`.rows` reads the records holding one on its general paths, so the rows are
the same either way (a test holds the paths to the wire decoder's rows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
from numpy.lib.stride_tricks import sliding_window_view

from .schema import RETURN_TYPE_NAMES, RPC_TYPE_NAMES

__all__ = ["CallRows", "call_rows", "payloads"]

_PAD = 24  # zero bytes after the copied buffer, so fixed-width reads never run off it
_INLINE = 12  # binary_view: values up to this long are kept in the view itself
_MAX_OFFSET = (1 << 31) - 1
_RPC_TYPES = pa.array([*RPC_TYPE_NAMES, "return"], pa.string())
_VIEWS = hasattr(pa, "binary_view")  # PyArrow 16 and later
_SHIFTS = (np.arange(9, dtype=np.uint64) * np.uint64(7)).astype(np.uint64)
_RETURN_TYPES = pa.array([None, *(RETURN_TYPE_NAMES[k] for k in (1, 2, 3))], pa.string())

CallRows = dict[str, Any]


def call_rows(raw: bytes, lo: int, hi: int, starts: Any, ends: Any) -> CallRows | Any:
    """The message columns of the messages ``[starts[i], ends[i])`` of ``raw`` (all within
    ``raw[lo:hi]``), if every one is a call or a return value that reads here; otherwise a
    boolean array saying which messages do not (they are read on the general paths)."""
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
    bad = (data[q] != 0) | (q + 2 >= stop)
    kind = data[q + 1]
    call = kind == 0
    bad |= kind > 3
    method_at = q + 2
    method, after, ok = _varint(data, method_at, stop)
    bad |= call & (~ok | (method > 0xFFFFFFFF) | (after >= stop))
    after = np.where(call & ~bad, after, method_at)
    rpc = np.where(call, data[after], 3)
    bad |= call & (rpc > 2)
    named = ~call | (rpc == 0)  # a sender and a call seq follow
    begin = after + 1
    sender, call_seq = pa.nulls(n, pa.string()), pa.nulls(n, pa.int64())
    if named.any():
        sender, call_seq, begin, bad = _named(data, q, stop, kind, call, after, named, bad)
    if bad.any():
        return bad
    lengths = stop - begin  # a return value's length came before it: the same
    method_ids = pa.array(_zigzag(method).astype(np.int32), mask=~call)
    rpc_types = _RPC_TYPES.take(pa.array(rpc))  # 3: a return value
    returns = None if call.all() else _RETURN_TYPES.take(pa.array(kind, mask=call))
    return {
        "msg_type": pa.repeat(pa.scalar("RPC", pa.string()), n),
        "method_id": method_ids,
        "rpc_type": rpc_types,
        "sender": sender,
        "call_seq": call_seq,
        "payload_size": pa.array(lengths),
        "payload": payloads(data, begin, lengths),
        "return_type": pa.nulls(n, pa.string()) if returns is None else returns,
    }


def _named(
    data: Any, q: Any, stop: Any, kind: Any, call: Any, after: Any, named: Any, bad: Any
) -> tuple[Any, Any, Any, Any]:
    """The sender and call seq of async calls and return values (null for other calls),
    where each message's payload begins, and ``bad`` with the messages that do not read
    here added."""
    name_at = np.where(call, after + 1, q + 2)
    size, name_begin, ok = _varint(data, name_at, stop)
    size = _zigzag(size)
    bad = bad | (named & (~ok | (size < 0) | (name_begin + size > stop)))
    size = np.where(named & ~bad, size, 0)
    name_end = name_begin + size
    seq, seq_end, ok = _varint(data, name_end, stop, 9)
    bad |= named & ~ok
    begin = np.where(named & ~bad, seq_end, after + 1)
    value = named & ~call & (kind != 2)  # a value or an exception: its length first
    length, value_begin, ok = _varint(data, begin, stop)
    length = _zigzag(length)
    bad |= value & (~ok | (length < 0))
    begin = np.where(value & ~bad, value_begin, begin)
    ends_at = np.where(value, begin + np.maximum(length, 0), begin)
    bad |= named & ~call & (ends_at != stop)  # nothing may follow a return value
    senders = _names(data, np.where(named, name_begin, 0), size, named)
    if senders is None:  # a sender that is not UTF-8: the wire decoder says so
        return pa.nulls(len(q)), pa.nulls(len(q)), begin, bad | named
    call_seqs = pa.array(_zigzag(seq), mask=~named)
    return senders, call_seqs, begin, bad


def _names(data: Any, begin: Any, lengths: Any, valid: Any) -> Any:
    """A string array of the names at ``begin`` (null where not ``valid``), each distinct
    name decoded once by Python (the wire decoder's UTF-8 rule); ``None`` if one is not
    UTF-8."""
    codes = payloads(data, begin, lengths).dictionary_encode()
    try:
        names = [bytes(v).decode("utf-8") for v in codes.dictionary.to_pylist()]
    except UnicodeDecodeError:
        return None
    indices = pa.array(codes.indices.to_numpy(zero_copy_only=False), mask=~valid)
    return pa.array(names, pa.string()).take(indices)


def _zigzag(n: Any) -> Any:
    """Signed values of unsigned zig-zag encoded ``n``."""
    return (n >> np.uint64(1)).astype(np.int64) ^ -(n & np.uint64(1)).astype(np.int64)


def _varint(data: Any, pos: Any, stop: Any, width: int = 5) -> tuple[Any, Any, Any]:
    """The unsigned varints of at most ``width`` bytes at ``pos`` (each to end by its
    ``stop``; five bytes: a ZigZagInt, at most 32 bits; nine: a ZigZagLong of up to 63
    bits, longer ones read on the general path): (values, end positions, which are well
    formed)."""
    first = data[pos]
    if (first < 0x80).all():
        return first.astype(np.uint64), pos + 1, pos < stop
    window = sliding_window_view(data, width)[pos]
    last = window < 0x80
    length = last.argmax(axis=1) + 1
    ok = last.any(axis=1) & (pos + length <= stop)
    used = np.arange(width) < length[:, None]
    values = ((window & 0x7F).astype(np.uint64) << _SHIFTS[:width]) * used
    total = values.sum(axis=1, dtype=np.uint64)
    if width == 5:
        ok &= total <= 0xFFFFFFFF
    return total, pos + length, ok


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
