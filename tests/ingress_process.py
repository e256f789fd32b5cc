"""``ambrosia-py run SERVICE --ingress`` as a child process, for the process tests of the
ingress (tests/test_counter_e2e.py, tests/test_ingress_crash.py): started, waited for,
SIGKILLed (the service or its coordinator), always stopped."""

from __future__ import annotations

from pathlib import Path

from ambrosia_py.testing import ServiceProcess, free_port

__all__ = ["DEADLINE", "RunProcess", "free_port"]

DEADLINE = 60.0


class RunProcess(ServiceProcess):
    """One ``ambrosia-py run`` (the service, under its default instance name) and its
    coordinator, serving once the ingress is listening."""

    def __init__(self, service: Path, data_dir: Path, port: int, *args: str) -> None:
        super().__init__(str(service), None, data_dir, ["--ingress", f"127.0.0.1:{port}", *args])
        self.start()
        try:
            self.wait_for_log("ingress listening on", DEADLINE)
        except BaseException:
            self.kill("both")
            raise
