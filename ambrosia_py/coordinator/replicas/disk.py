"""What a replica keeps on disk for its replication: its state file, its log addressed by
seq, and a checkpoint coming in from another replica.

The state file (``storage/replica_state.py``) holds the epoch this replica adopted, its
epoch history and the number of its committed checkpoint: recovery starts there, not at
the registry's checkpoint, which is the instance's and shared by its replicas. The log
(``storage/replica_log.py``) starts at that checkpoint. A checkpoint shipped in chunks is
kept in a temporary file beside the log until it is whole, then installed: written as
the next checkpoint, committed in the state file, and the older files dropped.

An upgrade moves the replica to the new version's files (``InstanceFiles`` of that
version, beside the old ones), where checkpoint 1 is the upgraded state: the state file
there, saved last, makes them the ones to recover from.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import attrs

from ...wire import Payload
from ..core.checkpoint import IcState
from ..storage.errors import StorageError
from ..storage.files import INCOMING_PREFIX, InstanceFiles
from ..storage.replica_log import ReplicaLog
from ..storage.replica_state import ReplicaState, save_replica_state

__all__ = ["ReplicaDisk", "first_of_version", "read_checkpoint"]


def read_checkpoint(files: InstanceFiles, n: int) -> tuple[IcState, bytes]:
    """Checkpoint ``n`` of ``files``: its state and its bytes."""
    data = files.read_checkpoint(n)
    return IcState.decode(data, str(files.checkpoint_path(n))), data


def first_of_version(files: InstanceFiles, state: IcState) -> None:
    """Write ``state`` as checkpoint 1 of ``files``, a version's files made anew (what an
    earlier attempt left is removed first)."""
    files.create()
    files.clear()
    files.write_checkpoint(1, state.encode_parts())


class ReplicaDisk:
    """See the module. ``state`` is what the state file held at start (or a fresh one);
    with a checkpoint, the log is opened from it (a torn tail cut, as recovery does)."""

    def __init__(self, files: InstanceFiles, state: ReplicaState) -> None:
        self.files = files
        self.state = state
        self.log: ReplicaLog | None = None
        self._staged: Path | None = None
        if state.checkpoint is not None:
            self.open_log(state.checkpoint)

    def open_log(self, checkpoint: int) -> ReplicaLog:
        """The log from checkpoint ``checkpoint`` on, opened afresh."""
        if self.log is not None:
            self.log.close()
        ic, _ = read_checkpoint(self.files, checkpoint)
        self.log = ReplicaLog.open(
            self.files, first_log=checkpoint, committer_id=ic.committer_id, base_seq=ic.next_seq
        )
        return self.log

    def save(
        self,
        *,
        epoch: int | None = None,
        history: tuple[tuple[int, int], ...] | None = None,
        checkpoint: int | None = None,
        recovering: bool | None = None,
    ) -> None:
        """Save the state with the fields given changed, durably, before going on."""
        s = self.state
        self.state = attrs.evolve(
            s,
            epoch=s.epoch if epoch is None else epoch,
            history=s.history if history is None else history,
            checkpoint=s.checkpoint if checkpoint is None else checkpoint,
            recovering=s.recovering if recovering is None else recovering,
        )
        save_replica_state(self.files, self.state)

    def moved_to(self, files: InstanceFiles, committer_id: int, seq: int) -> None:
        """A primary upgrading: go on in ``files`` (created and locked), whose log 1, not
        yet written, starts at ``seq``; its checkpoint 1 comes next (the committer's)."""
        self.state = attrs.evolve(self.state, checkpoint=None)
        save_replica_state(files, self.state)
        if self.log is not None:
            self.log.close()
        self.files = files
        self.log = ReplicaLog.open(files, first_log=1, committer_id=committer_id, base_seq=seq)

    def switch_to(self, files: InstanceFiles, seq: int) -> ReplicaLog:
        """A secondary upgraded in place: go on in ``files``, whose checkpoint 1, written,
        stands before ``seq``; the records this log holds from ``seq`` on are copied to
        its log 1 and made durable before the state file there commits it."""
        old = self.log
        if old is None:
            raise StorageError("a replica with no log cannot move to another version")
        files.acquire_lock()
        new = ReplicaLog.open(files, first_log=1, committer_id=old.committer_id, base_seq=seq)
        at = seq
        while at < old.end:
            records = old.read(at, 1 << 20)
            new.append(at, records)
            at += len(records)
        new.sync()
        self.state = attrs.evolve(self.state, checkpoint=1)
        save_replica_state(files, self.state)
        old.close()
        self.files, self.log = files, new
        return new

    def latest_checkpoint(self) -> tuple[int, bytes]:
        """The committed checkpoint, to ship: the seq it stands before, and its bytes."""
        n = self.state.checkpoint
        if n is None:
            raise StorageError(f"{self.files.path} holds no committed checkpoint to send")
        ic, data = read_checkpoint(self.files, n)
        return ic.next_seq, data

    def store_chunk(self, offset: int, data: Payload, starts_over: bool) -> None:
        """Keep a chunk of a checkpoint coming in, at its offset."""
        if starts_over or self._staged is None:
            if self._staged is not None:
                self._staged.unlink(missing_ok=True)
            fd, name = tempfile.mkstemp(prefix=INCOMING_PREFIX, suffix=".tmp", dir=self.files.path)
            os.close(fd)
            self._staged = Path(name)
        with self._staged.open("r+b") as f:
            f.seek(offset)
            f.write(data)

    def take_staged(self) -> bytes:
        """The checkpoint kept aside, whole: its bytes, and the temporary file gone."""
        staged = self._staged
        if staged is None:
            raise StorageError("a checkpoint taken whole before any of it came in")
        data = staged.read_bytes()
        staged.unlink()
        self._staged = None
        return data

    def install(self, seq: int) -> int:
        """Install the checkpoint kept aside, the state before record ``seq``: written as
        the next checkpoint, committed in the state file, the older logs and checkpoints
        dropped; the log starts over, empty, at ``seq``. Returns its number."""
        data = self.take_staged()
        log = self.log
        if log is not None:
            n = max(self.state.checkpoint or 0, log.log_number) + 1
            log.install_checkpoint(n, data, seq, lambda: self.save(checkpoint=n))
            return n
        # A new replica: its first checkpoint starts its log.
        ic = IcState.decode(data, "a checkpoint shipped to a new replica")
        if ic.next_seq != seq:
            raise StorageError(f"a checkpoint shipped for seq {seq} stands before {ic.next_seq}")
        self.files.write_checkpoint(1, [data])
        self.open_log(1)
        self.save(checkpoint=1)
        return 1

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        if self._staged is not None:
            self._staged.unlink(missing_ok=True)
