"""A replica's own state beside its log: whose data dir this is, its epoch, its history.

An instance run with replicas keeps, in each replica's instance directory, the small
file ``replica-state``: which replica the directory belongs to (a data dir copied or
mounted on the wrong machine must be refused, not silently joined to another replica's
log), the highest epoch the replica adopted (it refuses anything lower, also after a
restart), the epoch history of its log (which term wrote which part,
:mod:`ambrosia_py.coordinator.replication.history`), the committed checkpoint its
recovery starts from, whether it is still recovering (it started with an empty data
dir and has not caught up since: new terms do not count it,
:mod:`ambrosia_py.coordinator.replication.secondary`), and, in files of the release
before the registry held an instance's group, the group its log was written in
(``--replicas`` and ``--replication-ack``): read to store that group in the registry
when none is there yet (carried over as read, never set anew). The replication core asks for
these to be saved *durably* (``SaveEpoch``, ``SaveHistory``, ``Recovered``, the
checkpoint after an install): each save replaces the whole file atomically (temporary
file, fsync, rename, fsync of the directory), so a crash leaves the old file or the new
one, never a mix.

The format is binary, all little-endian, with a check over every byte before it::

    b"AMBRREPL" | u16 format version (2) | u32 body length | body | u64 XXH64 (seed 0)
    body: i64 replica | i64 epoch | i64 checkpoint (0: none) | u32 flags
          | u32 replicas | u32 ack (both 0: not recorded) | u32 n | n x (i64 epoch, i64 start)
    flags: bit 0 recovering; the others 0

Format 1, written before the flags and the group, is read as not recovering, its group
not recorded; every save writes format 2.

Binary rather than JSON with a check: every field has a fixed width, so the stated length
must equal the file's size exactly and a truncated file is refused before anything is
parsed; there is no second spelling of a value (whitespace, key order, big integers)
that could pass the check yet read differently; and it is the form of the coordinator's
other files (checkpoints, the sidecar index). The magic says what the file is, the
version what layout follows, the length where the check lies, and the XXH64 over magic,
version, length and body makes a torn or damaged file fail: no single-byte change or
cut can yield a valid file. Every refusal is a :class:`ReplicaStateError` naming the file,
what is wrong and at which offset.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from pathlib import Path

import attrs
import xxhash

from .errors import StorageError
from .files import REPLICA_STATE_FILE, InstanceFiles, write_atomically

__all__ = [
    "FORMAT_VERSION",
    "REPLICA_STATE_FILE",
    "ReplicaState",
    "ReplicaStateError",
    "decode_replica_state",
    "encode_replica_state",
    "load_replica_state",
    "replica_state_path",
    "save_replica_state",
]

FORMAT_VERSION = 2
_MAGIC = b"AMBRREPL"
_HEAD = struct.Struct("<8sHI")  # magic, version, body length
# replica, epoch, checkpoint (0: none), flags, replicas, ack (0, 0: none), entries
_FIELDS = struct.Struct("<qqqIIII")
_FIELDS_1 = struct.Struct("<qqqI")  # format 1: no flags
_RECOVERING = 1  # the flag bit
_MAX_GROUP = 2**31  # replicas are numbered 0 .. 2**31 - 1 (the registry's bound)
_ENTRY = struct.Struct("<qq")  # epoch, start
_CHECK = struct.Struct("<Q")
_MAX = 2**63 - 1  # epochs, seqs and numbers are signed 64-bit on disk
# A history gains an entry per established term; far below this in any real life.
MAX_HISTORY = 1 << 20
_MAX_FILE = _HEAD.size + _FIELDS.size + MAX_HISTORY * _ENTRY.size + _CHECK.size


class ReplicaStateError(StorageError):
    """A replica state that is damaged, not ours, or holds values that cannot be."""


def _pairs(entries: Iterable[Iterable[int]]) -> tuple[tuple[int, int], ...]:
    """History entries as a tuple of ``(epoch, start)`` tuples (lists are taken too)."""
    out = []
    for i, entry in enumerate(entries):
        pair = tuple(entry)
        if len(pair) != 2:
            raise ReplicaStateError(
                f"replica state: history entry {i} is {pair!r}, not an (epoch, start) pair"
            )
        out.append((pair[0], pair[1]))
    return tuple(out)


@attrs.frozen
class ReplicaState:
    """What ``replica-state`` holds (see the module docstring).

    ``replica``: the replica number this data dir belongs to. ``epoch``: the highest
    epoch adopted (0: none yet). ``history``: ``(epoch, start seq)`` entries, epochs
    strictly growing and at least 1, starts never going down, none above ``epoch``.
    ``checkpoint``: the number of the committed checkpoint recovery starts from (None:
    none yet). ``recovering``: the replica started with an empty data dir and has not
    caught up since. ``group``: ``(replicas, ack)`` of the group its log was written in,
    as files of an earlier release recorded it (None: not recorded). Values that cannot be raise
    :class:`ReplicaStateError` at construction.
    """

    replica: int
    epoch: int
    history: tuple[tuple[int, int], ...] = attrs.field(converter=_pairs)
    checkpoint: int | None = None
    recovering: bool = False
    group: tuple[int, int] | None = None

    def __attrs_post_init__(self) -> None:
        problem = _problem(self)
        if problem is not None:
            raise ReplicaStateError(f"replica state: {problem}")


def _problem(state: ReplicaState) -> str | None:
    """The first thing wrong with ``state``'s values, in words, or None."""
    if not 0 <= state.replica <= _MAX:
        return f"replica number {state.replica} is not in 0..{_MAX}"
    if state.group is not None:
        replicas, ack = state.group
        if not 1 <= ack <= replicas <= _MAX_GROUP:
            return f"a group of {replicas} replicas committing on {ack} cannot be"
        if state.replica >= replicas:
            return f"replica {state.replica} is not one of a group of {replicas}"
    if not 0 <= state.epoch <= _MAX:
        return f"epoch {state.epoch} is not in 0..{_MAX}"
    if state.checkpoint is not None and not 1 <= state.checkpoint <= _MAX:
        return f"checkpoint number {state.checkpoint} is not in 1..{_MAX}"
    if len(state.history) > MAX_HISTORY:
        return f"history of {len(state.history)} entries, more than {MAX_HISTORY}"
    previous: tuple[int, int] | None = None
    for i, (epoch, start) in enumerate(state.history):
        if not 1 <= epoch <= state.epoch:
            return f"history entry {i} has epoch {epoch}, not in 1..{state.epoch} (the epoch)"
        if not 0 <= start <= _MAX:
            return f"history entry {i} starts at seq {start}, not in 0..{_MAX}"
        if previous is not None and (epoch <= previous[0] or start < previous[1]):
            return (
                f"history entry {i} ({epoch}, {start}) does not follow {previous} "
                "(epochs must grow, starts never go down)"
            )
        previous = (epoch, start)
    return None


def replica_state_path(files: InstanceFiles) -> Path:
    """Where the replica state of ``files``' instance directory lies."""
    return files.path / REPLICA_STATE_FILE


def encode_replica_state(state: ReplicaState) -> bytes:
    """The bytes of ``replica-state`` for ``state``."""
    flags = _RECOVERING if state.recovering else 0
    replicas, ack = state.group or (0, 0)
    checkpoint, count = state.checkpoint or 0, len(state.history)
    body = bytearray(
        _FIELDS.pack(state.replica, state.epoch, checkpoint, flags, replicas, ack, count)
    )
    for epoch, start in state.history:
        body += _ENTRY.pack(epoch, start)
    data = _HEAD.pack(_MAGIC, FORMAT_VERSION, len(body)) + bytes(body)
    return data + _CHECK.pack(xxhash.xxh64_intdigest(data))


def decode_replica_state(data: bytes, where: str) -> ReplicaState:
    """The state in ``data``, the bytes of the file ``where`` names; refuse anything else."""
    if len(data) < _HEAD.size:
        raise ReplicaStateError(
            f"{where}: {len(data)} bytes, shorter than the {_HEAD.size}-byte header"
        )
    magic, version, length = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise ReplicaStateError(f"{where}: not a replica state file (magic {magic!r} at offset 0)")
    if len(data) != _HEAD.size + length + _CHECK.size:
        raise ReplicaStateError(
            f"{where}: the header (offset 10) states a {length}-byte body, so "
            f"{_HEAD.size + length + _CHECK.size} bytes in all; the file has {len(data)}"
        )
    at = len(data) - _CHECK.size
    (stated,) = _CHECK.unpack_from(data, at)
    actual = xxhash.xxh64_intdigest(data[:at])
    if stated != actual:
        raise ReplicaStateError(
            f"{where}: check bytes {stated:#018x} at offset {at} do not match "
            f"the contents ({actual:#018x}): the file is damaged"
        )
    if version not in (1, FORMAT_VERSION):
        raise ReplicaStateError(
            f"{where}: format version {version} at offset 8; this coordinator reads "
            f"versions 1 and {FORMAT_VERSION}"
        )
    fields = _FIELDS if version == FORMAT_VERSION else _FIELDS_1
    if length < fields.size:
        raise ReplicaStateError(
            f"{where}: a {length}-byte body at offset {_HEAD.size}, shorter than its "
            f"{fields.size} bytes of fields"
        )
    group: tuple[int, int] | None = None
    if version == FORMAT_VERSION:
        fields_at = _FIELDS.unpack_from(data, _HEAD.size)
        replica, epoch, checkpoint, flags, replicas, ack, count = fields_at
        if (replicas, ack) != (0, 0):
            group = (replicas, ack)
        if flags & ~_RECOVERING:
            raise ReplicaStateError(
                f"{where}: flags {flags:#x} at offset {_HEAD.size + 24}: only bit 0 "
                "(recovering) is known"
            )
    else:
        replica, epoch, checkpoint, count = _FIELDS_1.unpack_from(data, _HEAD.size)
        flags = 0
    if length != fields.size + count * _ENTRY.size:
        raise ReplicaStateError(
            f"{where}: {count} history entries (count at offset "
            f"{_HEAD.size + fields.size - 4}) need a {fields.size + count * _ENTRY.size}"
            f"-byte body; the header states {length}"
        )
    first = _HEAD.size + fields.size
    history = tuple(_ENTRY.unpack_from(data, first + i * _ENTRY.size) for i in range(count))
    try:
        return ReplicaState(
            replica, epoch, history, checkpoint or None, bool(flags & _RECOVERING), group
        )
    except ReplicaStateError as exc:
        raise ReplicaStateError(f"{where}: {exc}") from None


def load_replica_state(files: InstanceFiles, *, replica: int | None = None) -> ReplicaState | None:
    """The saved state of ``files``' instance directory; None if none was saved yet.

    ``replica``, if given, is the replica this process runs as: a state saved by another
    replica is refused (its log is not this replica's to continue).
    """
    path = replica_state_path(files)
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_FILE + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ReplicaStateError(f"cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > _MAX_FILE:
        raise ReplicaStateError(f"{path}: larger than {_MAX_FILE} bytes, not a replica state")
    state = decode_replica_state(data, str(path))
    if replica is not None and state.replica != replica:
        raise ReplicaStateError(
            f"{path}: this data dir belongs to replica {state.replica}, not to replica "
            f"{replica}; give each replica its own data dir"
        )
    return state


def save_replica_state(files: InstanceFiles, state: ReplicaState) -> None:
    """Replace the saved state with ``state``, durably and atomically."""
    path = replica_state_path(files)
    try:
        write_atomically(path, [encode_replica_state(state)])
    except OSError as exc:
        raise ReplicaStateError(f"cannot save {path}: {exc.strerror or exc}") from None
