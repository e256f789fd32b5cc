"""The test oracle for AMBROSIA logs (tests/log_oracle.py) against hand-laid bytes.

The first vectors are reference/ambrosia.md's own examples, copied as hex; the rest are
laid out here field by field with ``struct`` and ``xxhash`` (no project code), one for
every message layout the Spark rows use, the on-disk tail (watermarks, then checkpoint
blobs) and the torn tail.
"""

from __future__ import annotations

import struct

import pytest
import xxhash

from tests import log_oracle as oracle

# reference ambrosia.md, Primitives: "ZigZag32 examples".
ZIGZAG_EXAMPLES = [
    (0, "00"),
    (1, "02"),
    (-1, "01"),
    (5, "0a"),
    (63, "7e"),
    (64, "80 01"),
    (-65, "81 01"),
    (300, "d8 04"),
    (2147483647, "fe ff ff ff 0f"),
]

# reference ambrosia.md, Log record header: the two examples (wire form).
BECOMING_PRIMARY = "01000000 1a000000 c7f179c2cb842dda ffffffffffffffff 02 0b"
FORK_RECORD = "01000000 1f000000 adb7b72576a9270f 0000000000000000 0c 00 00 06 01 7b 7d"
# The same records on disk, by hand: the length stored as -length-1 (-27, -32), then
# no watermarks and no trim watermarks (two zero counts).
BECOMING_PRIMARY_ON_DISK = "01000000 e5ffffff c7f179c2cb842dda ffffffffffffffff 02 0b 00 00"
FORK_RECORD_ON_DISK = (
    "01000000 e0ffffff adb7b72576a9270f 0000000000000000 0c 00 00 06 01 7b 7d 00 00"
)


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def disk(committer: int, seq: int, body: bytes, tail: bytes = b"\x00\x00") -> bytes:
    """An on-disk record laid out by hand: header with -length-1 and XXH64, body, tail."""
    length = 24 + len(body)
    return struct.pack("<iiQq", committer, -length - 1, xxhash.xxh64_intdigest(body), seq) + (
        body + tail
    )


@pytest.mark.parametrize(("value", "text"), ZIGZAG_EXAMPLES)
def test_the_reference_s_zigzag_examples(value: int, text: str) -> None:
    data = h(text)
    assert oracle.zigzag(data + b"\x99", 0, oracle.INT_BYTES) == (value, len(data))


def test_varints_longer_than_their_width_are_refused() -> None:
    with pytest.raises(oracle.OracleError, match="longer than 5 bytes"):
        oracle.zigzag(h("ff ff ff ff ff 01"), 0, oracle.INT_BYTES)
    assert oracle.zigzag(h("ff ff ff ff ff ff ff ff ff 01"), 0, oracle.LONG_BYTES) == (
        -(2**63),
        10,
    )


@pytest.mark.parametrize(
    ("text", "on_disk"),
    [(BECOMING_PRIMARY, False), (BECOMING_PRIMARY_ON_DISK, True)],
)
def test_the_reference_s_becoming_primary_record(text: str, on_disk: bool) -> None:
    data = h(text)
    (record,) = oracle.records(data, on_disk=on_disk)
    assert (record.committer, record.length, record.seq) == (1, 26, -1)
    assert record.check == 0xDA2D84CBC279F1C7 == xxhash.xxh64_intdigest(b"\x02\x0b")
    assert record.messages == [oracle.Message(11, "TakeBecomingPrimaryCheckpoint", {})]
    assert (record.end, record.body) == (len(data), b"\x02\x0b")


@pytest.mark.parametrize(("text", "on_disk"), [(FORK_RECORD, False), (FORK_RECORD_ON_DISK, True)])
def test_the_reference_s_fork_record(text: str, on_disk: bool) -> None:
    (record,) = oracle.records(h(text), on_disk=on_disk)
    assert (record.committer, record.length, record.seq, record.watermarks) == (1, 31, 0, [])
    fork = {"call": True, "method_id": 3, "rpc_type": "fork", "sender": None, "call_seq": None}
    assert record.messages == [oracle.Message(0, "RPC", fork | {"args": b"{}"})]


def test_the_reference_s_rpc_examples() -> None:
    # AttachTo "server", then an incoming Impulse to method 3 with raw bytes 01 02.
    attach, impulse = oracle.messages(h("0e 01 736572766572 0e 00 00 06 02 ff 01 02"))
    assert attach == oracle.Message(1, "AttachTo", {"destination": "server"})
    assert impulse.fields == {
        "call": True,
        "method_id": 3,
        "rpc_type": "impulse",
        "sender": None,
        "call_seq": None,
        "args": b"\xff\x01\x02",
    }


ASYNC_CALL = "1c 00 00 18 00 0c 636c69656e74 52 7b7d"  # method 12, from "client", seq 41
NO_VALUE = "14 00 02 0c 736572766572 12"  # from "server", seq 9, no length, no value
VALUE = "1a 00 01 0c 736572766572 12 04 6f6b"  # from "server", seq 9, value "ok"
EXCEPTION = "1e 00 03 0c 736572766572 12 08 6f6f7073"  # exception "oops"
FORK = "0c 00 00 06 01 7b7d"
IMPULSE = "0e 00 00 07 02 ff0102"  # method -4
BATCH = "22 05 04" + FORK + IMPULSE  # RPCBatch of 2
COUNTED_BATCH = "24 0d 04 02" + FORK + IMPULSE  # CountReplayableRPCBatch of 2, 1 replayable
CONTROL = (
    "04 08 0a"  # Checkpoint, blob of 5 bytes
    "06 09 6869"  # InitialMessage "hi"
    "04 0e 08"  # TrimTo 4
    "02 02"  # TakeCheckpoint
    "06 03 14 12"  # Commit 10, 9
    "06 04 14 12"  # ReplayFrom 10, 9
    "06 06 7069"  # Ping "pi"
    "02 07"  # PingReturn, no data
)
WATERMARKS = (
    "02 08 70656572" + struct.pack("<qq", 7, 6).hex()  # one watermark: "peer", 7, 6
) + ("02 02 78" + struct.pack("<q", 3).hex())  # one trim watermark: "x", 3


def test_calls_and_return_values() -> None:
    call, none, value, exc = oracle.messages(h(ASYNC_CALL + NO_VALUE + VALUE + EXCEPTION))
    assert call.fields == {
        "call": True,
        "method_id": 12,
        "rpc_type": "async",
        "sender": "client",
        "call_seq": 41,
        "args": b"{}",
    }
    back = {"call": False, "sender": "server", "call_seq": 9}
    assert none.fields == back | {"return_type": "no_value", "value": b""}
    assert value.fields == back | {"return_type": "value", "value": b"ok"}
    assert exc.fields == back | {"return_type": "exception", "value": b"oops"}


def test_batches_hold_their_calls_and_flatten() -> None:
    batch, counted = oracle.messages(h(BATCH + COUNTED_BATCH))
    assert (batch.name, counted.name, counted.fields["replayable"]) == (
        "RPCBatch",
        "CountReplayableRPCBatch",
        1,
    )
    flat = oracle.flatten([batch, counted])
    assert [(m.fields["method_id"], m.fields["rpc_type"]) for m in flat] == [
        (3, "fork"),
        (-4, "impulse"),
    ] * 2


def test_a_log_on_disk_with_watermarks_blobs_and_a_torn_tail() -> None:
    first = disk(5, 0, h(ASYNC_CALL + VALUE), h(WATERMARKS))
    second = disk(5, 1, h(CONTROL)) + b"state"  # the blob after the (empty) watermarks
    third = disk(5, 2, h(BATCH))
    data = first + second + third
    got = list(oracle.records(data + third[:30]))  # and the first 30 bytes of one more
    assert [(r.offset, r.end, r.seq) for r in got] == [
        (0, len(first), 0),
        (len(first), len(first) + len(second), 1),
        (len(first) + len(second), len(data), 2),
    ]
    assert got[0].watermarks == [("peer", 7, 6)] and got[0].trims == [("x", 3)]
    names = [m.name for m in got[1].messages]
    assert names == [
        "Checkpoint",
        "InitialMessage",
        "TrimTo",
        "TakeCheckpoint",
        "Commit",
        "ReplayFrom",
        "Ping",
        "PingReturn",
    ]
    fields = [m.fields for m in got[1].messages]
    assert fields[0] == {"blob_length": 5, "blob": b"state"}
    assert fields[1:3] == [{"data": b"hi"}, {"seq": 4}]
    assert fields[4:] == [
        {"seq": 10, "replayable_seq": 9},
        {"seq": 10, "replayable_seq": 9},
        {"data": b"pi"},
        {"data": b""},
    ]
    # Cut anywhere inside a record (its blob included): the records before it.
    for cut in range(len(first) + 1, len(first) + len(second)):
        assert [r.seq for r in oracle.records(data[:cut])] == [0], cut


def test_a_recovery_checkpoint_record_has_check_bytes_zero() -> None:
    body = h("04 08 04")  # Checkpoint, blob of 2 bytes
    record = struct.pack("<iiQq", 1, -(24 + 3) - 1, 0, -2) + body + h("00 00") + b"ok"
    ((got),) = oracle.records(record)
    assert (got.seq, got.check, got.messages[0].fields["blob"]) == (-2, 0, b"ok")


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (disk(1, 0, h(FORK))[:8] + bytes(8) + disk(1, 0, h(FORK))[16:], "check bytes"),
        (disk(1, 0, h("02 2a")), "unknown message type 42"),
        (disk(1, 0, h("04 02 00")), "TakeCheckpoint with 1 bytes"),
        (disk(1, 0, h("08 00 00 06 05")), "RPC type byte"),
        (disk(1, 0, h("0e 00 04 02 73 00 02 00")), "return-type byte 4"),
        (disk(1, 0, h("0e 00 01 02 73 00 00 78")), "1 bytes after a return value"),
        (disk(1, 0, h("0c 00 01 02 73 00 08")), "runs past the body"),
        (disk(1, 0, h("10 00 00 00 00 04 ff fe 00")), "not UTF-8"),
        (disk(1, 0, h("10 05 04" + FORK[:-2])), "runs past the body"),
        (disk(1, 0, h("0c 05 02 06 09 6869")), "batch of 1 RPCs holds"),
        (h(FORK_RECORD), "not negative"),
    ],
)
def test_what_the_oracle_does_not_expect_is_an_error(data: bytes, why: str) -> None:
    with pytest.raises(oracle.OracleError, match=why):
        list(oracle.records(data))
