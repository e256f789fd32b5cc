"""End to end: examples/counter.py under `ambrosia-py run --ingress`, SIGKILLed at random
points, called by a program through ambrosia_py.client.

The client adds distinct values one call at a time, each with its own key. After a few
calls it starts one more in a thread and SIGKILLs the service or its coordinator
(alternately) while that call is in flight, then runs the same command again; the
client sends the call again with the same key until it is answered. Every answer must
be the running total of the values before it, and the final count their sum: every
call applied exactly once, the one cut by the crash included.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import Client

from .ingress_process import DEADLINE, RunProcess, free_port

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "counter.py"


def test_counter_counts_every_call_once_across_sigkills(tmp_path: Path) -> None:
    counter: Any = load_service(str(EXAMPLE))
    rng = random.Random(7)
    port = free_port()
    svc = RunProcess(EXAMPLE, tmp_path, port)
    total = 0
    try:
        with Client(f"127.0.0.1:{port}", data_dir=tmp_path, timeout=4 * DEADLINE) as client:
            for round_no in range(4):
                for _ in range(rng.randint(5, 40)):
                    value = rng.randint(1, 1000)
                    total += value
                    assert client.call(counter.add, value, key=f"add-{total}") == total
                # One more call in flight when the kill comes: retried until answered.
                value = rng.randint(1, 1000)
                total += value
                answer: list[int] = []
                call = threading.Thread(
                    target=lambda v=value, k=f"add-{total}", out=answer: out.append(
                        client.call(counter.add, v, key=k)
                    )
                )
                call.start()
                svc.kill("coordinator" if round_no % 2 == 1 else "service")
                svc = RunProcess(EXAMPLE, tmp_path, port)
                call.join(4 * DEADLINE)
                assert answer == [total], f"round {round_no}: {answer} != [{total}]"
            assert client.call(counter.get) == total
    finally:
        svc.stop()
