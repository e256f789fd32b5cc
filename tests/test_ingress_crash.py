"""Exactly once through the ingress, across SIGKILLs of the service and its coordinator.

Four threads on two clients call a ledger as fast as they can, each call with its own
key, each retried (the client reconnects and sends the same key) until it is answered.
Meanwhile the service and its coordinator are SIGKILLed in turn and ``ambrosia-py run``
started again with the same command. At the end every call is answered, and the ledger
applied each exactly once; each answer is the one its single application produced, so
the calls answered only after a crash got the stored outcome, not a second run.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client

from .ingress_process import DEADLINE, RunProcess, free_port

SERVICE = """
from ambrosia_py import Immortal, rpc


class Ledger(Immortal):
    def __init__(self) -> None:
        self.applied: dict[str, int] = {}  # token -> times applied
        self.answer: dict[str, int] = {}  # token -> what its application returned
        self.order = 0

    @rpc
    def apply(self, token: str) -> int:
        self.order += 1
        self.applied[token] = self.applied.get(token, 0) + 1
        self.answer[token] = self.order
        return self.order

    @rpc
    async def apply_via_self(self, token: str) -> int:
        n: int = await self.me.apply(token)  # a call that waits: the key's call runs long
        return n

    @rpc
    def report(self) -> tuple[dict[str, int], dict[str, int]]:
        return dict(self.applied), dict(self.answer)
"""

KILLS = 4
CALLS_BETWEEN_KILLS = 40


def test_every_call_applied_exactly_once_across_sigkills(tmp_path: Path) -> None:
    service_file = tmp_path / "crash_ledger.py"
    service_file.write_text(SERVICE)
    ledger: Any = load_service(str(service_file))
    data_dir = tmp_path / "data"
    port = free_port()
    svc = RunProcess(service_file, data_dir, port)
    answered: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    clients = [
        Client(f"127.0.0.1:{port}", data_dir=data_dir, timeout=10 * DEADLINE) for _ in range(2)
    ]

    def hammer(t: int) -> None:
        client = clients[t % 2]
        i = 0
        try:
            while not stop.is_set():
                token = f"{t}-{i}"
                method = ledger.apply if i % 2 else ledger.apply_via_self
                answer = client.call(method, token, key=token)
                with lock:
                    answered[token] = answer
                i += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=hammer, args=(t,), daemon=True) for t in range(4)]
    try:
        for thread in threads:
            thread.start()
        for kill in range(KILLS + 1):
            target = len(answered) + CALLS_BETWEEN_KILLS
            deadline = time.monotonic() + DEADLINE
            while len(answered) < target:
                assert not errors, errors
                assert time.monotonic() < deadline, f"no progress after kill {kill}"
                time.sleep(0.01)  # polling the callers' progress, bounded by the deadline
            if kill == KILLS:
                break
            svc.kill("coordinator" if kill % 2 == 1 else "service")  # calls in flight: retried
            svc = RunProcess(service_file, data_dir, port)
        stop.set()
        for thread in threads:
            thread.join(DEADLINE)
            assert not thread.is_alive()
        assert not errors, errors
        applied, answers = clients[0].call(ledger.report)
        resent = sum(c.resent for c in clients)
    finally:
        stop.set()
        for client in clients:
            client.close()
        svc.stop()
    # Every call answered was applied exactly once, and its answer is that application's.
    assert set(applied) == set(answered)
    assert all(times == 1 for times in applied.values()), {
        token: n for token, n in applied.items() if n != 1
    }
    assert answers == answered
    assert sorted(answered.values()) == list(range(1, len(answered) + 1))
    assert resent > 0  # calls in flight at a kill were sent again and still ran once
