"""The stream service, its stream workers and the index service, sans-IO.

:class:`StreamHub` is the whole hub's state and its handlers: one received transport
message (bytes) and the logged time in, replies (transport messages) out. It touches no
socket, clock or randomness, so the hub immortal (:mod:`immortals.ockam.hub`) replays it
exactly. The semantics are seed 003's, and the released service's where the seed leaves
them open (``shared/reference/ockam.md``):

- create is idempotent and answered by the stream worker, from the worker's address;
  an anonymous create gets a ``generated_<n>`` name (``n`` counts creates in the state,
  never random); an empty name is answered with the ``error`` protocol;
- indexes are contiguous from 0 per stream and partition; every push is stored, even
  with a repeated request id (seed 003: the request id confirms, it does not de-duplicate);
- pull(index, limit) returns ``[max(index, first), index + limit)``, cut to what fits in
  one TCP frame and in what is left of the read's reply budget (the seed allows
  0..limit messages; the client asks again from its index);
- a partitioned create for 0 partitions is answered with ``error``: one stream per
  partition answers it (seed 003, *Create partitioned stream*), so none would, and the
  client could not tell a refusal from a loss;
- both dialects' protocol names are read (:class:`~immortals.ockam.codec.Dialect`), and
  a reply goes out under the name its request came with;
- the index service (:mod:`~immortals.ockam.indexes`) keeps an index per (client id,
  stream, partition), with the seed's or the released meaning as
  :attr:`HubConfig.dialect` says. A plain stream and a plain index are partition 0 of
  their name.

Bad input never raises: a frame whose routing cannot be decoded is dropped (there is no
return route to answer) and reported; anything else wrong is answered with ``error``; a
reply that would not fit in one TCP frame is dropped and reported, never truncated.

What one read can make the hub build is bounded: the replies to the frames of one read
share :data:`REPLY_BUDGET` bytes. Pulls take what is left of it (down to an empty
PullResponse), and a partitioned create whose Inits would not fit is refused; every other
reply is about as large as the frame it answers, so the read's own size bounds it. The
budget depends only on the logged frames, so replay builds the same replies.
"""

from __future__ import annotations

import attrs

from . import bare, codec, indexes, pushes
from .codec import (
    CreatePartitionedRequest,
    CreateStreamRequest,
    Dialect,
    Error,
    GetIndex,
    GetPartitionIndex,
    Init,
    PartitionedInit,
    PullRequest,
    PushConfirm,
    PushRequest,
    SaveIndex,
    SavePartitionIndex,
    Status,
    StreamMessage,
)
from .errors import FrameTooLargeError, OckamError
from .routing import (
    MAX_FRAME,
    VERSION,
    Address,
    AddressType,
    TransportMessage,
    decode_message,
    encode_message,
    forward_via,
    frame,
    hop,
    max_payload_size,
    reply_to,
)
from .segments import StreamLog

__all__ = ["MAX_PARTITIONS", "REPLY_BUDGET", "HubConfig", "Outcome", "Replies", "StreamHub"]

_ROUTES_PER_CONNECTION = 8  # routing headers remembered per connection (pipelined batches)
_CONNECTIONS_CACHED = 256
MAX_PARTITIONS = 1024  # a create asking for more is refused rather than run out of memory
INVALID_REQUEST = "Invalid request"  # the released service's reason for an empty name
NO_PARTITIONS = f"{INVALID_REQUEST}: a partitioned stream needs at least one partition"
REPLY_BUDGET = 1024 * 1024
"""Bytes of replies the frames of one read may make the hub build (see the module).

Without it, 5,000 pulls of 52 bytes each (one 256 KiB read) could each be answered with
a 64 KiB frame: 320 MiB built in one handler. A constant, not an option: replies are
built from logged input only."""
_REASON_CHARS = 1000  # an error reason quotes at most this much (it travels in one frame)
_SHOWN_BYTES = 64  # of a peer-chosen address value quoted in a reason


def _dialect(value: str | Dialect) -> Dialect:
    try:
        return Dialect(value)
    except ValueError:
        expected = " or ".join(d.value for d in Dialect)
        raise ValueError(f"dialect {value!r}: expected {expected}") from None


@attrs.frozen
class HubConfig:
    """What the hub is told at start (logged, so replay sees the same)."""

    stream_service: str = "stream_service"
    index_service: str = "stream_index_service"
    retention_messages: int = 0  # per stream partition; 0: no limit
    retention_ms: int = 0  # maximum age; 0: no limit
    dialect: Dialect = attrs.field(default=Dialect.SEED, converter=_dialect)
    """What the index service does where seed 003 and the released code differ."""

    def __getstate__(self) -> dict[str, object]:
        # The dialect travels as its name: the log analysis (the report plug-in,
        # ``report.py``) unpickles a logged configure allowing this class alone, not the enum.
        state: dict[str, object] = {a.name: getattr(self, a.name) for a in attrs.fields(HubConfig)}
        state["dialect"] = self.dialect.value
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        # A configuration pickled before there were dialects (in a checkpoint, or a
        # logged configure) was handled with the released semantics: replay keeps them.
        values = {"dialect": Dialect.RELEASED.value, **state}
        for name, value in values.items():
            if name == "dialect":
                value = _dialect(str(value))
            object.__setattr__(self, name, value)


@attrs.frozen
class Outcome:
    """What handling one frame produced: the replies, and a problem worth logging."""

    replies: tuple[TransportMessage, ...] = ()
    problem: str | None = None


@attrs.frozen
class Replies:
    """What handling the frames of one read produced, ready for the connection."""

    wire: bytes  # every reply, framed, in order, for the connection the frames came on
    count: int
    problems: tuple[str, ...] = ()


@attrs.frozen
class _Route:
    """A routing header seen on a connection, resolved to a stream worker (a cache)."""

    head: bytes  # the TransportMessage's bytes before its payload
    config: HubConfig  # resolved under this configuration
    key: tuple[str, int]
    reply_head: bytes  # a reply's header after the connection's hop is dropped


class StreamHub:
    """The hub's state and handlers (see the module docstring)."""

    def __init__(self, config: HubConfig | None = None) -> None:
        self.config = config or HubConfig()
        self.streams: dict[tuple[str, int], StreamLog] = {}
        self.addresses: dict[bytes, tuple[str, int]] = {}  # worker address -> stream
        self.indexes: indexes.Records = {}  # per (client, stream, partition): next to read
        self.generated = 0
        self.pushes = 0
        self._routes: dict[bytes, list[_Route]] = {}  # per connection; not state

    def __getstate__(self) -> dict[str, object]:
        state = self.__dict__.copy()
        state.pop("_routes", None)  # a cache: rebuilt from the frames themselves
        return state

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self._routes = {}

    # -- many frames, one connection ------------------------------------------------------

    def handle_frames(
        self, frames: list[bytes], via: Address, now_ms: int, budget: int = REPLY_BUDGET
    ) -> Replies:
        """Handle the frames one read from connection ``via`` brought; replies as bytes.

        The same as :meth:`handle` for each frame in turn (every reply's first hop is
        ``via``, which the TCP hop put in front of the return route; it is dropped and
        the rest framed), the frames sharing ``budget`` bytes of replies. Pushes on a
        routing header already resolved on this connection skip the generic decoding
        (:mod:`~immortals.ockam.pushes`); any frame the fast path does not recognise
        takes the generic one. Headers are learnt only from reads of several frames: a
        lone frame is a request waiting for its answer (each with its own return
        address), and learning it would only cost.
        """
        out: list[bytes] = []
        problems: list[str] = []
        left = budget
        cached = self._routes
        routes = cached.get(via.value)
        if routes is None:
            if len(cached) >= _CONNECTIONS_CACHED:  # forget the oldest connection
                del cached[next(iter(cached))]
            routes = cached[via.value] = []
        for data in frames:
            route = routes[0] if routes and data.startswith(routes[0].head) else None
            if route is None and len(routes) > 1:
                route = next((r for r in routes if data.startswith(r.head)), None)
            if route is not None and route.config is self.config:
                push = pushes.read_push_at(data, len(route.head))
                if push is not None:
                    wire = self._push(route, push[0], push[1], now_ms)
                    out.append(wire)
                    left -= len(wire)
                    continue
            outcome = self.handle(data, via, now_ms, left)
            for message in outcome.replies:
                try:
                    wire = frame(encode_message(hop(message, via)))
                except FrameTooLargeError as exc:  # e.g. an error beside a huge return route
                    problems.append(f"reply dropped: {exc}")
                    continue
                out.append(wire)
                left -= len(wire)
            if outcome.problem is not None:
                problems.append(outcome.problem)
            if len(frames) > 1:  # a pipelined read: more pushes on this route will follow
                self._learn(routes, data, via)
        return Replies(b"".join(out), len(out), tuple(problems))

    def _push(self, route: _Route, request_id: int, body: bytes, now_ms: int) -> bytes:
        """A push on a known route: stored as :meth:`_stream_worker` does; its confirm framed."""
        stream = self.streams[route.key]
        index = stream.push(body, now_ms)
        self.pushes += 1
        self._retain(stream, now_ms)
        return frame(route.reply_head + bare.data(pushes.confirm_payload(request_id, index)))

    def _learn(self, routes: list[_Route], data: bytes, via: Address) -> None:
        """Remember the header of a frame addressed to a stream worker (pushes follow)."""
        try:
            msg = decode_message(data)
        except OckamError:
            return
        if not msg.onward_route or msg.onward_route[0].type != AddressType.LOCAL:
            return
        target = msg.onward_route[0]
        name = target.value
        key = self.addresses.get(name)
        services = (self.config.stream_service.encode(), self.config.index_service.encode())
        if key is None or name in services:
            return
        try:
            reply_head = pushes.header(msg.return_route, (target,))
        except (OckamError, ValueError):
            return
        head = pushes.header(msg.onward_route, msg.return_route)
        if any(r.head == head for r in routes):
            return
        routes.insert(0, _Route(head, self.config, key, reply_head))
        del routes[_ROUTES_PER_CONNECTION:]

    # -- entry point ---------------------------------------------------------------------

    def handle(
        self, frame: bytes, via: Address, now_ms: int, budget: int = REPLY_BUDGET
    ) -> Outcome:
        """Handle one transport message received over the connection ``via``.

        ``budget``: the bytes of replies a pull or a partitioned create may still take
        (see the module).
        """
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
            return self._error(msg, None, f"unknown address {_shown(target)}")
        name = target.value
        try:
            # ``spoken``: the dialect of the request's protocol name, which the reply uses.
            request, spoken = codec.decode_request_with_dialect(msg.payload)
        except OckamError as exc:
            return self._error(msg, target, f"{INVALID_REQUEST}: {exc}")
        if name == self.config.stream_service.encode():
            return self._stream_service(msg, target, request, spoken, budget)
        if name == self.config.index_service.encode():
            return self._index_service(msg, target, request, spoken)
        key = self.addresses.get(name)
        if key is None:
            return self._error(msg, target, f"unknown address {_shown(target)}")
        return self._stream_worker(msg, target, key, request, spoken, now_ms, budget)

    def _error(self, msg: TransportMessage, me: Address | None, reason: str) -> Outcome:
        if len(reason) > _REASON_CHARS:  # it must fit in one frame beside the routes
            cut = len(reason) - _REASON_CHARS
            reason = f"{reason[:_REASON_CHARS]}... ({cut} more characters)"
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
        self, msg: TransportMessage, me: Address, request: object, spoken: Dialect, budget: int
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
            if request.partitions == 0:
                # Seed 003, *Create partitioned stream*: each partition's instance answers,
                # so with none nothing would, and silence looks like a lost request.
                return self._error(msg, me, NO_PARTITIONS)
            size = self._inits_size(msg, request, spoken)
            if size > budget:  # checked before anything is created
                return self._error(
                    msg,
                    me,
                    f"{INVALID_REQUEST}: the Inits of {request.partitions} partitions would "
                    f"take {size} bytes, over the {max(budget, 0)} left for the replies to "
                    "this read; send it again, alone",
                )
            name = self._name(request.stream_name)
            replies = []
            for p in range(request.partitions):
                # Seed 003: "Each partition instance MUST send CreatePartitionedStreamResponse".
                _, worker = self._stream(name, p)
                init = codec.encode(PartitionedInit(name, p), spoken)
                replies.append(reply_to(msg, init, worker))
            return Outcome(tuple(replies))
        return self._error(
            msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to the stream service"
        )

    def _inits_size(
        self, msg: TransportMessage, request: CreatePartitionedRequest, spoken: Dialect
    ) -> int:
        """About the bytes of the Inits a partitioned create is answered with (the
        largest partition's, times the count; a generated name is estimated)."""
        name = request.stream_name or f"generated_{self.generated + 1}"
        last = request.partitions - 1
        init = codec.encode(PartitionedInit(name, last), spoken)
        one = encode_message(reply_to(msg, init, self.worker_address(name, last)))
        return request.partitions * (len(one) + 2)  # and each one's u16 length prefix

    # -- stream workers: push and pull ------------------------------------------------------

    def _stream_worker(
        self,
        msg: TransportMessage,
        me: Address,
        key: tuple[str, int],
        request: object,
        spoken: Dialect,
        now_ms: int,
        budget: int,
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
            reply = self._pull_reply(msg, me, stream, request, budget)
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
            return Outcome((reply_to(msg, codec.encode(init, spoken), me),))
        return self._error(msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to a stream")

    def _retain(self, stream: StreamLog, now_ms: int) -> None:
        cfg = self.config
        if cfg.retention_messages or cfg.retention_ms:
            min_time = now_ms - cfg.retention_ms if cfg.retention_ms else None
            stream.retain(cfg.retention_messages, min_time)

    def _pull_reply(
        self,
        msg: TransportMessage,
        me: Address,
        stream: StreamLog,
        request: PullRequest,
        budget: int,
    ) -> TransportMessage | None:
        # Room for the payload in one frame: the frame less the routing around it.
        try:
            frame_room = max_payload_size(msg.return_route, (me,))
        except OckamError:  # a return route so long that no reply fits in a frame
            return None
        # And in what the read's budget leaves: seed 003 allows 0..limit messages, and
        # the client asks again from its index.
        try:
            room = min(
                frame_room, max_payload_size(msg.return_route, (me,), min(budget, MAX_FRAME))
            )
        except OckamError:
            room = 0
        # Each message needs at least 2 bytes, so no more than room/2 can ever fit.
        found = stream.read(request.index, min(request.limit, room // 2))
        messages = [StreamMessage(i, data) for i, data in found]
        try:
            response = codec.pull_response_fitting(request.request_id, messages, room)
        except ValueError:  # the budget is spent: an empty answer, which still fits a frame
            try:
                response = codec.pull_response_fitting(request.request_id, (), frame_room)
            except ValueError:  # not even an empty response fits beside that return route
                return None
        return reply_to(msg, codec.encode(response), me)

    # -- the index service ----------------------------------------------------------------

    def _index_service(
        self, msg: TransportMessage, me: Address, request: object, spoken: Dialect
    ) -> Outcome:
        if isinstance(request, GetIndex | SaveIndex | GetPartitionIndex | SavePartitionIndex):
            reply = indexes.answer(self.indexes, request, self.config.dialect)
            if reply is None:  # a save
                return Outcome()
            return Outcome((reply_to(msg, codec.encode(reply, spoken), me),))
        return self._error(
            msg, me, f"{INVALID_REQUEST}: {type(request).__name__} to the index service"
        )


def _shown(address: Address) -> str:
    """``address`` for a reason or a log line: a long peer-chosen value is cut, marked."""
    value = address.value
    if len(value) <= _SHOWN_BYTES:
        return repr(address)
    return f"Address(type={address.type}, value={value[:_SHOWN_BYTES]!r}... ({len(value)} bytes))"
