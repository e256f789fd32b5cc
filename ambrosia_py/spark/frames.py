"""Where the framed messages of a record end, found with as little Python as possible.

The scan (:mod:`.scan`) must walk every record's messages once: a Checkpoint's blob
follows the record, so a record holding one is longer than its length field says. The
walk is also all the per-message Python the common records need: :mod:`.calls` reads
their fields with numpy from the frame ends found here.

:func:`frame_ends` is that walk: the end of each framed message (``ZigZagInt size | type
byte | data``, reference ambrosia.md, Messages) of a record holding only RPC messages
(calls and return values: one row each), or ``None`` when the messages do not frame
cleanly up to the body's end or one is of another type (the wire decoder then decodes
the record, learns the length of a Checkpoint's blob, and says what is wrong). A record
whose messages all frame the same as its first (group commit of one call with same-size
arguments, what high-rate traffic looks like) is checked with one numpy comparison
instead of a loop.
"""

from __future__ import annotations

from typing import Any

from ..wire import MessageType, ProtocolError
from ..wire import decode_zigzag_int as zigzag_int

__all__ = ["frame_ends"]

_RPC = MessageType.RPC
_STRIDE_MIN = 8  # messages: fewer are walked (numpy costs more than it saves)


def frame_ends(raw: bytes, pos: int, end: int) -> list[int] | Any | None:
    """The end offset of each framed message in ``raw[pos:end]`` (a list, or a numpy
    array for a uniform record); ``None`` if they do not frame up to ``end`` or one is
    not an RPC (a call or a return value: one row each)."""
    if pos >= end:
        return []
    first = _frame(raw, pos, end)
    if first is None:
        return None
    stop, type_at = first
    length = stop - pos
    count, rest = divmod(end - pos, length)
    if rest == 0 and count >= _STRIDE_MIN:
        # Here, not at the top: importing ambrosia_py.spark needs no extra (NumPy comes
        # with the spark extra, which reading logs needs anyway: ``fs.py``).
        import numpy as np

        rows = np.frombuffer(raw, np.uint8, count * length, pos).reshape(count, length)
        head = type_at - pos + 1  # the size varint and the type byte
        if (rows[:, :head] == rows[0, :head]).all():
            # Every frame starts as the first: the same size, so they tile the body.
            return np.arange(stop, end + 1, length, dtype=np.int64)
    ends = [stop]
    append = ends.append
    pos = stop
    while pos < end:
        one = _frame(raw, pos, end)
        if one is None:
            return None
        pos = one[0]
        append(pos)
    return ends


def _frame(raw: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """(end, offset of the type byte) of the message framed at ``pos``, if it frames
    within ``end`` and is an RPC."""
    try:
        size, at = zigzag_int(raw, pos, end)
    except ProtocolError:
        return None
    if size < 1 or at + size > end or raw[at] != _RPC:
        return None
    return at + size, at
