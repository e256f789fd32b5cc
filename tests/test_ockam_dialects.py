"""Seed 003's index service and partitions, byte by byte, and the released dialect beside.

Payloads are laid out by hand from the seed's BARE schemas (*Create partitioned stream*,
*Partitioned index*, *Creating/retrieving a stream index*, *Updating an index*, *Error*),
not produced by our encoder, fed to a ``StreamHub`` as a TCP connection delivers them,
and its replies compared byte for byte. Then: the dialect reaches the state only as
logged input, and a checkpoint written before there were dialects restores and replays.
"""

from __future__ import annotations

import base64
import io
import pickle

import pytest

from ambrosia_py.binding import Dispatcher
from ambrosia_py.wire import Checkpoint, IncomingRpc, LogRecord, RpcType
from immortals.ockam import codec
from immortals.ockam.codec import Dialect, GetIndex, PullRequest, PullResponse
from immortals.ockam.hub import OckamHub
from immortals.ockam.hub_core import HubConfig, StreamHub
from immortals.ockam.report import REPORT
from immortals.ockam.routing import Address, TransportMessage, encode_message

CONN = Address.tcp("127.0.0.1", 50000)
APP = Address.local("app")
SERVICE = "stream_service"
INDEX = "stream_index_service"

# BARE strings: a uint length, then the UTF-8 bytes.
CREATE_PARTITIONS = "18" + "73747265616d5f6372656174655f706172746974696f6e73"  # seed's name
CREATE_PARTITIONED = "19" + "73747265616d5f6372656174655f706172746974696f6e6564"  # released
STREAM_INDEX = "0c" + "73747265616d5f696e646578"  # "stream_index"
INDEX_PARTITIONED = "18" + "73747265616d5f696e6465785f706172746974696f6e6564"  # released
ERROR = "05" + "6572726f72"  # "error"
C, S, T = "0163", "0173", "0174"  # the strings "c", "s", "t"


def handle(hub: StreamHub, to: str, payload_hex: str) -> list[tuple[Address, str]]:
    """Each reply as (the worker it comes from, its payload in hex)."""
    message = TransportMessage(1, (Address.local(to),), (APP,), bytes.fromhex(payload_hex))
    outcome = hub.handle(encode_message(message), CONN, 0)
    out = []
    for reply in outcome.replies:
        assert reply.onward_route == (CONN, APP)  # back over the connection, to the app
        (sender,) = reply.return_route
        out.append((sender, reply.payload.hex()))
    return out


def error_hex(reason: str) -> str:
    text = reason.encode()
    assert len(text) < 127  # so both lengths are one-byte uints
    return ERROR + f"{len(text) + 1:02x}" + f"{len(text):02x}" + text.hex()


# -- partitioned streams (seed 003, *Create partitioned stream*) ----------------------------


def test_the_seeds_partitioned_create_is_answered_by_each_partition_in_its_name() -> None:
    hub = StreamHub()
    # CreatePartitionedStreamRequest {stream_name: optional<string> "t", partitions: 3}
    replies = handle(hub, SERVICE, CREATE_PARTITIONS + "04" + "01" + T + "03")
    # "Each partition instance MUST send CreatePartitionedStreamResponse", from its own
    # address: {stream_name "t", partition p}.
    assert [payload for _, payload in replies] == [
        CREATE_PARTITIONS + "03" + T + f"{p:02x}" for p in range(3)
    ]
    workers = [worker for worker, _ in replies]
    assert len(set(workers)) == 3 and Address.local(SERVICE) not in workers
    assert set(hub.streams) == {("t", 0), ("t", 1), ("t", 2)}
    # The released name finds the same partitions and is answered in its own name.
    again = handle(hub, SERVICE, CREATE_PARTITIONED + "04" + "01" + T + "03")
    assert again == [(w, CREATE_PARTITIONED + "03" + T + f"{p:02x}") for p, w in enumerate(workers)]
    # Each partition is a stream of its own: a push to partition 2 is its index 0.
    push = "0b" + "73747265616d5f70757368" + "04" + "01" + "02" + "6869"  # stream_push
    ((sender, confirm),) = handle(hub, workers[2].text, push)
    assert sender == workers[2]
    assert confirm == "0b" + "73747265616d5f70757368" + "03" + "01" + "00" + "00"


@pytest.mark.parametrize("name", [CREATE_PARTITIONS, CREATE_PARTITIONED])
@pytest.mark.parametrize("stream", ["01" + T, "00"])  # named, and to be named by the hub
def test_zero_partitions_is_answered_with_an_error_not_silence(name: str, stream: str) -> None:
    hub = StreamHub()
    ((sender, payload),) = handle(
        hub, SERVICE, name + f"{len(stream) // 2 + 1:02x}" + stream + "00"
    )
    assert sender == Address.local(SERVICE)
    assert payload == error_hex(
        "Invalid request: a partitioned stream needs at least one partition"
    )
    assert hub.streams == {} and hub.generated == 0


# -- the index service in the seed's dialect (the default) ----------------------------------


def test_a_pair_never_seen_gets_a_new_record_at_0() -> None:
    hub = StreamHub()
    # GetIndex {client_id "c", stream_name "s"}: union tag 0.
    ((sender, payload),) = handle(hub, INDEX, STREAM_INDEX + "05" + "00" + C + S)
    assert sender == Address.local(INDEX)
    # Index {client_id, stream_name, index: optional<uint> some 0}
    assert payload == STREAM_INDEX + "06" + C + S + "0100"
    # "a new record MUST be created with an index 0": it is state now, and a save of 0
    # (message 0 processed) leaves what it reads unchanged.
    assert hub.indexes == {("c", "s", 0): 0}
    assert handle(hub, INDEX, STREAM_INDEX + "06" + "01" + C + S + "00") == []
    assert handle(hub, INDEX, STREAM_INDEX + "05" + "00" + C + S) == [
        (Address.local(INDEX), STREAM_INDEX + "06" + C + S + "0100")
    ]


def test_the_seeds_partitioned_index_last_processed_and_monotonic() -> None:
    hub = StreamHub()
    get = STREAM_INDEX + "06" + "00" + C + S + "02"  # GetPartitionIndex {c, s, partition 2}

    def index_of(get_hex: str) -> str:
        ((_, payload),) = handle(hub, INDEX, get_hex)
        return payload

    # PartitionIndex {client_id, stream_name, partition 2, index: some 0}, under the name
    # the request came with.
    assert index_of(get) == STREAM_INDEX + "07" + C + S + "02" + "0100"
    # SavePartitionIndex {c, s, partition 2, index 5}: the last message processed was 5.
    assert handle(hub, INDEX, STREAM_INDEX + "07" + "01" + C + S + "02" + "05") == []
    assert index_of(get) == STREAM_INDEX + "07" + C + S + "02" + "0105"
    # "if the current saved index is already higher than SaveIndex, it MUST NOT be changed"
    assert handle(hub, INDEX, STREAM_INDEX + "07" + "01" + C + S + "02" + "03") == []
    assert index_of(get) == STREAM_INDEX + "07" + C + S + "02" + "0105"
    # A two-byte index: 300 processed.
    assert handle(hub, INDEX, STREAM_INDEX + "08" + "01" + C + S + "02" + "ac02") == []
    assert index_of(get) == STREAM_INDEX + "08" + C + S + "02" + "01ac02"
    # Partitions and plain streams keep their own records.
    assert index_of(STREAM_INDEX + "06" + "00" + C + S + "01") == (
        STREAM_INDEX + "07" + C + S + "01" + "0100"
    )
    # The released name reads the same record, in its name.
    released = INDEX_PARTITIONED + "06" + "00" + C + S + "02"
    assert index_of(released) == INDEX_PARTITIONED + "08" + C + S + "02" + "01ac02"
    # The record keeps one past the last processed: the next index to read.
    assert hub.indexes[("c", "s", 2)] == 301


# -- the released dialect, and the same records read by both ----------------------------


def test_the_released_dialect_answers_none_and_stores_the_next_index() -> None:
    hub = StreamHub(HubConfig(dialect=Dialect.RELEASED))
    get = INDEX_PARTITIONED + "06" + "00" + C + S + "02"
    assert handle(hub, INDEX, get) == [
        (Address.local(INDEX), INDEX_PARTITIONED + "06" + C + S + "02" + "00")  # none
    ]
    assert hub.indexes == {}  # nothing created
    handle(hub, INDEX, INDEX_PARTITIONED + "07" + "01" + C + S + "02" + "06")  # next is 6
    assert handle(hub, INDEX, get)[0][1] == INDEX_PARTITIONED + "07" + C + S + "02" + "0106"
    # The same record in the seed's dialect: 5 was the last processed.
    hub.config = HubConfig(dialect=Dialect.SEED)
    assert handle(hub, INDEX, get)[0][1] == INDEX_PARTITIONED + "07" + C + S + "02" + "0105"


def test_the_dialect_reaches_the_state_as_a_logged_name() -> None:
    assert HubConfig().dialect is Dialect.SEED
    assert HubConfig(dialect="released").dialect is Dialect.RELEASED
    with pytest.raises(ValueError, match="expected seed or released"):
        HubConfig(dialect="draft")
    assert OckamHub.Options.dialect == "seed"
    # A logged configure is read by the log analysis allowing this one class alone.

    class OnlyHubConfig(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> object:
            if (module, name) not in REPORT.allowed_globals:
                raise pickle.UnpicklingError(f"{module}.{name} is not allowed")
            return super().find_class(module, name)

    config = HubConfig(retention_messages=5, dialect=Dialect.RELEASED)
    assert OnlyHubConfig(io.BytesIO(pickle.dumps(config))).load() == config


def test_a_configure_logged_under_the_cores_former_module_is_read() -> None:
    """Logs written before the core was ``hub_core`` name ``immortals.ockam.service``;
    they load as they did, and the log analysis still allows the class there."""
    config = HubConfig(stream_service="streams", retention_ms=9, dialect=Dialect.RELEASED)
    new = pickle.dumps(config, protocol=2)  # GLOBAL: the module path as a text line
    assert b"cimmortals.ockam.hub_core\nHubConfig\n" in new
    old = new.replace(b"immortals.ockam.hub_core\n", b"immortals.ockam.service\n")
    back = pickle.loads(old)
    assert type(back) is HubConfig and back == config
    assert ("immortals.ockam.service", "HubConfig") in REPORT.allowed_globals
    hub = StreamHub(config)
    hub.generated = 3
    state = pickle.dumps(hub, protocol=2).replace(
        b"immortals.ockam.hub_core\n", b"immortals.ockam.service\n"
    )
    assert b"immortals.ockam.hub_core" not in state
    restored = pickle.loads(state)
    assert type(restored) is StreamHub
    assert (restored.config, restored.generated) == (config, 3)


# -- a checkpoint written before there were dialects -------------------------------------

# A real checkpoint of the hub, written by the code before dialects (``Dispatcher(OckamHub)``
# after one ``frames`` impulse): stream "s" holds a, b, c; stream "p" has 2 partitions, d
# in partition 1; the index service holds, as the next index to read, c/s 2, c/p/1 1 and
# z/s 0; its HubConfig has no dialect.
OLD_CHECKPOINT = base64.b64decode(
    "QU1CUFlDSwIABCJNGGhAnAMAAAAAAADinwIAAGGABZWRAwABAPBJjB5hbWJyb3NpYV9weS5iaW5kaW5nLmNo"
    "ZWNrcG9pbnSUjAhTbmFwc2hvdJSTlCmBlH2UKIwKY2xhc3NfbmFtZZSMHGltbW9ydGFscy5vY2thbS5odWI6"
    "TwoAYkh1YpSMDSwA8QJ2ZXJzaW9ulEsAjAVzdGF0ZUkAIANoIwAcF0IA4nNlcnZpY2WUjAlTdHJlSQAFfQDy"
    "AQZjb25maWeUaAuMCUh1YkMOAAUfACEOczMAFV9EAA0RAGYNaW5kZXghABMUMgALFwDwBBJyZXRlbnRpb25f"
    "bWVzc2FnZXO+ABcMFwAAEQBCdWKMB0EAEXPTABABFQBOhpSMGNUAZWdtZW50c9YAJ0xvtwBgBWZpcnN0YQCl"
    "BG5leHSUSwOMCDIAgl2UjAZzdGFyCwBhCnRhaWxfEAABMAAADwDzApRdlChDAWGUQwFilEMBY5RlJgBAdGlt"
    "ZTUAQihN6AMDAAQaADBieXTRAGEDdWKMAXCzACJoId8B8A9oJEsAaCVLAGgmXZRoKF2UaCpLAGgrXZRoMF2U"
    "aDLyAE1oM0sBMAAcATAAUEMBZJRhNQDxBk3oA2FoMksBdWJ1jAlhZGRyZXNzZS4BIkMSOwEEjQF/LjAuc5Ro"
    "HhcAAE1wlGg0FwCRMS5wlGg7dYwHuwECUwDgjAFjlGgdSwCHlEsCaEqqAHSHlEsBjAF6FgDQAHWMCWdlbmVy"
    "YXRlZEEBUAZwdXNoDAHwAgR1YowOZnJhbWVzX2hhbmRsIADACXWMCGNhbGxfc2VxLgDwAQhhdHRhY2hlZJQo"
    "kZRoKyl9ABBn0gA4lIwYSwMDFgDyAS5rZXlzlIwIS2V5VGFibGVFA/AMKEsBSqCGAQBKAFwmBUsASwBdlH2U"
    "dJRidWIuAAAAAA=="
)


def _impulse(method: str, *args: object) -> LogRecord:
    spec = OckamHub.rpc_methods_by_name()[method]
    body = pickle.dumps((args, {}), protocol=pickle.HIGHEST_PROTOCOL)
    return LogRecord(1, 2, (IncomingRpc(spec.id, RpcType.IMPULSE, body),))


def _get_frame(client: str) -> bytes:
    request = codec.encode(GetIndex(client, "s"))
    return encode_message(TransportMessage(1, (Address.local(INDEX),), (APP,), request))


def _restored(blob: bytes) -> tuple[Dispatcher, StreamHub]:
    dispatcher = Dispatcher(OckamHub, "hub")
    dispatcher.handle(LogRecord(1, -2, (Checkpoint(blob),)))
    immortal = dispatcher.immortal
    assert isinstance(immortal, OckamHub)
    return dispatcher, immortal.hub


def test_a_checkpoint_from_before_the_dialects_restores_and_replays() -> None:
    dispatcher, hub = _restored(OLD_CHECKPOINT)
    # Its frames were handled with the released semantics, and so is what the log holds
    # after it: a Get for a pair never seen creates nothing.
    assert hub.config == HubConfig(dialect=Dialect.RELEASED)
    assert hub.indexes == {("c", "s", 0): 2, ("c", "p", 1): 1, ("z", "s", 0): 0}
    dispatcher.handle(_impulse("frames", "127.0.0.1:5000", 2000, [_get_frame("new")]))
    assert ("new", "s", 0) not in hub.indexes
    # The next incarnation logs its configuration (the seed's, by default) first.
    dispatcher.handle(_impulse("configure", HubConfig()))
    assert hub.config.dialect is Dialect.SEED
    dispatcher.handle(_impulse("frames", "127.0.0.1:5000", 3000, [_get_frame("newer")]))
    assert hub.indexes[("newer", "s", 0)] == 0  # the seed's new record
    # The old records keep their meaning: c had read messages 0 and 1 of s (next: 2).
    partition = STREAM_INDEX + "06" + "00" + C + "0170" + "01"  # GetPartitionIndex c/p/1
    assert handle(hub, INDEX, STREAM_INDEX + "05" + "00" + C + S)[0][1] == (
        STREAM_INDEX + "06" + C + S + "0101"  # 1: the last processed
    )
    assert handle(hub, INDEX, partition)[0][1] == STREAM_INDEX + "07" + C + "0170" + "01" + "0100"
    ((_, response),) = _send_pull(hub, "stream_service.0.s")
    assert [m.data for m in response.messages] == [b"a", b"b", b"c"]
    # And a checkpoint of the new code restores with its dialect and records.
    _, again = _restored(dispatcher.checkpoint())
    assert again.config == HubConfig() and again.indexes == hub.indexes


def _send_pull(hub: StreamHub, worker: str) -> list[tuple[TransportMessage, PullResponse]]:
    request = codec.encode(PullRequest(1, 0, 10))
    frame = encode_message(TransportMessage(1, (Address.local(worker),), (APP,), request))
    out = []
    for reply in hub.handle(frame, CONN, 0).replies:
        response = codec.decode_response(reply.payload)
        assert isinstance(response, PullResponse)
        out.append((reply, response))
    return out
