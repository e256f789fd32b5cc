"""The Immortal Coordinator: binding sockets, durable log, checkpoints, recovery, registry."""

from .registry.store import PORT_RANGE, REGISTRY_FILE, InstanceInfo, Registry, RegistryError
from .storage.files import (
    CHECKPOINT_PREFIX,
    LOCK_FILE,
    LOG_PREFIX,
    CorruptLogError,
    InstanceFiles,
    InstanceLockedError,
    LogScan,
    LogWriter,
    StorageError,
    TailDamage,
    log_number,
    log_numbers_in,
)

__all__ = [
    "CHECKPOINT_PREFIX",
    "LOCK_FILE",
    "LOG_PREFIX",
    "PORT_RANGE",
    "REGISTRY_FILE",
    "CorruptLogError",
    "InstanceFiles",
    "InstanceInfo",
    "InstanceLockedError",
    "LogScan",
    "LogWriter",
    "Registry",
    "RegistryError",
    "StorageError",
    "TailDamage",
    "log_number",
    "log_numbers_in",
]
