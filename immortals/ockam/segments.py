"""Where a stream's messages live: an open tail in the state, sealed segments in files.

A hub holding millions of messages must not pickle all of them into every checkpoint
(issue: *State that grows*). Each stream (and partition) keeps its newest messages in an
open tail, part of the pickled state. When the tail reaches :data:`SEAL_MESSAGES`
messages or :data:`SEAL_BYTES` bytes it is sealed into a :class:`Segment`: immutable,
named by the XXH3-128 hash of its file's bytes. While a checkpoint is pickled, a segment
not yet on disk writes its file once (``ambrosia_py.binding.files``) and pickles as its
name, count and times; afterwards its bytes leave memory and are read back (through a
small cache) when a pull needs them. A checkpoint therefore holds the open tails plus
about 60 bytes per sealed segment, and writes only the segments sealed since the last
one.

Sealing happens in handlers, from logged input only (message counts and sizes), so
replay seals the same segments with the same names. Nothing here reads a clock.

Segment file layout (little-endian): ``b"OCKSEG1\\n"``, u32 count, ``count`` u32 end
offsets of the payloads, ``count`` u64 arrival times (ms, from the logged frames), then
the payloads back to back. Reading a file checks its hash against its name: a damaged
segment is an error naming the file, never served.
"""

from __future__ import annotations

import struct
from array import array
from collections import OrderedDict
from typing import Any

import xxhash

from ambrosia_py.binding.files import current_state_files

__all__ = ["SEAL_BYTES", "SEAL_MESSAGES", "Segment", "SegmentError", "StreamLog"]

SEAL_MESSAGES = 2048
SEAL_BYTES = 512 * 1024
_MAGIC = b"OCKSEG1\n"
_HEAD = struct.Struct("<8sI")
_CACHE_BYTES = 64 * 1024 * 1024


class SegmentError(Exception):
    """A segment file that is missing, damaged or not what its name says."""


class _Body:
    """A segment's payloads in memory: one buffer, end offsets and arrival times."""

    __slots__ = ("data", "ends", "times")

    def __init__(self, data: bytes, ends: array[int], times: array[int]) -> None:
        self.data = data
        self.ends = ends
        self.times = times

    def payload(self, i: int) -> bytes:
        start = self.ends[i - 1] if i else 0
        return self.data[start : self.ends[i]]


_cache: OrderedDict[str, _Body] = OrderedDict()
_cache_bytes = 0


def _cached(name: str) -> _Body | None:
    body = _cache.get(name)
    if body is not None:
        _cache.move_to_end(name)
    return body


def _remember(name: str, body: _Body) -> None:
    global _cache_bytes
    if name in _cache:
        return
    _cache[name] = body
    _cache_bytes += len(body.data)
    while _cache_bytes > _CACHE_BYTES and len(_cache) > 1:
        _, old = _cache.popitem(last=False)
        _cache_bytes -= len(old.data)


def _file_bytes(body: _Body) -> bytes:
    ends = array("I", body.ends)
    times = array("Q", body.times)
    if ends.itemsize != 4 or times.itemsize != 8:  # pragma: no cover - exotic platforms
        raise SegmentError("this platform's array types do not have the segment's sizes")
    return b"".join([_HEAD.pack(_MAGIC, len(ends)), ends.tobytes(), times.tobytes(), body.data])


def _name_of(file_bytes: bytes) -> str:
    return "seg-" + xxhash.xxh3_128_hexdigest(file_bytes)


def _parse(name: str, raw: bytes) -> _Body:
    where = f"segment file {name}"
    if _name_of(raw) != name:
        raise SegmentError(f"{where}: its bytes do not match its name (damaged)")
    magic, count = _HEAD.unpack_from(raw)
    if magic != _MAGIC:
        raise SegmentError(f"{where}: bad magic {magic!r}")
    pos = _HEAD.size
    ends = array("I")
    ends.frombytes(raw[pos : pos + 4 * count])
    pos += 4 * count
    times = array("Q")
    times.frombytes(raw[pos : pos + 8 * count])
    pos += 8 * count
    return _Body(raw[pos:], ends, times)


class Segment:
    """A sealed, immutable run of messages; pickles as a reference once its file exists."""

    __slots__ = ("_body", "count", "first_time", "last_time", "name", "nbytes")

    def __init__(
        self,
        name: str,
        count: int,
        nbytes: int,
        first_time: int,
        last_time: int,
        body: _Body | None = None,
    ) -> None:
        self.name = name
        self.count = count
        self.nbytes = nbytes
        self.first_time = first_time
        self.last_time = last_time
        self._body = body

    @classmethod
    def seal(cls, payloads: list[bytes], times: list[int]) -> Segment:
        ends = array("I")
        total = 0
        for p in payloads:
            total += len(p)
            ends.append(total)
        body = _Body(b"".join(payloads), ends, array("Q", times))
        name = _name_of(_file_bytes(body))
        return cls(name, len(payloads), total, times[0], times[-1], body)

    def body(self) -> _Body:
        """The payloads, from memory, the cache or the segment's file."""
        if self._body is not None:
            return self._body
        body = _cached(self.name)
        if body is None:
            files = current_state_files()
            if files is None:
                raise SegmentError(f"segment {self.name}: no state files are set to read it")
            try:
                raw = files.read(self.name)
            except OSError as exc:
                raise SegmentError(str(exc)) from None
            body = _parse(self.name, raw)
            if len(body.ends) != self.count:
                raise SegmentError(
                    f"segment file {self.name}: {len(body.ends)} messages, not {self.count}"
                )
            _remember(self.name, body)
        return body

    def payload(self, i: int) -> bytes:
        return self.body().payload(i)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Segment) and other.name == self.name

    def __hash__(self) -> int:
        return hash(self.name)

    def __repr__(self) -> str:
        return f"Segment({self.name[:16]}..., {self.count} messages, {self.nbytes} bytes)"

    def __reduce__(self) -> tuple[Any, ...]:
        meta = (self.name, self.count, self.nbytes, self.first_time, self.last_time)
        files = current_state_files()
        if files is None:  # nowhere to put it: the bytes travel inline
            return (_inline, (*meta, _file_bytes(self.body())))
        if self._body is not None and files.writable:
            files.write_once(self.name, _file_bytes(self._body))
            _remember(self.name, self._body)
            self._body = None  # on disk now: memory holds it only in the cache
        return (Segment, meta)


def _inline(
    name: str, count: int, nbytes: int, first_time: int, last_time: int, raw: bytes
) -> Segment:
    return Segment(name, count, nbytes, first_time, last_time, _parse(name, raw))


class StreamLog:
    """The messages of one stream partition: indexes ``first .. next - 1``.

    ``segments[k]`` holds the indexes from ``starts[k]``; the open tail holds those from
    ``tail_start``. Indexes are contiguous from 0; retention moves ``first`` forward and
    drops segments that fall wholly below it.
    """

    def __init__(self) -> None:
        self.first = 0
        self.next = 0
        self.segments: list[Segment] = []
        self.starts: list[int] = []
        self.tail_start = 0
        self.tail: list[bytes] = []
        self.tail_times: list[int] = []
        self.tail_bytes = 0

    def __len__(self) -> int:
        return self.next - self.first

    def push(self, data: bytes, now_ms: int) -> int:
        """Store ``data``; return its index."""
        index = self.next
        self.tail.append(data)
        self.tail_times.append(now_ms)
        self.tail_bytes += len(data)
        self.next += 1
        if len(self.tail) >= SEAL_MESSAGES or self.tail_bytes >= SEAL_BYTES:
            self._seal()
        return index

    def _seal(self) -> None:
        self.segments.append(Segment.seal(self.tail, self.tail_times))
        self.starts.append(self.tail_start)
        self.tail_start = self.next
        self.tail, self.tail_times, self.tail_bytes = [], [], 0

    def _locate(self, index: int) -> tuple[Segment | None, int]:
        if index >= self.tail_start:
            return None, index - self.tail_start
        lo, hi = 0, len(self.starts) - 1
        while lo < hi:  # the last segment starting at or before index
            mid = (lo + hi + 1) // 2
            if self.starts[mid] <= index:
                lo = mid
            else:
                hi = mid - 1
        return self.segments[lo], index - self.starts[lo]

    def read(self, index: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` messages from ``max(index, first)`` on, in index order.

        A pull below the earliest kept index starts at the earliest, with its whole
        ``limit`` (the released code, which never trimmed, bounds the range by
        ``index + limit``; with retention that would leave a consumer below the earliest
        index nothing to read, ever).
        """
        start = max(index, self.first)
        stop = min(self.next, start + limit) if limit > 0 else start
        out: list[tuple[int, bytes]] = []
        i = start
        while i < stop:
            segment, offset = self._locate(i)
            if segment is None:
                for k in range(offset, offset + stop - i):
                    out.append((i, self.tail[k]))
                    i += 1
                break
            body = segment.body()
            n = min(segment.count - offset, stop - i)
            for k in range(offset, offset + n):
                out.append((i, body.payload(k)))
                i += 1
        return out

    def retain(self, max_messages: int, min_time_ms: int | None) -> None:
        """Apply retention: keep at most ``max_messages`` (0: no limit), and nothing that
        arrived before ``min_time_ms`` (None: no age limit). Deterministic: the limits
        and times come from logged input."""
        if max_messages > 0:
            self.first = max(self.first, self.next - max_messages)
        if min_time_ms is not None:
            self.first = max(self.first, self._first_at_or_after(min_time_ms))
        while self.segments and self.starts[0] + self.segments[0].count <= self.first:
            self.segments.pop(0)
            self.starts.pop(0)

    def _first_at_or_after(self, t: int) -> int:
        for segment, start in zip(self.segments, self.starts, strict=True):
            if segment.last_time >= t:
                if segment.first_time >= t:
                    return start
                times = segment.body().times
                return start + next(k for k in range(segment.count) if times[k] >= t)
        for k, when in enumerate(self.tail_times):
            if when >= t:
                return self.tail_start + k
        return self.next
