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
    "RawMessage",
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
    "TruncatedInputError",
    "UnknownMessageTypeError",
    "UpgradeService",
    "UpgradeTakeCheckpoint",
    "VarintTooLongError",
    "Watermark",
    "decode_message",
    "decode_messages",
    "decode_zigzag_int",
    "decode_zigzag_long",
    "encode_disk_record",
    "encode_message",
    "encode_record",
    "encode_zigzag_int",
    "encode_zigzag_long",
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


# --- ambrosia_py.flow ---------------------------------------------------------------------

import ambrosia_py.flow as flow  # noqa: E402

FLOW_API = [
    "COMPATIBLE_VERSION_MASK",
    "CONNECT_PACKET_LENGTH",
    "CONNECT_PREFIX_LENGTH",
    "ChecksumError",
    "ConnectPacket",
    "ConnectPacketError",
    "ConnectionClosed",
    "ConnectionState",
    "Event",
    "FLAG_IPV6",
    "FRAME_HEADER_LENGTH",
    "FlowConnection",
    "FlowError",
    "FlowFrame",
    "FlowStateError",
    "FrameLengthError",
    "FrameReader",
    "FrameReceived",
    "LEGACY_CONNECT_PACKET_LENGTH",
    "MIN_FRAME_LENGTH",
    "MIN_FULL_CONNECT_PACKET_VERSION",
    "OBJECT_SERIALIZER_FLAG",
    "PACKET_LIMIT",
    "PROTOCOL_VERSION",
    "PeerConnected",
    "TLS_FRAME_HEADER_LENGTH",
    "TOKEN_STREAM_FLAG",
    "Token",
    "TruncatedFrameError",
    "VERSION_FLAGS_MASK",
    "WELL_KNOWN_FIRST",
    "WIRE_PROTOCOL_VERSION",
    "WellKnown",
    "compatible",
    "connect_packet_size",
    "encode_frame",
    "encode_frame_bytes",
    "frame_checksum",
]


def test_flow_all_is_pinned() -> None:
    assert sorted(flow.__all__) == FLOW_API
    assert len(set(flow.__all__)) == len(flow.__all__), "duplicate names in __all__"


def test_flow_star_import_yields_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from ambrosia_py.flow import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == FLOW_API


def test_every_flow_error_is_a_flow_error() -> None:
    errors = [getattr(flow, n) for n in FLOW_API if n.endswith("Error")]
    assert len(errors) == 6
    for error in errors:
        assert issubclass(error, flow.FlowError)
