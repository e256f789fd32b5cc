"""One connection to an Ockam hub over its TCP transport, from asyncio.

:class:`OckamClient` is one connection: ``create``, ``create_partitioned``, ``push``
(confirmed; many may be in flight at once), ``push_many``, ``pull``, ``get_index``,
``save_index``. Every request gets its own return address (``client.<n>``), so replies
find their waiter whatever order they come in, and an ``error`` reply raises
:class:`HubError`. A client speaks one :class:`~immortals.ockam.codec.Dialect`'s
protocol names (the seed's by default; the released ones for a released Ockam hub,
which knows no other) and reads each reply as the response to what it asked, which the
seed's names need (``codec``'s module docstring). :mod:`~immortals.ockam.hub_client` builds
what a user needs across restarts on top of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import attrs

from . import bare, codec, pushes
from .codec import (
    CreatePartitionedRequest,
    CreateStreamRequest,
    Dialect,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionedInit,
    PartitionIndex,
    PullRequest,
    PullResponse,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    Status,
    StreamMessage,
)
from .errors import OckamError
from .routing import (
    VERSION,
    Address,
    FrameReader,
    Route,
    TransportMessage,
    decode_message,
    encode_message,
    frame,
)

__all__ = ["HubError", "OckamClient", "Stream"]


class HubError(OckamError):
    """The hub answered with the ``error`` protocol, or not at all."""


@attrs.frozen
class Stream:
    """A stream partition as the hub announced it: its name and its worker's route."""

    name: str
    partition: int
    route: Route


class _Pending:
    """A request waiting for ``expect`` replies of class ``answer`` on its own return
    address."""

    __slots__ = ("answer", "expect", "future", "replies")

    def __init__(self, expect: int, answer: type[Any] | None) -> None:
        self.expect = expect
        self.answer = answer
        self.replies: list[tuple[TransportMessage, codec.Response]] = []
        self.future: asyncio.Future[list[tuple[TransportMessage, codec.Response]]] = (
            asyncio.get_running_loop().create_future()
        )

    def received(self, raw: bytes, msg: TransportMessage | None) -> None:
        if self.future.done():
            return
        if msg is None:
            msg = decode_message(raw)
        response = codec.decode_response(msg.payload, self.answer)
        if isinstance(response, Error):
            self.future.set_exception(HubError(response.reason))
            return
        self.replies.append((msg, response))
        if len(self.replies) >= self.expect:
            self.future.set_result(self.replies)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class _Pushes:
    """A pipelined run of pushes to one stream on one return address (``push_many``).

    At most ``window`` are unconfirmed at any time. Confirms are handled in the
    connection's reader as they arrive, without a task or a future per push, and the
    pushes they make room for are written together once the read is handled (one
    write, not one per frame). Request ids are ``first_id + k`` for payload ``k``.
    """

    def __init__(
        self,
        client: OckamClient,
        stream: Stream,
        me: Address,
        first_id: int,
        payloads: Sequence[bytes],
        window: int,
        on_confirm: Callable[[int, int], None] | None,
    ) -> None:
        self.client = client
        self.payloads = payloads
        self.window = max(1, window)
        self.on_confirm = on_confirm
        self.first_id = first_id
        self.head = pushes.header(stream.route, (me,))
        self.reply_head: bytes | None = None  # learnt from the first confirm
        self.indexes: list[int | None] = [None] * len(payloads)
        self.sent = 0
        self.confirmed = 0
        self.future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        if not payloads:
            self.future.set_result([])

    def fill(self) -> None:
        """Write pushes up to the window, as one write."""
        stop = min(len(self.payloads), self.confirmed + self.window)
        if self.sent >= stop or self.future.done():
            return
        head, first, payloads = self.head, self.first_id, self.payloads
        out = []
        for k in range(self.sent, stop):
            out.append(frame(head + bare.data(pushes.push_payload(first + k, payloads[k]))))
        self.sent = stop
        self.client._write(b"".join(out))

    def received(self, raw: bytes, msg: TransportMessage | None) -> None:
        if self.future.done():
            return
        confirm = None
        if self.reply_head is not None and raw.startswith(self.reply_head):
            confirm = pushes.read_confirm_at(raw, len(self.reply_head))
        if confirm is None:  # the first confirm, or anything unexpected: the generic way
            msg = msg if msg is not None else decode_message(raw)
            response = codec.decode_response(msg.payload)
            if isinstance(response, Error):
                self.future.set_exception(HubError(response.reason))
                return
            if not isinstance(response, PushConfirm):
                self.future.set_exception(HubError(f"push answered with {response!r}"))
                return
            confirm = (response.request_id, int(response.status), response.index)
            self.reply_head = pushes.header(msg.onward_route, msg.return_route)
        request_id, status, index = confirm
        k = request_id - self.first_id
        if not 0 <= k < self.sent or self.indexes[k] is not None:
            self.future.set_exception(HubError(f"confirm for push {request_id} not in flight"))
            return
        if status != Status.OK:
            self.future.set_exception(
                HubError(f"push {request_id} refused (status {Status(status).name})")
            )
            return
        self.indexes[k] = index
        self.confirmed += 1
        if self.on_confirm is not None:
            self.on_confirm(k, index)
        if self.confirmed == len(self.payloads):
            self.future.set_result([i for i in self.indexes if i is not None])
        else:
            self.client._refill.add(self)

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


class OckamClient:
    """One TCP connection to a hub (see the module docstring)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        dialect: Dialect = Dialect.SEED,
    ) -> None:
        self.dialect = Dialect(dialect)  # whose protocol names this client sends
        self._reader = reader
        self._writer = writer
        self._pending: dict[bytes, _Pending | _Pushes] = {}
        self._refill: set[_Pushes] = set()  # batches with room in their window
        self._ids = itertools.count(1)
        self._closed: BaseException | None = None
        self._task = asyncio.ensure_future(self._read())
        self.stream_service = Address.local("stream_service")
        self.index_service = Address.local("stream_index_service")

    @classmethod
    async def connect(
        cls, host: str, port: int, *, timeout: float = 10.0, dialect: Dialect = Dialect.SEED
    ) -> OckamClient:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        return cls(reader, writer, dialect=dialect)

    async def close(self) -> None:
        self._task.cancel()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

    async def _read(self) -> None:
        frames = FrameReader()
        error: BaseException = ConnectionError("the hub closed the connection")
        try:
            while data := await self._reader.read(256 * 1024):
                for raw in frames.feed(data):
                    self._received(raw)
                if self._refill:
                    refill, self._refill = self._refill, set()
                    for batch in refill:
                        batch.fill()
        except (OckamError, ConnectionError, OSError) as exc:
            error = exc if isinstance(exc, ConnectionError) else ConnectionError(str(exc))
        finally:
            self._closed = error
            for pending in self._pending.values():
                pending.fail(error)
            self._pending.clear()

    def _received(self, raw: bytes) -> None:
        # The first hop of a reply's onward route is the return address of its request;
        # a run of pushes is matched on its reply header without decoding the rest.
        for pending in self._pending.values():
            head = pending.reply_head if isinstance(pending, _Pushes) else None
            if head is not None and raw.startswith(head):
                pending.received(raw, None)
                return
        msg = decode_message(raw)
        if not msg.onward_route:
            return
        waiter = self._pending.get(msg.onward_route[0].value)
        if waiter is not None:
            waiter.received(raw, msg)

    async def _request(
        self, route: Route, message: codec.Request, expect: int = 1, timeout: float = 10.0
    ) -> list[tuple[TransportMessage, codec.Response]]:
        if self._closed is not None:
            raise ConnectionError(f"connection to the hub is closed ({self._closed})")
        me = Address.local(f"client.{next(self._ids)}")
        pending = _Pending(expect, codec.ANSWERED_WITH.get(type(message)))
        self._pending[me.value] = pending
        try:
            self._send(route, me, message)
            if expect == 0:
                return []
            return await _within(pending.future, timeout)
        finally:
            self._pending.pop(me.value, None)

    def _send(self, route: Route, me: Address, message: codec.Request) -> None:
        msg = TransportMessage(VERSION, route, (me,), codec.encode(message, self.dialect))
        self._write(frame(encode_message(msg)))

    def _write(self, data: bytes) -> None:
        """Write, or raise a :class:`ConnectionError` if the connection has gone and the
        reader has not seen it yet: uvloop raises RuntimeError for a write to a transport
        it has closed, which callers retrying on connection errors would not catch."""
        if self._writer.is_closing():
            raise ConnectionResetError("the connection to the hub is closed")
        try:
            self._writer.write(data)
        except RuntimeError as exc:
            raise ConnectionResetError(f"the connection to the hub is closed ({exc})") from None

    # -- the stream service ------------------------------------------------------------

    async def create(self, name: str | None = None, *, timeout: float = 10.0) -> Stream:
        """Create (or find) a stream; its worker answers with its route."""
        ((msg, init),) = await self._request(
            (self.stream_service,), CreateStreamRequest(name), timeout=timeout
        )
        if not isinstance(init, Init):
            raise HubError(f"create answered with {init!r}")
        return Stream(init.stream_name, 0, msg.return_route)

    async def create_partitioned(
        self, name: str | None, partitions: int, *, timeout: float = 10.0
    ) -> list[Stream]:
        """Create (or find) a stream of ``partitions`` partitions, in partition order.

        Each partition's worker answers (seed 003, *Create partitioned stream*), from its
        own address: ``Stream.route`` associates the partition with it. 0 partitions is
        refused with ``error`` by this project's hub (a released hub says nothing, and
        this waits ``timeout`` for it)."""
        replies = await self._request(
            (self.stream_service,),
            CreatePartitionedRequest(name, partitions),
            expect=max(partitions, 1),
            timeout=timeout,
        )
        streams = []
        for msg, init in replies:
            if not isinstance(init, PartitionedInit):
                raise HubError(f"partitioned create answered with {init!r}")
            streams.append(Stream(init.stream_name, init.partition, msg.return_route))
        return sorted(streams, key=lambda s: s.partition)

    async def push(self, stream: Stream, data: bytes, *, timeout: float = 10.0) -> int:
        """Push ``data``; return its index once the hub confirms it (stored durably)."""
        request_id = next(self._ids)
        ((_, confirm),) = await self._request(
            stream.route, PushRequest(request_id, data), timeout=timeout
        )
        if not isinstance(confirm, PushConfirm) or confirm.request_id != request_id:
            raise HubError(f"push {request_id} answered with {confirm!r}")
        if confirm.status != Status.OK:
            raise HubError(f"push {request_id} refused (status {confirm.status.name})")
        return confirm.index

    async def push_many(
        self,
        stream: Stream,
        payloads: Sequence[bytes],
        *,
        window: int = 64,
        timeout: float = 10.0,
        on_confirm: Callable[[int, int], None] | None = None,
    ) -> list[int]:
        """Push every payload, up to ``window`` unconfirmed at once; their indexes, in order.

        Each is confirmed only once the hub has it in its durable log; ``on_confirm(k,
        index)`` is called as payload ``k``'s confirm arrives (so a caller keeps what was
        confirmed if the connection drops part way). TimeoutError if ``timeout`` seconds
        pass with no confirm at all; ConnectionError if the connection drops.
        """
        if self._closed is not None:
            raise ConnectionError(f"connection to the hub is closed ({self._closed})")
        first = next(self._ids)
        # Request ids first .. first + n - 1 are this batch's: skip the counter past them.
        self._ids = itertools.count(first + len(payloads) + 1)
        me = Address.local(f"client.{first}")
        batch = _Pushes(self, stream, me, first, payloads, window, on_confirm)
        self._pending[me.value] = batch
        try:
            batch.fill()
            return await _within(batch.future, timeout, progress=lambda: batch.confirmed)
        finally:
            self._pending.pop(me.value, None)
            self._refill.discard(batch)

    async def pull(
        self, stream: Stream, index: int, limit: int, *, timeout: float = 10.0
    ) -> tuple[StreamMessage, ...]:
        """Up to ``limit`` messages from ``index`` on (fewer if they do not fit a frame)."""
        request_id = next(self._ids)
        ((_, response),) = await self._request(
            stream.route, PullRequest(request_id, index, limit), timeout=timeout
        )
        if not isinstance(response, PullResponse) or response.request_id != request_id:
            raise HubError(f"pull {request_id} answered with {response!r}")
        return response.messages

    # -- the index service -------------------------------------------------------------

    async def get_index(
        self, client_id: str, stream_name: str, partition: int | None = None
    ) -> int | None:
        """The index the index service holds for ``client_id`` and the stream (partition).

        A hub in the seed's dialect answers the last index saved as processed, or 0 for
        a pair never seen (creating that record); a released one the next index to read,
        or None. Either way a client reads back what it saved."""
        request: codec.Request = (
            GetIndex(client_id, stream_name)
            if partition is None
            else GetPartitionIndex(client_id, stream_name, partition)
        )
        ((_, reply),) = await self._request((self.index_service,), request)
        if not isinstance(reply, Index | PartitionIndex):
            raise HubError(f"index get answered with {reply!r}")
        return reply.index

    async def save_index(
        self, client_id: str, stream_name: str, index: int, partition: int | None = None
    ) -> None:
        """Save an index: the last one processed (the seed's meaning) or the next to read
        (the released one), as the hub's dialect has it. Monotonic; unanswered (the
        protocol has no reply), so a caller that must know reads it back."""
        request: codec.Request = (
            SaveIndex(client_id, stream_name, index)
            if partition is None
            else SavePartitionIndex(client_id, stream_name, partition, index)
        )
        await self._request((self.index_service,), request, expect=0)


T = TypeVar("T")


async def _within(
    future: asyncio.Future[T], timeout: float, progress: Callable[[], int] | None = None
) -> T:
    """Await ``future``; TimeoutError after ``timeout`` s (without progress, if given).

    One timer per request or batch, re-armed only when it fires, instead of
    ``asyncio.wait_for`` and its bookkeeping per request.
    """
    loop = asyncio.get_running_loop()
    last = progress() if progress is not None else 0
    handle: asyncio.TimerHandle | None = None

    def check() -> None:
        nonlocal last, handle
        now = progress() if progress is not None else last
        if now != last:
            last = now
            handle = loop.call_later(timeout, check)
        elif not future.done():
            future.set_exception(TimeoutError(f"no reply from the hub within {timeout}s"))

    handle = loop.call_later(timeout, check)
    try:
        return await future
    finally:
        handle.cancel()
