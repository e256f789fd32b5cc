"""``ambrosia-py debug``'s coordinator: a checkpoint and the records after it, served to a
binding from an instance's files, writing nothing (what-if replay).

The order is seed 002's (*Starting up*). A repro or what-if test: the Checkpoint, the
logged records, then TakeBecomingPrimaryCheckpoint, after which the binding sends its
checkpoint and goes on to normal processing. An upgrade what-if test (``test_upgrade``):
the Checkpoint, UpgradeService, the logged records, and nothing after them. Whatever the
binding sends is read and dropped: nothing is logged, forwarded or written.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from ... import wire
from ...wire import CHECKPOINT_SEQ, Checkpoint, TakeBecomingPrimaryCheckpoint, UpgradeService
from ..registry.files import prepare_start
from ..storage.files import CorruptLogError, InstanceFiles
from ..storage.replay import replay_log
from .binding_auth import open_gate
from .binding_link import connect_binding
from .checkpoint import IcState
from .config import CoordinatorConfig, CoordinatorError, print_ready, resolve_start

__all__ = ["run_debug"]


async def run_debug(
    config: CoordinatorConfig,
    checkpoint: int,
    *,
    test_upgrade: bool = False,
    ready: Callable[[str], None] = print_ready,
) -> int:
    """Serve a binding checkpoint ``checkpoint`` and the records after it, writing nothing."""
    registry = prepare_start(config.data_dir, config.instance, config.registry, config.cluster)
    try:
        version, receive_port, send_port = resolve_start(config, registry)
    finally:
        registry.close()
    files = InstanceFiles(config.data_dir, config.instance, version)
    if checkpoint not in files.checkpoint_numbers():
        raise CoordinatorError(
            f"no checkpoint {checkpoint} in {files.path} (have {files.checkpoint_numbers()})"
        )
    state = IcState.decode(
        files.read_checkpoint(checkpoint), str(files.checkpoint_path(checkpoint))
    )
    binding, listeners = await connect_binding(
        config.host,
        receive_port,
        send_port,
        lambda ports: ready(f"ready debug instance={config.instance} version={version} {ports}"),
        open_gate(config.data_dir, config.instance, config.binding_auth, debug=True),
    )
    try:
        binding.read_ahead()  # what-if output, read from the start: replay must not block
        await binding.send(
            wire.encode_record_parts(state.committer_id, CHECKPOINT_SEQ, [Checkpoint(state.blob)])
        )
        if test_upgrade:
            await binding.control(state.committer_id, UpgradeService())
        try:
            await replay_log(files, binding, state, checkpoint, repair=False)
        except CorruptLogError as exc:
            raise CoordinatorError(f"replay stopped: {exc}") from None
        if not test_upgrade:  # the replay is over; what follows goes nowhere
            await binding.control(state.committer_id, TakeBecomingPrimaryCheckpoint())
        # Whatever the binding sends now is what-if output: read and discard it.
        with contextlib.suppress(ConnectionError, OSError):
            while await binding.recv():
                pass
    finally:
        binding.close()
        for listener in listeners:
            listener.close()
    return 0
