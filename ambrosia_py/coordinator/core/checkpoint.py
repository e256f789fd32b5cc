"""The byte format of the coordinator's checkpoint files, ``serverchkpt<N>`` (ours).

A checkpoint file holds the coordinator's own state at the start of log N next to the
binding's blob: what recovery needs to number records on, drop regenerated duplicates,
resume links and keep checking AttachTo (:class:`IcState`). Pure: bytes in, values out.
"""

from __future__ import annotations

import struct

import attrs

from ... import wire

__all__ = ["FORMAT_VERSION", "IcState", "OutboxState", "StateFormatError"]

_STATE_MAGIC = b"AMBRIC"
FORMAT_VERSION = 3
# magic, format version u16, committer id i32, next seq i64, logged outputs i64,
# binding outputs i64, blob length u64 (format 1, which had no links)
_STATE_HEADER_V1 = struct.Struct("<6sHiqqqQ")
# formats 2 and 3 add the link section's length before the blob length
_STATE_HEADER = struct.Struct("<6sHiqqqQQ")
_U8 = struct.Struct("<B")
_U32 = struct.Struct("<I")
_I64 = struct.Struct("<q")
_I32 = struct.Struct("<i")

OutboxState = tuple[int, list[tuple[int, bytes]]]  # next seq, unconfirmed (seq, frame)


class StateFormatError(ValueError):
    """A checkpoint file that is not in the coordinator's format."""


@attrs.frozen
class IcState:
    """What ``serverchkpt<N>`` holds: the coordinator's own state and the binding's blob.

    ``next_seq`` is the sequence id of the first record of log N (checkpoint N is the
    state at the start of log N). ``logged_outputs`` counts the binding's replayable
    outputs logged before log N; ``binding_outputs`` counts the replayable outputs the
    binding had sent when it sent this checkpoint (see ``ic_core.Intake`` for why both).
    ``inbox`` is, per sender instance, the seq of the first message not logged before log
    N; ``outboxes`` per destination the next seq and the messages not yet confirmed by it
    when the binding sent this checkpoint; ``senders`` the incarnation (committer id) of
    each sender that has linked (see :mod:`..links.protocol`). ``attached`` is every instance the
    binding had sent AttachTo for when it sent this checkpoint: a binding restored from
    the blob need not attach to them again (ours keeps them in its checkpoint, as the
    released C# binding keeps its proxies). None: not recorded (a file of format 1 or 2,
    written before they were kept), and then never required of this instance's binding.

    Layout, little-endian: ``b"AMBRIC" | u16 format version (3) | i32 committer id | i64
    next seq | i64 logged outputs | i64 binding outputs | u64 link section length | u64
    blob length | link section | blob``. The link section: ``u32 n`` then n times ``name |
    i64 seq`` (inbox); ``u32 m`` then m times ``name | i64 next seq | u32 k`` and k times
    ``i64 seq | u32 length | frame`` (outboxes); ``u32 s`` then s times ``name | i32
    committer id`` (senders); ``u8 r``: 0 when attachments are not recorded, else 1 and
    ``u32 a`` then a times ``name`` (attached); a name is ``u32 length | UTF-8``. Format 2
    (no attachments) and format 1 (no link section) are still read.
    """

    committer_id: int
    next_seq: int
    logged_outputs: int
    binding_outputs: int
    blob: wire.Payload = attrs.field(repr=lambda b: f"<{len(b)} bytes>")
    inbox: dict[str, int] = attrs.field(factory=dict)
    outboxes: dict[str, OutboxState] = attrs.field(factory=dict)
    senders: dict[str, int] = attrs.field(factory=dict)
    attached: frozenset[str] | None = None

    def encode_parts(self) -> list[wire.Payload]:
        links = self._encode_links()
        header = _STATE_HEADER.pack(
            _STATE_MAGIC,
            FORMAT_VERSION,
            self.committer_id,
            self.next_seq,
            self.logged_outputs,
            self.binding_outputs,
            len(links),
            len(self.blob),
        )
        return [header, links, self.blob]

    def _encode_links(self) -> bytes:
        out = bytearray(_U32.pack(len(self.inbox)))
        for name, seq in sorted(self.inbox.items()):
            out += _name(name) + _I64.pack(seq)
        out += _U32.pack(len(self.outboxes))
        for name, (next_seq, frames) in sorted(self.outboxes.items()):
            out += _name(name) + _I64.pack(next_seq) + _U32.pack(len(frames))
            for seq, frame in frames:
                out += _I64.pack(seq) + _U32.pack(len(frame)) + frame
        out += _U32.pack(len(self.senders))
        for name, incarnation in sorted(self.senders.items()):
            out += _name(name) + _I32.pack(incarnation)
        if self.attached is None:
            out += _U8.pack(0)
        else:
            out += _U8.pack(1) + _U32.pack(len(self.attached))
            for name in sorted(self.attached):
                out += _name(name)
        return bytes(out)

    @classmethod
    def decode(cls, data: bytes, where: str) -> IcState:
        if len(data) < 8:
            raise StateFormatError(f"{where}: {len(data)} bytes, shorter than a state header")
        magic, version = struct.unpack_from("<6sH", data)
        if magic != _STATE_MAGIC:
            raise StateFormatError(f"{where}: not a coordinator checkpoint (magic {magic!r})")
        if version == 1:
            header, links_len = _STATE_HEADER_V1, 0
            if len(data) < header.size:
                raise StateFormatError(f"{where}: {len(data)} bytes, shorter than its header")
            _, _, committer, next_seq, logged, sent, length = header.unpack_from(data)
        elif version in (2, FORMAT_VERSION):
            header = _STATE_HEADER
            if len(data) < header.size:
                raise StateFormatError(f"{where}: {len(data)} bytes, shorter than its header")
            _, _, committer, next_seq, logged, sent, links_len, length = header.unpack_from(data)
        else:
            raise StateFormatError(f"{where}: unknown checkpoint format version {version}")
        if len(data) != header.size + links_len + length:
            raise StateFormatError(
                f"{where}: {links_len} + {length} bytes of links and blob stated, "
                f"{len(data) - header.size} present"
            )
        mv = memoryview(data)
        inbox, outboxes, senders, attached = (
            _decode_links(mv[header.size : header.size + links_len], where, version)
            if version >= 2
            else ({}, {}, {}, None)  # format 1 had no links
        )
        blob = mv[header.size + links_len :]
        return cls(committer, next_seq, logged, sent, blob, inbox, outboxes, senders, attached)


def _name(name: str) -> bytes:
    raw = name.encode()
    return _U32.pack(len(raw)) + raw


def _decode_links(
    mv: memoryview, where: str, version: int
) -> tuple[dict[str, int], dict[str, OutboxState], dict[str, int], frozenset[str] | None]:
    pos = 0

    def unpack(st: struct.Struct, what: str) -> int:
        nonlocal pos
        if pos + st.size > len(mv):
            raise StateFormatError(f"{where}: link section truncated in {what} at {pos}")
        (value,) = st.unpack_from(mv, pos)
        pos += st.size
        return int(value)

    def raw(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > len(mv):
            raise StateFormatError(f"{where}: link section truncated in {what} at {pos}")
        out = bytes(mv[pos : pos + n])
        pos += n
        return out

    def name(what: str) -> str:
        try:
            return raw(unpack(_U32, what), what).decode()
        except UnicodeDecodeError:
            raise StateFormatError(f"{where}: {what} name is not UTF-8 at {pos}") from None

    inbox = {}
    for _ in range(unpack(_U32, "inbox count")):
        sender = name("inbox")
        inbox[sender] = unpack(_I64, "inbox seq")
    outboxes: dict[str, OutboxState] = {}
    for _ in range(unpack(_U32, "outbox count")):
        dest = name("outbox")
        next_seq = unpack(_I64, "outbox next seq")
        frames = []
        for _ in range(unpack(_U32, "outbox message count")):
            seq = unpack(_I64, "outbox message seq")
            frames.append((seq, raw(unpack(_U32, "outbox message length"), "outbox message")))
        if [seq for seq, _ in frames] != list(range(next_seq - len(frames), next_seq)):
            raise StateFormatError(
                f"{where}: outbox {dest!r} holds seqs that do not run up to {next_seq - 1}"
            )
        outboxes[dest] = (next_seq, frames)
    senders = {}
    for _ in range(unpack(_U32, "sender count")):
        sender = name("sender")
        senders[sender] = unpack(_I32, "sender committer id")
    attached: frozenset[str] | None = None  # format 2: not recorded
    if version >= 3:
        recorded = unpack(_U8, "attachments flag")
        if recorded not in (0, 1):
            raise StateFormatError(f"{where}: attachments flag {recorded} (0 or 1) at {pos - 1}")
        if recorded:
            attached = frozenset(name("attached") for _ in range(unpack(_U32, "attached count")))
    if pos != len(mv):
        raise StateFormatError(f"{where}: {len(mv) - pos} bytes after the link section")
    return inbox, outboxes, senders, attached
