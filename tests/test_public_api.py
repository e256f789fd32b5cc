"""The public surface of ``ambrosia_py.wire`` is pinned: changing it is a deliberate act."""

from __future__ import annotations

import pytest

import ambrosia_py.wire as wire

WIRE_API = [
    "AttachTo",
    "BatchCountError",
    "BecomingPrimary",
    "CHECKPOINT_SEQ",
    "CONTROL_SEQ",
    "CheckBytesError",
    "Checkpoint",
    "CheckpointHeader",
    "CheckpointSizeError",
    "Commit",
    "CommitterError",
    "CountReplayableRpcBatch",
    "DEFAULT_MAX_CHECKPOINT_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "Direction",
    "DiskRecordTail",
    "Frame",
    "HEADER_SIZE",
    "IncomingReturnValue",
    "IncomingRpc",
    "InitialMessage",
    "InvalidNameError",
    "LogRecord",
    "MalformedMessageError",
    "Message",
    "MessageReader",
    "MessageType",
    "OutgoingReturnValue",
    "OutgoingRpc",
    "Payload",
    "Ping",
    "PingReturn",
    "ProtocolError",
    "RawRecord",
    "RecordHeader",
    "RecordLengthError",
    "RecordReader",
    "ReplayFrom",
    "ReturnType",
    "RpcBatch",
    "RpcMessage",
    "RpcType",
    "SequenceError",
    "TakeBecomingPrimaryCheckpoint",
    "TakeCheckpoint",
    "TrimTo",
    "TrimWatermark",
    "TruncatedError",
    "UnknownMessageTypeError",
    "UpgradeService",
    "UpgradeTakeCheckpoint",
    "VarintTooLongError",
    "Watermark",
    "check_bytes",
    "coalesce_parts",
    "decode_disk_tail",
    "decode_message",
    "decode_messages",
    "decode_zigzag_int",
    "decode_zigzag_long",
    "disk_to_wire",
    "encode_disk_record",
    "encode_disk_tail",
    "encode_message",
    "encode_message_parts",
    "encode_record",
    "encode_record_parts",
    "encode_zigzag_int",
    "encode_zigzag_long",
    "frame_parts",
    "frame_record",
    "parse_header",
    "record_headers",
    "verify_check",
]


def test_wire_all_is_pinned() -> None:
    assert sorted(wire.__all__) == WIRE_API
    assert len(set(wire.__all__)) == len(wire.__all__), "duplicate names in __all__"


@pytest.mark.parametrize("name", WIRE_API)
def test_every_public_name_is_importable(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from ambrosia_py.wire import {name}", namespace)
    assert namespace[name] is not None


def test_star_import_yields_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from ambrosia_py.wire import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == WIRE_API


def test_every_wire_error_is_a_protocol_error() -> None:
    errors = [getattr(wire, n) for n in WIRE_API if n.endswith("Error")]
    assert len(errors) == 12
    for error in errors:
        assert issubclass(error, wire.ProtocolError)
