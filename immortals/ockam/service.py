"""The stream service, its stream workers and the index service, sans-IO.

:class:`StreamHub` is the whole hub's state and its handlers: one received transport
message (bytes) and the logged time in, replies (transport messages) out. It touches no
socket, clock or randomness, so the hub immortal (:mod:`immortals.ockam.hub`) replays it
exactly. The semantics are the released service's (``shared/reference/ockam.md``):

- create is idempotent and answered by the stream worker, from the worker's address;
  an anonymous create gets a ``generated_<n>`` name (``n`` counts creates in the state,
  never random); an empty name is answered with the ``error`` protocol;
- indexes are contiguous from 0 per stream and partition; every push is stored, even
  with a repeated request id (seed 003: the request id confirms, it does not de-duplicate);
- pull(index, limit) returns ``[max(index, first), index + limit)``, cut to what fits in
  one TCP frame (the seed allows 0..limit messages);
- the index service stores the *next* index to read per (client id, stream, partition),
  saves are monotonic and unanswered, an unknown pair is ``none``. A plain stream and a
  plain index are partition 0 of their name.

Bad input never raises: a frame whose routing cannot be decoded is dropped (there is no
return route to answer) and reported; anything else wrong is answered with ``error``.
"""

from __future__ import annotations

import attrs

from . import codec
from .codec import (
    CreatePartitionedRequest,
    CreateStreamRequest,
    Error,
    GetIndex,
    GetPartitionIndex,
    Index,
    Init,
    PartitionedInit,
    PartitionIndex,
    PullRequest,
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
    AddressType,
    TransportMessage,
    decode_message,
    forward_via,
    hop,
    max_payload_size,
    reply_to,
)
from .segments import StreamLog

__all__ = ["MAX_PARTITIONS", "HubConfig", "Outcome", "StreamHub"]

MAX_PARTITIONS = 1024  # a create asking for more is refused rather than run out of memory
INVALID_REQUEST = "Invalid request"  # the released service's reason for an empty name


@attrs.frozen
class HubConfig:
    """What the hub is told at start (logged, so replay sees the same)."""

    stream_service: str = "stream_service"
    index_service: str = "stream_index_service"
    retention_messages: int = 0  # per stream partition; 0: no limit
    retention_ms: int = 0  # maximum age; 0: no limit


@attrs.frozen
class Outcome:
    """What handling one frame produced: the replies, and a problem worth logging."""

    replies: tuple[TransportMessage, ...] = ()
    problem: str | None = None


class StreamHub:
    """The hub's state and handlers (see the module docstring)."""

    def __init__(self, config: HubConfig | None = None) -> None:
        self.config = config or HubConfig()
        self.streams: dict[tuple[str, int], StreamLog] = {}
        self.addresses: dict[bytes, tuple[str, int]] = {}  # worker address -> stream
        self.indexes: dict[tuple[str, str, int], int] = {}  # next index to read
        self.generated = 0
        self.pushes = 0

    # -- entry point ---------------------------------------------------------------------

    def handle(self, frame: bytes, via: Address, now_ms: int) -> Outcome:
        """Handle one transport message received over the connection ``via``."""
        try:
            msg = decode_message(frame)
        except OckamError as exc:
            return Outcome(problem=f"dropped a frame: {exc}")
        # The TCP hop puts an address for itself in front of the return route.
        msg = forward_via(msg, via)
        if not msg.onward_route:
            return self._error(msg, None, "empty onward route")
        target = msg.onward_route[0]
        msg = hop(msg, target)
        if target.type != AddressType.LOCAL:
            return self._error(msg, None, f"unknown address {target!r}")
        name = target.value
        try:
            request = codec.decode_request(msg.payload)
        except OckamError as exc:
            return self._error(msg, target, f"{INVALID_REQUEST}: {exc}")
        if name == self.config.stream_service.encode():
            return self._stream_service(msg, target, request, now_ms)
        if name == self.config.index_service.encode():
            return self._index_service(msg, target, request)
        key = self.addresses.get(name)
        if key is None:
            return self._error(msg, target, f"unknown address {target!r}")
        return self._stream_worker(msg, target, key, request, now_ms)

    def _error(self, msg: TransportMessage, me: Address | None, reason: str) -> Outcome:
        if not msg.return_route:
            return Outcome(problem=f"{reason}; no return route to answer")
        payload = codec.encode(Error(reason))
        reply = TransportMessage(VERSION, msg.return_route, (me,) if me else (), payload)
        return Outcome((reply,), reason)

    # -- the stream service: creates ------------------------------------------------------

    def worker_address(self, stream: str, partition: int) -> Address:
        return Address.local(f"{self.config.stream_service}.{partition}.{stream}")

    def _stream(self, name: str, partition: int) -> tuple[StreamLog, Address]:
        key = (name, partition)
        stream = self.streams.get(key)
        address = self.worker_address(name, partition)
        if stream is None:
            stream = self.streams[key] = StreamLog()
            self.addresses[address.value] = key
        return stream, address

    def _name(self, requested: str | None) -> str:
        if requested is not None:
            return requested
        while True:
            self.generated += 1
            name = f"generated_{self.generated}"
            if (name, 0) not in self.streams:
                return name

    def _stream_service(
        self, msg: TransportMessage, me: Address, request: object, now_ms: int
    ) -> Outcome:
        if isinstance(request, CreateStreamRequest):
            if request.stream_name == "":
                return self._error(msg, me, INVALID_REQUEST)
            name = self._name(request.stream_name)
            _, worker = self._stream(name, 0)
            return Outcome((reply_to(msg, codec.encode(Init(name)), worker),))
        if isinstance(request, CreatePartitionedRequest):
            if request.stream_name == "" or request.partitions > MAX_PARTITIONS:
                return self._error(msg, me, INVALID_REQUEST)
            name = self._name(request.stream_name)
            replies = []
            for p in range(request.partitions):
                _, worker = self._stream(name, p)
                replies.append(reply_to(msg, codec.encode(PartitionedInit(name, p)), worker))
            return Outcome(tuple(replies))
        return self._error(
            msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to the stream service"
        )

    # -- stream workers: push and pull ------------------------------------------------------

    def _stream_worker(
        self,
        msg: TransportMessage,
        me: Address,
        key: tuple[str, int],
        request: object,
        now_ms: int,
    ) -> Outcome:
        stream = self.streams[key]
        if isinstance(request, PushRequest):
            index = stream.push(request.data, now_ms)
            self.pushes += 1
            self._retain(stream, now_ms)
            confirm = PushConfirm(request.request_id, Status.OK, index)
            return Outcome((reply_to(msg, codec.encode(confirm), me),))
        if isinstance(request, PullRequest):
            self._retain(stream, now_ms)
            reply = self._pull_reply(msg, me, stream, request)
            if reply is None:
                return Outcome(problem="pull dropped: its return route leaves no room for a reply")
            return Outcome((reply,))
        if isinstance(request, CreateStreamRequest | CreatePartitionedRequest):
            # A create sent to the worker itself: answer Init, as the service would.
            name, partition = key
            init = (
                Init(name)
                if isinstance(request, CreateStreamRequest)
                else PartitionedInit(name, partition)
            )
            return Outcome((reply_to(msg, codec.encode(init), me),))
        return self._error(msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to a stream")

    def _retain(self, stream: StreamLog, now_ms: int) -> None:
        cfg = self.config
        if cfg.retention_messages or cfg.retention_ms:
            min_time = now_ms - cfg.retention_ms if cfg.retention_ms else None
            stream.retain(cfg.retention_messages, min_time)

    def _pull_reply(
        self, msg: TransportMessage, me: Address, stream: StreamLog, request: PullRequest
    ) -> TransportMessage | None:
        # Room for the payload in one frame: the frame less the routing around it.
        try:
            room = max_payload_size(msg.return_route, (me,))
        except OckamError:  # a return route so long that no reply fits in a frame
            return None
        # Each message needs at least 2 bytes, so no more than room/2 can ever fit.
        found = stream.read(request.index, min(request.limit, room // 2))
        messages = [StreamMessage(i, data) for i, data in found]
        try:
            response = codec.pull_response_fitting(request.request_id, messages, room)
        except ValueError:  # not even an empty response fits beside that return route
            return None
        return reply_to(msg, codec.encode(response), me)

    # -- the index service ----------------------------------------------------------------

    def _index_service(self, msg: TransportMessage, me: Address, request: object) -> Outcome:
        if isinstance(request, GetIndex):
            value = self.indexes.get((request.client_id, request.stream_name, 0))
            reply = Index(request.client_id, request.stream_name, value)
            return Outcome((reply_to(msg, codec.encode(reply), me),))
        if isinstance(request, GetPartitionIndex):
            key = (request.client_id, request.stream_name, request.partition)
            preply = PartitionIndex(
                request.client_id, request.stream_name, request.partition, self.indexes.get(key)
            )
            return Outcome((reply_to(msg, codec.encode(preply), me),))
        if isinstance(request, SaveIndex | SavePartitionIndex):
            partition = request.partition if isinstance(request, SavePartitionIndex) else 0
            key = (request.client_id, request.stream_name, partition)
            if request.index > self.indexes.get(key, -1):  # monotonic (seed 003)
                self.indexes[key] = request.index
            return Outcome()
        return self._error(
            msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to the index service"
        )
