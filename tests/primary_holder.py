"""A stand-in primary for the election tests: it registers its replica, campaigns once,
says ``primary EPOCH`` (or ``lost``), then answers commands on stdin until it ends or is
killed: ``still`` (``yes``/``no``: whether its term is current) and ``resign``.

``python -m tests.primary_holder SPEC DATA_DIR CLUSTER NAME REPLICA``
"""

from __future__ import annotations

import sys
from pathlib import Path

from ambrosia_py.coordinator.registry.backends import open_registry
from ambrosia_py.coordinator.registry.interface import Endpoint
from ambrosia_py.coordinator.registry.primary import open_election


def main(argv: list[str]) -> None:
    spec, data_dir, cluster, name, replica = argv
    registry = open_registry(spec, Path(data_dir), cluster)
    election = open_election(registry)
    election.register_replica(name, int(replica), Endpoint("127.0.0.1", 7000 + int(replica)), 0)
    term = election.campaign(name, int(replica), 0, group_version=0)
    print("lost" if term is None else f"primary {term.epoch}", flush=True)
    for line in sys.stdin:
        if term is not None and line.strip() == "still":
            print("yes" if election.still_primary(term) else "no", flush=True)
        elif term is not None and line.strip() == "resign":
            election.resign(term)
            print("resigned", flush=True)
    election.close()
    registry.close()


if __name__ == "__main__":
    main(sys.argv[1:])
