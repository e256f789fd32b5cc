"""Seed 000's and seed 001's frames laid out by hand with ``struct`` (draft: little-endian,
ASCII tags, ``short_bytes`` = u16 length and the bytes; the addendum's MIGRATE = tag 8,
host as u32 length and bytes, u16 port; MIGRATION_ACK = tag 9), never by our encoder,
for ``test_wallaroo_seed_worker.py`` and ``test_wallaroo_seed_connector.py``. Where the
seed leaves the bytes open they follow our documented choices (``docs/wallaroo.md``,
*Choices where the seeds are vague*): the HELLO version is the first 128 bits of SHA-256
of the seed's title, little-endian; a MESSAGE carries its stream id first; NOTIFY_ACK is
tag 4 with v3's body."""

from __future__ import annotations

import hashlib
import struct

from immortals.wallaroo import Dialect

DRAFT = Dialect.DRAFT
TITLE = b"Wallaroo Connector Protocol: source-only, async, credit based flow"
VERSION = hashlib.sha256(TITLE).digest()[:16][::-1]  # a 128-bit integer, little-endian
NOTHING_SEEN = 2**64 - 1  # NOTIFY_ACK's point for a stream never seen (reference)
EPHEMERAL, BOUNDARY, EOS, UNSTABLE, EVENT_TIME = 1, 2, 4, 8, 16  # seed 000, *Constants*

# --- seed 000's frames, by hand --------------------------------------------------------------


def frame(body: bytes) -> bytes:
    """``frame(Message)``: a u32 little-endian length of what follows, then it."""
    return struct.pack("<I", len(body)) + body


def short(data: bytes) -> bytes:
    """``short_bytes``: a u16 little-endian length, then the bytes."""
    return struct.pack("<H", len(data)) + data


def hello(cookie: bytes = b"c", version: bytes = VERSION) -> bytes:
    return frame(b"H" + version + short(cookie) + short(b"prog") + short(b"inst"))


def ok(credits: int, *points: tuple[int, int]) -> bytes:
    return frame(
        b"O" + struct.pack("<I", credits) + b"".join(struct.pack("<QQ", *p) for p in points)
    )


def error(reason: bytes) -> bytes:
    return frame(b"E" + short(reason))


def notify(sid: int, name: bytes, point: int = 0) -> bytes:
    return frame(b"N" + struct.pack("<Q", sid) + short(name) + struct.pack("<Q", point))


def message(sid: int, mid: int, payload: bytes = b"", flags: int = 0) -> bytes:
    return frame(b"M" + struct.pack("<QHQ", sid, flags, mid) + payload)


def boundary(sid: int, mid: int, flags: int = 0) -> bytes:
    return frame(b"M" + struct.pack("<QHQ", sid, flags | BOUNDARY, mid))


def ack(credits: int, *acks: tuple[int, int]) -> bytes:
    return frame(b"A" + struct.pack("<I", credits) + b"".join(struct.pack("<QQ", *a) for a in acks))


def nack(credits: int, sid: int, point: int) -> bytes:
    return frame(b"!" + struct.pack("<IQQ", credits, sid, point))


def notify_ack(success: bool, sid: int, point: int) -> bytes:
    return frame(b"\x04" + struct.pack("<BQQ", success, sid, point))


def migrate(host: bytes, port: int) -> bytes:
    """Seed 001, *Frame formats*: tag 8, the host (u32 length + bytes), a u16 port."""
    return frame(b"\x08" + struct.pack("<I", len(host)) + host + struct.pack("<H", port))


MIGRATION_ACK = frame(b"\x09")  # seed 001: tag 9, nothing else


def split(wire: bytes) -> list[bytes]:
    """Frames (length prefix included) of ``wire``, by the u32 little-endian lengths."""
    out = []
    while wire:
        (size,) = struct.unpack_from("<I", wire)
        assert len(wire) >= 4 + size, wire
        out.append(wire[: 4 + size])
        wire = wire[4 + size :]
    return out


def reason_of(f: bytes) -> str:
    """The reason of an ERROR frame (length prefix included)."""
    assert f[4:5] == b"E", f
    (n,) = struct.unpack_from("<H", f, 5)
    assert len(f) == 7 + n, f
    return f[7:].decode()
