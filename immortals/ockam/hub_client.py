"""Talking to an Ockam hub over its TCP transport, from asyncio: what a user imports.

:class:`OckamClient` (:mod:`~immortals.ockam.hub_connection`) is one connection: ``create``,
``create_partitioned``, ``push`` (confirmed; many may be in flight at once), ``pull``,
``get_index``, ``save_index``. Two helpers here add what a user of a stream service
needs across restarts of either side:

- :class:`Publisher` pushes a sequence of payloads, pipelined, and gets every one stored
  exactly once. After the connection drops it reconnects and, before sending anything
  again, reads the stream after its last confirmed index: the unconfirmed pushes that the
  hub did store (its log kept them, only the confirmation was lost) appear there, in the
  order they were sent, and are taken as confirmed; only the rest is sent again. This
  needs the payloads not pushed to the same stream by anyone else (make them unique,
  e.g. with a producer id and sequence number), since the stream service itself never
  de-duplicates (seed 003: every push is stored).
- :class:`Consumer` reads a stream from the index the index service holds for its client
  id, in order, and saves an index after each batch the caller has handled (the last
  one processed in the seed's dialect, the next to read in the released one); it checks
  each save (the protocol does not answer saves) by reading the index back. Messages
  below the stream's earliest kept index (retention) are reported as a gap.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Sequence

from .codec import Dialect, StreamMessage
from .hub_connection import HubError, OckamClient, Stream

__all__ = ["Consumer", "HubError", "OckamClient", "Publisher", "Stream"]

log = logging.getLogger("immortals.ockam.hub_client")


async def _connect_retrying(
    host: str, port: int, deadline: float, dialect: Dialect = Dialect.SEED
) -> OckamClient:
    delay = 0.02
    while True:
        try:
            return await OckamClient.connect(host, port, timeout=2.0, dialect=dialect)
        except (OSError, TimeoutError) as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"no hub at {host}:{port}: {exc}") from None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)


class Publisher:
    """Pushes payloads to one stream, pipelined, each stored exactly once (module docstring)."""

    def __init__(
        self,
        host: str,
        port: int,
        stream_name: str,
        *,
        window: int = 64,
        retry_for: float = 60.0,
    ) -> None:
        self.host, self.port, self.stream_name = host, port, stream_name
        self.window = window
        self.retry_for = retry_for
        self.reconnects = 0
        self.recovered = 0  # unconfirmed pushes found stored after a reconnect
        self.confirmed = 0  # progress: pushes confirmed so far

    async def publish(self, payloads: Sequence[bytes]) -> list[int]:
        """Store every payload; return their indexes, in order."""
        indexes: list[int | None] = [None] * len(payloads)
        deadline = time.monotonic() + self.retry_for
        last_confirmed = -1
        first_attempt = True
        while True:
            client = await _connect_retrying(self.host, self.port, deadline)
            try:
                stream = await client.create(self.stream_name)
                if not first_attempt:
                    last_confirmed = await self._recover(
                        client, stream, payloads, indexes, last_confirmed
                    )
                first_attempt = False
                await self._push_all(client, stream, payloads, indexes)
                return [i for i in indexes if i is not None]
            except (ConnectionError, TimeoutError, OSError) as exc:
                confirmed = [i for i in indexes if i is not None]
                last_confirmed = max(confirmed, default=-1)
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"gave up publishing after {self.retry_for}s: {exc}"
                    ) from exc
                self.reconnects += 1
                log.info("publisher reconnecting after %s", exc)
            finally:
                await client.close()

    async def _push_all(
        self,
        client: OckamClient,
        stream: Stream,
        payloads: Sequence[bytes],
        indexes: list[int | None],
    ) -> None:
        todo = [k for k, index in enumerate(indexes) if index is None]

        def confirmed(j: int, index: int) -> None:
            indexes[todo[j]] = index  # kept as it comes: a drop loses no confirm
            self.confirmed += 1

        await client.push_many(
            stream, [payloads[k] for k in todo], window=self.window, on_confirm=confirmed
        )

    async def _recover(
        self,
        client: OckamClient,
        stream: Stream,
        payloads: Sequence[bytes],
        indexes: list[int | None],
        last_confirmed: int,
    ) -> int:
        """Take as confirmed the unconfirmed pushes the stream holds after ``last_confirmed``."""
        waiting = [k for k, index in enumerate(indexes) if index is None]
        position = 0
        index = last_confirmed + 1
        while position < len(waiting):
            batch = await client.pull(stream, index, 1000)
            if not batch:
                break
            for message in batch:
                k = waiting[position] if position < len(waiting) else None
                if k is not None and message.data == payloads[k]:
                    indexes[k] = message.index
                    position += 1
                    self.recovered += 1
                    self.confirmed += 1
            index = batch[-1].index + 1
        return index - 1


class Consumer:
    """Reads one stream partition in order from the index its client id saved.

    ``dialect`` is the hub's (``--dialect``): it says what the saved index means. In the
    seed's, the consumer saves the last index it processed and resumes after it; since a
    new record also holds 0, a saved 0 resumes at 0, so a consumer that committed only
    message 0 reads it again after it restarts (the seed's delivery is at least once).
    In the released dialect it saves the next index to read, and resumes exactly there.
    """

    def __init__(
        self,
        host: str,
        port: int,
        stream_name: str,
        client_id: str,
        *,
        partition: int | None = None,
        batch: int = 500,
        retry_for: float = 60.0,
        dialect: Dialect = Dialect.SEED,
    ) -> None:
        self.host, self.port = host, port
        self.stream_name, self.client_id, self.partition = stream_name, client_id, partition
        self.dialect = Dialect(dialect)
        self.batch = batch
        self.retry_for = retry_for
        self.next_index: int | None = None
        self.gaps: list[tuple[int, int]] = []  # [from, to) ranges lost to retention
        self.reconnects = 0

    async def batches(
        self, *, until_idle: float | None = None
    ) -> AsyncIterator[list[StreamMessage]]:
        """Yield batches in index order; call :meth:`commit` after handling each.

        With ``until_idle``, stop once the stream has had nothing new for that long.
        """
        deadline = time.monotonic() + self.retry_for
        idle_since: float | None = None
        while True:
            client = await _connect_retrying(self.host, self.port, deadline, self.dialect)
            self._client = client
            try:
                stream = await self._stream(client)
                saved = await client.get_index(self.client_id, self.stream_name, self.partition)
                resume = self._resume_at(saved)
                if self.next_index is None or resume > self.next_index:
                    self.next_index = resume
                while True:
                    messages = await client.pull(stream, self.next_index, self.batch)
                    if not messages:
                        now = time.monotonic()
                        idle_since = idle_since or now
                        if until_idle is not None and now - idle_since >= until_idle:
                            return
                        await asyncio.sleep(0.02)
                        continue
                    idle_since = None
                    if messages[0].index > self.next_index:
                        self.gaps.append((self.next_index, messages[0].index))
                    yield list(messages)
                    deadline = time.monotonic() + self.retry_for
            except (ConnectionError, TimeoutError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise ConnectionError(
                        f"consumer gave up after {self.retry_for}s: {exc}"
                    ) from exc
                self.reconnects += 1
            finally:
                await client.close()

    async def _stream(self, client: OckamClient) -> Stream:
        if self.partition is None:
            return await client.create(self.stream_name)
        streams = await client.create_partitioned(self.stream_name, self.partition + 1)
        return streams[self.partition]

    def _resume_at(self, saved: int | None) -> int:
        """The first index to read, given the index the service holds."""
        if saved is None:  # a released hub: never saved
            return 0
        if self.dialect is Dialect.SEED:
            return saved + 1 if saved > 0 else 0  # 0: a new record, or message 0 processed
        return saved

    async def commit(self, messages: Sequence[StreamMessage]) -> None:
        """Record that ``messages`` were handled: their index is saved and read back."""
        if not messages:
            return
        last = messages[-1].index
        self.next_index = last + 1
        value = last if self.dialect is Dialect.SEED else last + 1
        client = self._client
        await client.save_index(self.client_id, self.stream_name, value, self.partition)
        saved = await client.get_index(self.client_id, self.stream_name, self.partition)
        if saved is None or saved < value:
            raise HubError(f"index save of {value} not kept (hub says {saved})")
