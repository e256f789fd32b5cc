"""The AMBROSIA language-binding protocol (seed 002), sans-IO: bytes in, objects out.

Varints, message types, log records in wire and on-disk form, and incremental readers.
Nothing here touches a socket, a file or a clock. ``__all__`` is the public surface; the
few names imported below with ``as`` are building blocks of hot paths (framing, record
parts) that other packages of this project still reach through the package: new code
imports them from their module.
"""

from .buffer import DEFAULT_MAX_CHECKPOINT_SIZE, DEFAULT_MAX_MESSAGE_SIZE
from .decoding import decode_message, decode_messages
from .errors import (
    BatchCountError,
    CheckBytesError,
    CheckpointSizeError,
    CommitterError,
    InvalidNameError,
    MalformedMessageError,
    ProtocolError,
    RecordLengthError,
    SequenceError,
    TruncatedInputError,
    UnknownMessageTypeError,
    VarintTooLongError,
)
from .message_reader import MessageReader, RawMessage
from .messages import (
    AttachTo,
    BecomingPrimary,
    Checkpoint,
    CheckpointHeader,
    Commit,
    CountReplayableRpcBatch,
    Direction,
    IncomingReturnValue,
    IncomingRpc,
    InitialMessage,
    Message,
    MessageType,
    OutgoingReturnValue,
    OutgoingRpc,
    Payload,
    Ping,
    PingReturn,
    ReplayFrom,
    ReturnType,
    RpcBatch,
    RpcMessage,
    RpcType,
    TakeBecomingPrimaryCheckpoint,
    TakeCheckpoint,
    TrimTo,
    UpgradeService,
    UpgradeTakeCheckpoint,
    encode_message,
)
from .messages import encode_messages_parts as encode_messages_parts
from .reader import RawRecord, RecordReader
from .records import (
    CHECKPOINT_SEQ,
    CONTROL_SEQ,
    DEFAULT_MAX_RECORD_SIZE,
    HEADER_SIZE,
    DiskRecordTail,
    LogRecord,
    RecordHeader,
    TrimWatermark,
    Watermark,
    encode_disk_record,
    encode_record,
)
from .records import check_bytes as check_bytes
from .records import coalesce_parts as coalesce_parts
from .records import decode_disk_tail as decode_disk_tail
from .records import disk_to_wire as disk_to_wire
from .records import encode_disk_tail as encode_disk_tail
from .records import encode_marks_tail as encode_marks_tail
from .records import encode_record_parts as encode_record_parts
from .records import parse_header as parse_header
from .records import record_headers as record_headers
from .varint import (
    decode_zigzag_int,
    decode_zigzag_long,
    encode_zigzag_int,
    encode_zigzag_long,
)

__all__ = [
    "CHECKPOINT_SEQ",
    "CONTROL_SEQ",
    "DEFAULT_MAX_CHECKPOINT_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_MAX_RECORD_SIZE",
    "HEADER_SIZE",
    "AttachTo",
    "BatchCountError",
    "BecomingPrimary",
    "CheckBytesError",
    "Checkpoint",
    "CheckpointHeader",
    "CheckpointSizeError",
    "Commit",
    "CommitterError",
    "CountReplayableRpcBatch",
    "Direction",
    "DiskRecordTail",
    "RawMessage",
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
