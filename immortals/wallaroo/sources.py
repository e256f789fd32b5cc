"""Where a connector's messages come from: sources readable again by point of reference.

A source offers one or more streams, by name. Reading a stream *after* a point of
reference gives its records from there on, as ``(point, payload)`` pairs: the point of a
record is its position, counted from 1, so a stream at point ``p`` has consumed ``p``
records and goes on with record ``p + 1``. The connector sends each record with its
point as the message id, and the worker acknowledges points (seed 000, *Points of
Reference*). Because a source can be read again from any point it has not lost, the
connector logs no payloads: after a crash, or a rewind, it reads them again.

- ``file://PATH``: one message per line (the newline, and a carriage return before it,
  are not part of it; a last line without a newline is a line). The line number is the
  point of reference; the end of the file is the end of the stream (EOS). Stream name
  ``file://`` and the absolute path.
- ``gen://COUNT?seed=S[&size=B]``: COUNT records of words made from ``S`` and the
  position alone (:func:`generate`), for tests and benchmarks; with ``size``, each
  payload is exactly B bytes. Ends after COUNT. Stream name: the spec, normalised.
- ``ockam://HOST:PORT/STREAM``: the Ockam stream STREAM of the hub at HOST:PORT
  (``immortals.ockam.hub``), read with pulls; the point is the Ockam index of the next
  message (so message index ``i`` is point ``i + 1``; the index service stores the next
  index to read, the same number). A stream the worker has never seen starts at the
  index the index service holds for the connector's client id (a consumer group's
  offset; seed 000's note on Kafka in *Handshake*), and every point the worker
  acknowledges is saved there. It never ends. Stream name ``ockam:STREAM``, so the hub
  may move.

Reading may block (an Ockam stream waits for new messages), so sources are asyncio
objects; they live outside the determinism boundary, in the connector's edge. What a
source cannot do from a point (a file shorter than the point, since changed) is a
:class:`SourceError`: the connector answers it with ERROR and halts that stream (seed
000, D5). Losing the hub is not an error: the Ockam source reconnects and goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import urllib.parse
from typing import BinaryIO, Final, Protocol

import attrs
import xxhash

from immortals.ockam.errors import OckamError
from immortals.ockam.hub_client import HubError, OckamClient, Stream

from .errors import WallarooError

__all__ = [
    "Batch",
    "FileSource",
    "GeneratorSource",
    "OckamSource",
    "Source",
    "SourceError",
    "generate",
    "open_source",
    "stream_names",
]

log = logging.getLogger("immortals.wallaroo.sources")

_MARK_EVERY: Final = 4096  # lines between the byte offsets a file source remembers
_WORDS: Final = tuple(f"w{k:02d}".encode() for k in range(64))
_POLL_SECONDS: Final = 0.02  # how often an idle Ockam stream is pulled again
_BACKOFF_MIN: Final = 0.02  # the first wait after a failed connect or save, doubling
_BACKOFF_MAX: Final = 1.0


class SourceError(WallarooError):
    """A source cannot give a stream's records after a point (seed 000, D5)."""


@attrs.frozen
class Batch:
    """Records read from a stream, in order, and whether the stream ends after them."""

    records: tuple[tuple[int, bytes], ...]
    """``(point, payload)``: each record's point (its position from 1) and its payload."""
    end: bool = False
    """Nothing follows the last record (or, with no records, the point read after)."""


class Source(Protocol):
    """A replayable source of one or more streams (see the module docstring)."""

    @property
    def streams(self) -> tuple[str, ...]: ...

    async def origin(self, stream: str) -> int:
        """Where a stream the worker has never seen starts: the point to read after."""
        ...

    async def read(self, stream: str, after: int, limit: int) -> Batch:
        """Up to ``limit`` records after point ``after``; waits until there is at least
        one or the stream has ended. :class:`SourceError` if ``after`` cannot be read."""
        ...

    def commit(self, stream: str, point: int) -> None:
        """The worker acknowledged ``stream`` up to ``point`` (nothing to do for most)."""
        ...

    async def close(self) -> None: ...


def _spec_parts(spec: str) -> urllib.parse.SplitResult:
    parts = urllib.parse.urlsplit(spec)
    if parts.scheme not in ("file", "gen", "ockam"):
        raise ValueError(
            f"source {spec!r}: expected file://PATH, gen://COUNT?seed=S or ockam://HOST:PORT/STREAM"
        )
    return parts


def stream_names(spec: str) -> tuple[str, ...]:
    """The names of the streams ``spec`` offers, without opening anything."""
    parts = _spec_parts(spec)
    if parts.scheme == "file":
        return (FileSource.name_for(_file_path(spec, parts)),)
    if parts.scheme == "gen":
        count, seed, size = _gen_args(spec, parts)
        return (GeneratorSource.name_for(count, seed, size),)
    _, _, stream = _ockam_args(spec, parts)
    return (OckamSource.name_for(stream),)


def open_source(spec: str, client_id: str) -> Source:
    """The source ``spec`` names; ``client_id`` names the reader to the Ockam index
    service (the connector's instance name). ValueError for a malformed spec."""
    parts = _spec_parts(spec)
    if parts.scheme == "file":
        return FileSource(_file_path(spec, parts))
    if parts.scheme == "gen":
        return GeneratorSource(*_gen_args(spec, parts))
    return OckamSource(*_ockam_args(spec, parts), client_id=client_id)


def _file_path(spec: str, parts: urllib.parse.SplitResult) -> str:
    path = urllib.parse.unquote(parts.netloc + parts.path)
    if not path:
        raise ValueError(f"source {spec!r} names no file")
    return os.path.abspath(path)


def _gen_args(spec: str, parts: urllib.parse.SplitResult) -> tuple[int, int, int | None]:
    query = dict(urllib.parse.parse_qsl(parts.query, strict_parsing=bool(parts.query)))
    unknown = set(query) - {"seed", "size"}
    try:
        if unknown or parts.path not in ("", "/"):
            raise ValueError(f"unexpected {sorted(unknown) or parts.path!r}")
        count = int(parts.netloc)
        seed = int(query.get("seed", "0"))
        size = int(query["size"]) if "size" in query else None
        if count < 0 or (size is not None and size < 1):
            raise ValueError("COUNT must be >= 0 and size >= 1")
    except ValueError as exc:
        raise ValueError(f"source {spec!r} is not gen://COUNT?seed=S[&size=B]: {exc}") from None
    return count, seed, size


def _ockam_args(spec: str, parts: urllib.parse.SplitResult) -> tuple[str, int, str]:
    stream = parts.path.lstrip("/")
    try:
        port = parts.port
    except ValueError:
        port = None
    if not parts.hostname or port is None or not stream or "/" in stream:
        raise ValueError(f"source {spec!r} is not ockam://HOST:PORT/STREAM")
    return parts.hostname, port, stream


# --- file://PATH -------------------------------------------------------------------------


class FileSource:
    """A text file, one message per line; the line number is the point of reference.

    Reads go through a buffered file; the byte offset of every 4,096th line start is
    kept, so a resume or a rewind seeks close to its line instead of reading from the
    top. A file that shrank below a point it once had is a :class:`SourceError`.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = self.name_for(path)
        self._file: BinaryIO | None = None
        self._marks: list[int] = [0]  # byte offset of line k * _MARK_EVERY + 1
        self._line = 0  # lines consumed at ``self._offset``
        self._offset = 0

    @staticmethod
    def name_for(path: str) -> str:
        return f"file://{path}"

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.name,)

    async def origin(self, stream: str) -> int:
        return 0

    def _open(self) -> BinaryIO:
        if self._file is None:
            try:
                self._file = open(self.path, "rb")  # noqa: SIM115 (kept open across reads)
            except OSError as exc:
                raise SourceError(f"{self.path}: {exc.strerror or exc}") from None
        return self._file

    async def read(self, stream: str, after: int, limit: int) -> Batch:
        self._check(stream)
        return self.read_now(after, limit)

    def read_now(self, after: int, limit: int) -> Batch:
        """:meth:`read` without the event loop (file reads do not wait)."""
        try:
            return self._read(after, limit)
        except OSError as exc:
            raise SourceError(f"{self.path}: {exc.strerror or exc}") from None

    def _read(self, after: int, limit: int) -> Batch:
        f = self._open()
        if after != self._line:
            mark = min(after // _MARK_EVERY, len(self._marks) - 1)
            self._line, self._offset = mark * _MARK_EVERY, self._marks[mark]
            f.seek(self._offset)
        while self._line < after:
            if self._next_line(f) is None:
                raise SourceError(
                    f"{self.path} has {self._line} lines; cannot resume after line {after}"
                )
        records: list[tuple[int, bytes]] = []
        while len(records) < limit:
            raw = self._next_line(f)
            if raw is None:
                return Batch(tuple(records), end=True)
            records.append((self._line, raw))
        return Batch(tuple(records), end=self._at_end(f))

    def _next_line(self, f: BinaryIO) -> bytes | None:
        raw = f.readline()
        if not raw:
            return None
        self._line += 1
        self._offset += len(raw)
        if self._line % _MARK_EVERY == 0 and self._line // _MARK_EVERY == len(self._marks):
            self._marks.append(self._offset)
        if raw.endswith(b"\n"):
            raw = raw[:-2] if raw.endswith(b"\r\n") else raw[:-1]
        return raw

    def _at_end(self, f: BinaryIO) -> bool:
        return self._offset >= os.fstat(f.fileno()).st_size

    def _check(self, stream: str) -> None:
        if stream != self.name:
            raise SourceError(f"{self.name} has no stream {stream!r}")

    def commit(self, stream: str, point: int) -> None:
        pass

    async def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


# --- gen://COUNT?seed=S ------------------------------------------------------------------


def generate(seed: int, position: int, size: int | None = None) -> bytes:
    """Record ``position`` (from 1) of the generator seeded ``seed``: 1 to 8 words of 64,
    from an XXH64 of seed and position only, so any record can be made again alone. With
    ``size``, its words repeat until the payload is ``size`` bytes (the last one cut)."""
    h = xxhash.xxh64_intdigest(f"{seed}:{position}".encode())
    text = b" ".join([_WORDS[(h >> (6 * i + 3)) & 63] for i in range((h & 7) + 1)])
    if size is None:
        return text
    return ((text + b" ") * (size // (len(text) + 1) + 1))[:size]


class GeneratorSource:
    """COUNT records made by :func:`generate`; the position is the point of reference."""

    def __init__(self, count: int, seed: int, size: int | None = None) -> None:
        self.count, self.seed, self.size = count, seed, size
        self.name = self.name_for(count, seed, size)

    @staticmethod
    def name_for(count: int, seed: int, size: int | None) -> str:
        return f"gen://{count}?seed={seed}" + ("" if size is None else f"&size={size}")

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.name,)

    async def origin(self, stream: str) -> int:
        return 0

    async def read(self, stream: str, after: int, limit: int) -> Batch:
        return self.read_now(after, limit)

    def read_now(self, after: int, limit: int) -> Batch:
        """:meth:`read` without the event loop."""
        if after > self.count:
            raise SourceError(f"{self.name} has {self.count} records; cannot resume after {after}")
        stop = min(self.count, after + limit)
        seed, size = self.seed, self.size
        records = tuple((k, generate(seed, k, size)) for k in range(after + 1, stop + 1))
        return Batch(records, end=stop == self.count)

    def commit(self, stream: str, point: int) -> None:
        pass

    async def close(self) -> None:
        pass


# --- ockam://HOST:PORT/STREAM ------------------------------------------------------------


class OckamSource:
    """One Ockam stream, pulled by index from a hub (see the module docstring).

    The connection is made on first use and again whenever it drops (back-off up to a
    second): a hub that crashes and recovers loses nothing, and reads go on from the
    index asked for. Acknowledged points are saved to the hub's index service coalesced
    (the worker, not the index service, is the system of record): one save in flight,
    the newest point next. The protocol answers no save, and a hub can lose one it has
    read (its service killed before the save was logged), so each save is read back on
    the same connection, where the hub handles frames in order; one that did not hold
    is tried again, with back-off, until one holds or the source closes.
    """

    def __init__(self, host: str, port: int, stream: str, *, client_id: str) -> None:
        self.host, self.port, self.stream = host, port, stream
        self.client_id = client_id
        self.name = self.name_for(stream)
        self._client: OckamClient | None = None
        self._route: Stream | None = None
        self._lock = asyncio.Lock()
        self._to_save: int | None = None
        self._saver: asyncio.Task[None] | None = None
        self.gaps: list[tuple[int, int]] = []  # (from, to) points lost to retention
        self.reconnects = 0

    @staticmethod
    def name_for(stream: str) -> str:
        return f"ockam:{stream}"

    @property
    def streams(self) -> tuple[str, ...]:
        return (self.name,)

    async def _connected(self) -> tuple[OckamClient, Stream]:
        async with self._lock:
            delay = _BACKOFF_MIN
            while self._client is None or self._route is None:
                client = None
                try:
                    client = await OckamClient.connect(self.host, self.port, timeout=2.0)
                    self._route = await client.create(self.stream, timeout=5.0)
                    self._client = client
                except (OSError, TimeoutError, OckamError) as exc:
                    if client is not None:
                        await client.close()
                    self.reconnects += 1
                    log.info("ockam hub %s:%s: %s; retrying", self.host, self.port, exc)
                    await asyncio.sleep(delay)  # back-off between attempts (the edge)
                    delay = min(delay * 2, _BACKOFF_MAX)
            return self._client, self._route

    async def _drop(self) -> None:
        client, self._client, self._route = self._client, None, None
        if client is not None:
            await client.close()

    async def origin(self, stream: str) -> int:
        while True:
            client, _ = await self._connected()
            try:
                saved = await client.get_index(self.client_id, self.stream)
                return saved or 0
            except (OSError, TimeoutError, OckamError) as exc:
                log.info("ockam index of %s: %s; retrying", self.stream, exc)
                await self._drop()

    async def read(self, stream: str, after: int, limit: int) -> Batch:
        while True:
            client, route = await self._connected()
            try:
                messages = await client.pull(route, after, limit)
            except (OSError, TimeoutError, OckamError) as exc:
                log.info("ockam pull of %s: %s; reconnecting", self.stream, exc)
                await self._drop()
                continue
            if not messages:
                await asyncio.sleep(_POLL_SECONDS)  # nothing new yet: pull again soon
                continue
            if messages[0].index > after:  # below the earliest kept: lost to retention
                self.gaps.append((after, messages[0].index))
                log.warning(
                    "ockam stream %s: messages %d..%d are gone (retention)",
                    self.stream,
                    after,
                    messages[0].index - 1,
                )
            return Batch(tuple((m.index + 1, m.data) for m in messages))

    def commit(self, stream: str, point: int) -> None:
        if self._to_save is None or point > self._to_save:
            self._to_save = point
        if self._saver is None or self._saver.done():
            self._saver = asyncio.get_running_loop().create_task(self._save())

    async def _save(self) -> None:
        delay = _BACKOFF_MIN
        while self._to_save is not None:
            point, self._to_save = self._to_save, None
            try:
                client, _ = await self._connected()
                await client.save_index(self.client_id, self.stream, point)
                held = await client.get_index(self.client_id, self.stream)
                if (held or 0) < point:
                    raise HubError(f"the index holds {held}, not {point}")
                delay = _BACKOFF_MIN
            except (OSError, TimeoutError, OckamError) as exc:
                # Tried again (the newest point, if one came meanwhile): the last point
                # of a stream is committed once, and a save lost with the hub would
                # leave its index behind for good.
                log.info("ockam index save of %s: %s; retrying", self.stream, exc)
                await self._drop()
                self._to_save = point if self._to_save is None else max(self._to_save, point)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX)

    async def close(self) -> None:
        if self._saver is not None:
            self._saver.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._saver
        await self._drop()
