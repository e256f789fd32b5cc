"""The hub's stream service, stream workers and index service, sans-IO (``StreamHub``).

Each test feeds encoded transport messages, as a TCP connection would deliver them, and
decodes the replies: the stream service's behaviour (seed 003, and
``shared/reference/ockam.md`` where it is silent), the released dialect's index
service, bad input, retention, and sealed segments in files.
"""

from __future__ import annotations

from pathlib import Path

import cloudpickle
import pytest

from ambrosia_py.binding.files import StateFiles, use_state_files
from immortals.ockam import codec
from immortals.ockam.codec import (
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
)
from immortals.ockam.hub_core import HubConfig, StreamHub
from immortals.ockam.routing import (
    MAX_FRAME,
    Address,
    TransportMessage,
    encode_message,
)
from immortals.ockam.segments import SEAL_MESSAGES, Segment, SegmentError

CONN = Address.tcp("127.0.0.1", 50000)
APP = Address.local("app")
SERVICE = Address.local("stream_service")
INDEX = Address.local("stream_index_service")


def send(
    hub: StreamHub, to: Address, message: codec.Request, now: int = 0
) -> list[tuple[TransportMessage, codec.Response]]:
    frame = encode_message(TransportMessage(1, (to,), (APP,), codec.encode(message)))
    outcome = hub.handle(frame, CONN, now)
    out = []
    for reply in outcome.replies:
        assert reply.onward_route == (CONN, APP)  # back over the connection, to the app
        out.append((reply, codec.decode_response(reply.payload)))
    return out


def create(hub: StreamHub, name: str | None) -> tuple[Address, str]:
    ((reply, init),) = send(hub, SERVICE, CreateStreamRequest(name))
    assert isinstance(init, Init)
    (worker,) = reply.return_route
    return worker, init.stream_name


def push(hub: StreamHub, worker: Address, request_id: int, data: bytes, now: int = 0) -> int:
    ((_, confirm),) = send(hub, worker, PushRequest(request_id, data), now)
    assert isinstance(confirm, PushConfirm)
    assert confirm.request_id == request_id and confirm.status == Status.OK
    return confirm.index


def pull(hub: StreamHub, worker: Address, index: int, limit: int, now: int = 0) -> list[int]:
    ((_, response),) = send(hub, worker, PullRequest(7, index, limit), now)
    assert isinstance(response, PullResponse) and response.request_id == 7
    return [m.index for m in response.messages]


def test_named_create_answers_init_from_the_workers_address() -> None:
    hub = StreamHub()
    worker, name = create(hub, "my_stream")
    assert name == "my_stream"
    assert worker != SERVICE and worker.type == 0
    again, _ = create(hub, "my_stream")
    assert again == worker  # idempotent: the same stream, the same address
    assert len(hub.streams) == 1


def test_anonymous_create_gets_a_generated_name_and_empty_is_an_error() -> None:
    hub = StreamHub()
    _, first = create(hub, None)
    _, second = create(hub, None)
    assert first.startswith("generated_") and second.startswith("generated_")
    assert first != second
    ((reply, error),) = send(hub, SERVICE, CreateStreamRequest(""))
    assert error == Error("Invalid request")
    assert reply.return_route == (SERVICE,)


def test_generated_names_skip_names_already_taken() -> None:
    hub = StreamHub()
    create(hub, "generated_1")
    _, name = create(hub, None)
    assert name == "generated_2"


def test_partitioned_create_answers_each_partition() -> None:
    hub = StreamHub()
    replies = send(hub, SERVICE, CreatePartitionedRequest("parts", 2))
    inits = sorted((init.partition, reply.return_route) for reply, init in replies)  # type: ignore[union-attr]
    assert [p for p, _ in inits] == [0, 1]
    assert inits[0][1] != inits[1][1]
    assert all(isinstance(init, PartitionedInit) for _, init in replies)
    ((_, error),) = send(hub, SERVICE, CreatePartitionedRequest("none", 0))
    assert isinstance(error, Error) and "at least one partition" in error.reason
    ((_, error),) = send(hub, SERVICE, CreatePartitionedRequest("huge", 10**9))
    assert isinstance(error, Error)
    assert set(hub.streams) == {("parts", 0), ("parts", 1)}


def test_push_confirm_echoes_the_request_id_and_pull_returns_it() -> None:
    hub = StreamHub()
    worker, _ = create(hub, "s")
    assert push(hub, worker, 42, b"hello") == 0
    assert push(hub, worker, 42, b"again") == 1  # a repeated id is stored too (seed 003)
    ((_, response),) = send(hub, worker, PullRequest(9, 0, 10))
    assert isinstance(response, PullResponse)
    assert [(m.index, m.data) for m in response.messages] == [(0, b"hello"), (1, b"again")]


def test_pull_ranges_after_101_pushes() -> None:
    hub = StreamHub()
    worker, _ = create(hub, "s")
    for i in range(101):
        assert push(hub, worker, i, f"m{i}".encode()) == i
    assert pull(hub, worker, 0, 10) == list(range(10))
    assert pull(hub, worker, 10, 10) == list(range(10, 20))
    assert pull(hub, worker, 95, 10) == list(range(95, 101))
    assert pull(hub, worker, 101, 10) == []
    assert pull(hub, worker, 5, 0) == []


def test_partitions_have_their_own_indexes() -> None:
    hub = StreamHub()
    replies = send(hub, SERVICE, CreatePartitionedRequest("p", 2))
    workers = {init.partition: reply.return_route[0] for reply, init in replies}  # type: ignore[union-attr]
    assert push(hub, workers[0], 1, b"a") == 0
    assert push(hub, workers[1], 2, b"b") == 0
    assert push(hub, workers[1], 3, b"c") == 1


def test_indexes_are_per_stream_not_per_publisher() -> None:
    # Seed 003: "Index MUST be scoped per stream and NOT per publisher".
    hub = StreamHub()
    worker, _ = create(hub, "s")
    confirms = []
    for k in range(4):
        publisher = Address.local(f"publisher.{k % 2}")  # two publishers, interleaved
        frame = encode_message(
            TransportMessage(1, (worker,), (publisher,), codec.encode(PushRequest(1, b"x")))
        )
        (reply,) = hub.handle(frame, CONN, 0).replies
        assert reply.onward_route == (CONN, publisher)
        confirm = codec.decode_response(reply.payload)
        assert isinstance(confirm, PushConfirm)
        confirms.append(confirm.index)
    assert confirms == [0, 1, 2, 3]


def test_index_service_in_the_released_dialect() -> None:
    # The seed's dialect, the default, is tested byte by byte in test_ockam_dialects.py.
    hub = StreamHub(HubConfig(dialect=Dialect.RELEASED))
    ((reply, index),) = send(hub, INDEX, GetIndex("client", "s"))
    assert index == Index("client", "s", None)
    assert reply.return_route == (INDEX,)
    assert send(hub, INDEX, SaveIndex("client", "s", 10)) == []  # saves are unanswered
    send(hub, INDEX, SaveIndex("client", "s", 5))  # monotonic: ignored
    ((_, index),) = send(hub, INDEX, GetIndex("client", "s"))
    assert index == Index("client", "s", 10)
    ((_, pindex),) = send(hub, INDEX, GetPartitionIndex("client", "s", 1))
    assert pindex == PartitionIndex("client", "s", 1, None)
    send(hub, INDEX, SavePartitionIndex("client", "s", 1, 10))
    send(hub, INDEX, SavePartitionIndex("client", "s", 1, 5))
    ((_, pindex),) = send(hub, INDEX, GetPartitionIndex("client", "s", 1))
    assert pindex == PartitionIndex("client", "s", 1, 10)


def test_service_names_come_from_the_configuration() -> None:
    hub = StreamHub(HubConfig(stream_service="streams", index_service="indexes"))
    ((_, init),) = send(hub, Address.local("streams"), CreateStreamRequest("x"))
    assert init == Init("x")
    ((_, index),) = send(hub, Address.local("indexes"), GetIndex("c", "x"))
    assert index == Index("c", "x", 0)
    ((_, error),) = send(hub, SERVICE, CreateStreamRequest("x"))
    assert isinstance(error, Error) and "unknown address" in error.reason


# -- bad input -----------------------------------------------------------------------


def test_undecodable_routing_is_dropped_and_reported() -> None:
    hub = StreamHub()
    outcome = hub.handle(b"\x01\x05\x00", CONN, 0)
    assert outcome.replies == ()
    assert outcome.problem is not None and "offset" in outcome.problem


@pytest.mark.parametrize(
    "payload",
    [
        b"\x0bstream_nope\x00",  # unknown protocol name
        codec.encode(CreateStreamRequest("x"))[:-1],  # truncated
        codec.encode(CreateStreamRequest("x")) + b"\x00",  # trailing byte
        b"\x0dstream_create\x03\x01\x01\xff",  # a name that is not UTF-8
        b"",  # no payload at all
    ],
)
def test_bad_payloads_are_answered_with_error_and_store_nothing(payload: bytes) -> None:
    hub = StreamHub()
    frame = encode_message(TransportMessage(1, (SERVICE,), (APP,), payload))
    outcome = hub.handle(frame, CONN, 0)
    ((reply,),) = [outcome.replies]
    error = codec.decode_response(reply.payload)
    assert isinstance(error, Error) and error.reason.startswith("Invalid request")
    assert hub.streams == {}


def test_a_bad_push_stores_nothing() -> None:
    hub = StreamHub()
    worker, _ = create(hub, "s")
    bad = codec.encode(PushRequest(1, b"abc"))[:-1]
    outcome = hub.handle(encode_message(TransportMessage(1, (worker,), (APP,), bad)), CONN, 0)
    assert isinstance(codec.decode_response(outcome.replies[0].payload), Error)
    assert len(hub.streams[("s", 0)]) == 0 and hub.pushes == 0


def test_unknown_onward_address_and_wrong_protocol_get_errors() -> None:
    hub = StreamHub()
    ((_, error),) = send(hub, Address.local("nobody"), CreateStreamRequest("x"))
    assert isinstance(error, Error) and "unknown address" in error.reason
    ((_, error),) = send(hub, SERVICE, PushRequest(1, b"x"))
    assert isinstance(error, Error)
    ((_, error),) = send(hub, INDEX, CreateStreamRequest("x"))
    assert isinstance(error, Error)


def test_no_return_route_means_no_reply() -> None:
    hub = StreamHub()
    frame = encode_message(TransportMessage(1, (), (), b"junk"))
    # The TCP hop itself is a return route, so the error goes back over the connection.
    outcome = hub.handle(frame, CONN, 0)
    assert [r.onward_route for r in outcome.replies] == [(CONN,)]


def test_pull_replies_fit_in_one_frame() -> None:
    hub = StreamHub()
    worker, _ = create(hub, "big")
    for i in range(5):
        push(hub, worker, i, bytes([i]) * 30_000)
    ((reply, response),) = send(hub, worker, PullRequest(1, 0, 100))
    assert isinstance(response, PullResponse)
    assert [m.index for m in response.messages] == [0, 1]  # a third would not fit
    assert len(encode_message(reply)) <= MAX_FRAME


# -- retention -----------------------------------------------------------------------


def test_retention_by_count_and_age() -> None:
    hub = StreamHub(HubConfig(retention_messages=10))
    worker, _ = create(hub, "s")
    for i in range(25):
        push(hub, worker, i, b"x")
    assert pull(hub, worker, 0, 100) == list(range(15, 25))  # below the earliest: from it
    aged = StreamHub(HubConfig(retention_ms=1000))
    worker, _ = create(aged, "s")
    for t in range(0, 5000, 100):
        push(aged, worker, t, b"x", now=t)
    assert pull(aged, worker, 0, 100, now=5000) == list(range(40, 50))  # t >= 4000


def test_age_retention_across_sealed_segments() -> None:
    hub = StreamHub(HubConfig(retention_ms=SEAL_MESSAGES))
    worker, _ = create(hub, "s")
    total = 3 * SEAL_MESSAGES + 10
    for t in range(total):
        push(hub, worker, t, b"x", now=t)
    indexes = pull(hub, worker, 0, 10, now=total)
    assert indexes == list(range(total - SEAL_MESSAGES, total - SEAL_MESSAGES + 10))
    stream = hub.streams[("s", 0)]
    assert all(
        start + seg.count > stream.first
        for start, seg in zip(stream.starts, stream.segments, strict=True)
    )


# -- sealed segments -----------------------------------------------------------------


def _filled(n: int) -> tuple[StreamHub, Address]:
    hub = StreamHub()
    worker, _ = create(hub, "s")
    for i in range(n):
        push(hub, worker, i, f"message {i}".encode())
    return hub, worker


def test_reads_cross_segment_boundaries() -> None:
    hub, worker = _filled(3 * SEAL_MESSAGES + 5)
    assert len(hub.streams[("s", 0)].segments) == 3
    start = SEAL_MESSAGES - 3
    ((_, response),) = send(hub, worker, PullRequest(1, start, SEAL_MESSAGES + 10))
    assert isinstance(response, PullResponse)
    assert [m.index for m in response.messages] == list(range(start, start + SEAL_MESSAGES + 10))
    assert all(m.data == f"message {m.index}".encode() for m in response.messages)


def test_checkpoints_hold_segment_names_not_messages(tmp_path: Path) -> None:
    hub, worker = _filled(20 * SEAL_MESSAGES)
    inline = len(cloudpickle.dumps(hub))
    files = StateFiles(tmp_path / "files")
    with use_state_files(files):
        blob = cloudpickle.dumps(hub)
        assert len(list(files.path.iterdir())) == 20  # one file per sealed segment
        again = cloudpickle.dumps(hub)  # the files exist now: nothing written twice
        restored = cloudpickle.loads(blob)
        assert pull(restored, worker, 5 * SEAL_MESSAGES, 3) == [
            5 * SEAL_MESSAGES + i for i in range(3)
        ]
        ((_, response),) = send(restored, worker, PullRequest(1, 7 * SEAL_MESSAGES + 1, 1))
    assert isinstance(response, PullResponse)
    assert response.messages[0].data == f"message {7 * SEAL_MESSAGES + 1}".encode()
    assert len(blob) * 20 < inline and len(again) == len(blob)


def test_a_damaged_segment_file_is_refused(tmp_path: Path) -> None:
    hub, worker = _filled(SEAL_MESSAGES)
    files = StateFiles(tmp_path / "files")
    with use_state_files(files):
        blob = cloudpickle.dumps(hub)
    (path,) = files.path.iterdir()
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    from immortals.ockam import segments

    segments._cache.clear()
    with use_state_files(files):
        restored = cloudpickle.loads(blob)
        with pytest.raises(SegmentError, match="do not match its name"):
            pull(restored, worker, 0, 1)


def test_read_only_state_files_write_nothing(tmp_path: Path) -> None:
    hub, _ = _filled(2 * SEAL_MESSAGES)
    files = StateFiles(tmp_path / "files", writable=False)
    with use_state_files(files):
        blob = cloudpickle.dumps(hub)
    assert not files.path.exists()
    assert (
        cloudpickle.loads(blob).streams[("s", 0)].segments[0] == hub.streams[("s", 0)].segments[0]
    )


def test_without_state_files_segments_travel_inline() -> None:
    hub, worker = _filled(SEAL_MESSAGES + 1)
    restored = cloudpickle.loads(cloudpickle.dumps(hub))
    assert pull(restored, worker, 0, 2) == [0, 1]
    assert isinstance(restored.streams[("s", 0)].segments[0], Segment)


def test_a_return_route_too_long_for_any_reply_is_dropped_and_reported() -> None:
    hub = StreamHub()
    worker, _ = create(hub, "s")
    request = codec.encode(PullRequest(1, 0, 10))
    route = tuple(Address.local("x" * 200) for _ in range(300))
    size = len(encode_message(TransportMessage(1, (worker,), route, request)))
    pad = Address.local("y" * (MAX_FRAME - size - 3))  # 3: its type and length bytes
    frame = encode_message(TransportMessage(1, (worker,), (*route, pad), request))
    assert len(frame) == MAX_FRAME  # fits; the reply adds the TCP hop and cannot
    outcome = hub.handle(frame, CONN, 0)
    assert outcome.replies == () and outcome.problem is not None
