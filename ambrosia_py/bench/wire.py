"""``ambrosia-py bench wire``: encode and decode rates of the wire core.

Fork RPCs with 16 B, 1 KiB and 64 KiB arguments, packed 1,000 to a log record. Encoding
builds the record's buffers (header with XXH64 check bytes, framed messages); decoding
feeds the bytes to an incremental :class:`RecordReader`, which verifies the check bytes
and decodes every message (arguments stay views into the record: no per-message copy).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import click
from rich.console import Console
from rich.table import Table

from ..wire import IncomingRpc, RecordReader, RpcType, encode_record_parts

__all__ = ["measure", "wire"]

MESSAGES_PER_RECORD = 1000
_SOCKET_CHUNK = 256 * 1024  # what one socket read typically returns


def _rate(fn: Callable[[], int], min_seconds: float) -> tuple[float, int]:
    """Run ``fn`` (which returns a count) repeatedly for ``min_seconds``: (seconds, count)."""
    fn()  # warm up
    count = 0
    start = time.perf_counter()
    while True:
        count += fn()
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return elapsed, count


def measure(arg_size: int, min_seconds: float = 1.0) -> dict[str, float]:
    """Encode/decode figures for records of fork RPCs with ``arg_size``-byte arguments."""
    args = bytes(range(256)) * (arg_size // 256) + bytes(arg_size % 256)
    messages = [IncomingRpc(i % 50, RpcType.FORK, args) for i in range(MESSAGES_PER_RECORD)]
    parts = encode_record_parts(1, 0, messages)
    record = b"".join(parts)
    payload_bytes = len(record)
    # Enough records per decode round that a round lasts a while even for small messages.
    records_per_round = max(1, 2_000_000 // payload_bytes)
    stream = b"".join(
        b"".join(encode_record_parts(1, s, messages)) for s in range(records_per_round)
    )

    def encode() -> int:
        encode_record_parts(1, 0, messages)
        return 1

    def decode() -> int:
        reader = RecordReader(max_record_size=2 * payload_bytes)
        reader.feed(stream)
        n = 0
        for rec in reader:
            n += len(rec.messages)
        assert n == MESSAGES_PER_RECORD * records_per_round
        return records_per_round

    chunks = [stream[i : i + _SOCKET_CHUNK] for i in range(0, len(stream), _SOCKET_CHUNK)]

    def decode_chunked() -> int:
        reader = RecordReader(max_record_size=2 * payload_bytes)
        n = 0
        for chunk in chunks:
            reader.feed(chunk)
            for rec in reader:
                n += len(rec.messages)
        assert n == MESSAGES_PER_RECORD * records_per_round
        return records_per_round

    enc_s, enc_records = _rate(encode, min_seconds)
    dec_s, dec_records = _rate(decode, min_seconds)
    chk_s, chk_records = _rate(decode_chunked, min_seconds)
    return {
        "arg_size": arg_size,
        "record_bytes": payload_bytes,
        "encode_msgs_per_s": enc_records * MESSAGES_PER_RECORD / enc_s,
        "encode_mb_per_s": enc_records * payload_bytes / enc_s / 1e6,
        "decode_msgs_per_s": dec_records * MESSAGES_PER_RECORD / dec_s,
        "decode_mb_per_s": dec_records * payload_bytes / dec_s / 1e6,
        "chunked_msgs_per_s": chk_records * MESSAGES_PER_RECORD / chk_s,
        "chunked_mb_per_s": chk_records * payload_bytes / chk_s / 1e6,
    }


@click.command()
@click.option("--seconds", default=1.0, show_default=True, help="Minimum time per figure.")
def wire(seconds: float) -> None:
    """Encode/decode rates of fork RPC records (16 B, 1 KiB, 64 KiB arguments).

    "decode" feeds each round's bytes to the reader at once; "256K-chunk" feeds them in
    256 KiB pieces, as socket reads arrive, so large records are assembled first.
    """
    table = Table(title=f"wire: fork RPCs, {MESSAGES_PER_RECORD} per record")
    cols = ("args", "record", "encode msg/s", "encode MB/s", "decode msg/s", "decode MB/s")
    for col in (*cols, "256K-chunk msg/s", "256K-chunk MB/s"):
        table.add_column(col, justify="right")
    for size in (16, 1024, 64 * 1024):
        r = measure(size, seconds)
        table.add_row(
            f"{size} B",
            f"{r['record_bytes'] / 1e6:.2f} MB",
            f"{r['encode_msgs_per_s']:,.0f}",
            f"{r['encode_mb_per_s']:,.0f}",
            f"{r['decode_msgs_per_s']:,.0f}",
            f"{r['decode_mb_per_s']:,.0f}",
            f"{r['chunked_msgs_per_s']:,.0f}",
            f"{r['chunked_mb_per_s']:,.0f}",
        )
    Console(width=160).print(table)
