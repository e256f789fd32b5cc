"""A stand-in coordinator for the registry tests: it takes its instance's lock, publishes a
link address in the registry, says ``published`` and lives until it is killed.

``python -m tests.registry_owner SPEC DATA_DIR CLUSTER NAME LINK_PORT`` (SPEC ``-``: the
data dir's own SQLite registry).
"""

from __future__ import annotations

import sys
from pathlib import Path

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.storage.files import InstanceFiles


def main(argv: list[str]) -> None:
    spec, data_dir, cluster, name, link_port = argv
    registry = open_registry(None if spec == "-" else spec, Path(data_dir), cluster)
    info = registry.get(name)
    assert info is not None, f"{name} is not registered"
    files = InstanceFiles(Path(data_dir), name, info.current_version)
    files.create()
    files.acquire_lock()  # what the SQLite registry takes for "running"
    registry.set_link_address(name, "127.0.0.1", int(link_port))
    print("published", flush=True)
    sys.stdin.read()  # until killed, or until the test closes our stdin
    registry.close()


if __name__ == "__main__":
    main(sys.argv[1:])
