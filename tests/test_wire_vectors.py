"""The byte vectors of the released AMBROSIA (shared reference ambrosia.md), both ways."""

from __future__ import annotations

import struct

import pytest
import xxhash

from ambrosia_py.wire import (
    HEADER_SIZE,
    AttachTo,
    Direction,
    IncomingRpc,
    LogRecord,
    Message,
    OutgoingRpc,
    RecordReader,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    check_bytes,
    decode_message,
    decode_zigzag_int,
    decode_zigzag_long,
    encode_message,
    encode_record,
    encode_zigzag_int,
    encode_zigzag_long,
    parse_header,
)

ZIGZAG32 = [
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


@pytest.mark.parametrize(("value", "hex_bytes"), ZIGZAG32)
def test_zigzag32_examples(value: int, hex_bytes: str) -> None:
    raw = bytes.fromhex(hex_bytes)
    assert encode_zigzag_int(value) == raw
    assert decode_zigzag_int(raw) == (value, len(raw))


@pytest.mark.parametrize(("value", "hex_bytes"), ZIGZAG32)
def test_zigzag64_agrees_with_zigzag32_on_32_bit_values(value: int, hex_bytes: str) -> None:
    raw = bytes.fromhex(hex_bytes)
    assert encode_zigzag_long(value) == raw
    assert decode_zigzag_long(raw) == (value, len(raw))


def test_zigzag_extremes() -> None:
    assert encode_zigzag_int(-(2**31)) == bytes.fromhex("ff ff ff ff 0f")
    assert encode_zigzag_long(2**63 - 1) == bytes.fromhex("fe ff ff ff ff ff ff ff ff 01")
    assert encode_zigzag_long(-(2**63)) == bytes.fromhex("ff ff ff ff ff ff ff ff ff 01")


# --- records --------------------------------------------------------------------------

TBPC_RECORD = "01000000 1a000000 c7f179c2cb842dda ffffffffffffffff 02 0b"
FORK_RECORD = "01000000 1f000000 adb7b72576a9270f 0000000000000000 0c 00 00 06 01 7b 7d"

RECORDS: list[tuple[str, int, list[Message]]] = [
    (TBPC_RECORD, -1, [TakeBecomingPrimaryCheckpoint()]),
    (FORK_RECORD, 0, [IncomingRpc(3, RpcType.FORK, b"{}")]),
]


@pytest.mark.parametrize(("hex_bytes", "seq", "messages"), RECORDS)
def test_record_examples_encode(hex_bytes: str, seq: int, messages: list[Message]) -> None:
    assert encode_record(1, seq, messages) == bytes.fromhex(hex_bytes)


@pytest.mark.parametrize(("hex_bytes", "seq", "messages"), RECORDS)
def test_record_examples_decode(hex_bytes: str, seq: int, messages: list[Message]) -> None:
    raw = bytes.fromhex(hex_bytes)
    reader = RecordReader()
    records = reader.records(raw)
    reader.close()
    assert records == [LogRecord(1, seq, tuple(messages))]
    assert records[0].check == parse_header(raw).check


@pytest.mark.parametrize(("hex_bytes", "seq", "messages"), RECORDS)
def test_record_example_check_bytes_are_xxh64_of_the_body(
    hex_bytes: str, seq: int, messages: list[Message]
) -> None:
    raw = bytes.fromhex(hex_bytes)
    header = parse_header(raw)
    assert (header.committer_id, header.length, header.seq) == (1, len(raw), seq)
    body = raw[HEADER_SIZE:]
    # Check bytes sit at bytes 8..15, little-endian, and are XXH64 seed 0 of the body.
    (stored,) = struct.unpack_from("<Q", raw, 8)
    assert stored == header.check == xxhash.xxh64_intdigest(body) == check_bytes(body)
    assert xxhash.xxh64(body, seed=0).digest()[::-1] == raw[8:16]


def test_record_example_check_values() -> None:
    # The literal values in the reference, as integers.
    assert check_bytes(bytes.fromhex("020b")) == 0xDA2D84CBC279F1C7
    assert check_bytes(bytes.fromhex("0c000006017b7d")) == 0x0F27A97625B7B7AD


# --- messages -------------------------------------------------------------------------

MESSAGES: list[tuple[str, str, Message, Direction]] = [
    ("AttachTo server", "0e 01 736572766572", AttachTo("server"), Direction.TO_COORDINATOR),
    (
        "outgoing fork to server",
        "1a 00 0c 736572766572 00 06 01 7b7d",
        OutgoingRpc("server", 3, RpcType.FORK, b"{}"),
        Direction.TO_COORDINATOR,
    ),
    (
        "self-call fork",
        "0e 00 00 00 06 01 7b7d",
        OutgoingRpc("", 3, RpcType.FORK, b"{}"),
        Direction.TO_COORDINATOR,
    ),
    (
        "incoming impulse, raw bytes",
        "0e 00 00 06 02 ff 01 02",
        IncomingRpc(3, RpcType.IMPULSE, b"\xff\x01\x02"),
        Direction.TO_BINDING,
    ),
]


@pytest.mark.parametrize(
    ("hex_bytes", "message"), [(h, m) for _, h, m, _ in MESSAGES], ids=[n for n, *_ in MESSAGES]
)
def test_message_examples_encode(hex_bytes: str, message: Message) -> None:
    assert encode_message(message) == bytes.fromhex(hex_bytes)


@pytest.mark.parametrize(
    ("hex_bytes", "message", "direction"),
    [(h, m, d) for _, h, m, d in MESSAGES],
    ids=[n for n, *_ in MESSAGES],
)
def test_message_examples_decode(hex_bytes: str, message: Message, direction: Direction) -> None:
    raw = bytes.fromhex(hex_bytes)
    decoded, end = decode_message(raw, 0, direction)
    assert decoded == message
    assert end == len(raw)


def test_incoming_impulse_example_keeps_the_throwaway_byte_in_args() -> None:
    # The Node binding puts one non-'{' byte before raw arguments; the wire keeps it.
    msg, _ = decode_message(bytes.fromhex("0e 00 00 06 02 ff 01 02"))
    assert isinstance(msg, IncomingRpc)
    assert bytes(msg.args) == b"\xff\x01\x02"
    assert (msg.sender, msg.call_seq) == ("", 0)


def test_outgoing_fork_stripped_of_its_destination_is_the_incoming_form() -> None:
    # The IC strips the destination: what is left is the incoming body.
    outgoing = encode_message(OutgoingRpc("server", 3, RpcType.FORK, b"{}"))
    incoming = encode_message(IncomingRpc(3, RpcType.FORK, b"{}"))
    assert outgoing[2:] == b"\x0cserver" + incoming[2:]
    assert incoming == bytes.fromhex("0c 00 00 06 01 7b7d")
