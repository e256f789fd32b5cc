"""Calls of many connections logged as one batch, exactly once across SIGKILLs.

Sixteen threads, each with a client (a connection) of its own, call a ledger at once: the
ingress logs the calls of each turn of its event loop as one BATCH impulse. Each thread
calls with keys of its own and, every few calls, with keys every thread uses (the same
call made by several callers at once). The service process is SIGKILLed while calls are
in flight (mid-batch: calls read, logged or not, answered or not), then its coordinator,
and ``ambrosia-py run`` is started again each time; the clients send their calls again
with their keys. At the end every key acknowledged ran exactly once: the ledger's count
is the number of distinct keys acknowledged, each acknowledged answer is what that one run
returned, and calling again with acknowledged keys returns the same answers and runs
nothing. The log holds batches of more than one call.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ambrosia_py import eventloop
from ambrosia_py.binding.loading import load_service
from ambrosia_py.client import AsyncClient, Client
from ambrosia_py.ingress import INGRESS_METHOD_ID
from ambrosia_py.ingress.envelope import BatchEnvelope, decode_impulse
from ambrosia_py.wire import IncomingRpc, RecordReader

from .ingress_process import DEADLINE, RunProcess, free_port
from .test_ingress_crash import SERVICE  # a ledger: apply(token), report()

CALLERS = 16
SHARED_EVERY = 4  # every 4th call of a thread uses a key all threads use
KILLS = ("service", "coordinator")
CALLS_BETWEEN_KILLS = 150


def _batch_sizes(data_dir: Path) -> list[int]:
    """The number of calls in each ingress impulse the coordinator's logs hold."""
    sizes = []
    for path in sorted(data_dir.glob("*/serverlog*")):
        reader = RecordReader(on_disk=True, verify=False, max_record_size=1 << 30)
        reader.feed(path.read_bytes())
        while True:
            try:
                record = reader.next_record()
            except Exception:  # the allocated space after the last record, or a torn tail
                break
            if record is None:
                break
            for msg in record.messages:
                if isinstance(msg, IncomingRpc) and msg.method_id == INGRESS_METHOD_ID:
                    impulse = decode_impulse(msg.args)
                    if isinstance(impulse, BatchEnvelope):
                        sizes.append(len(impulse.calls))
    return sizes


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[tuple[Any, Path, int, list[RunProcess]]]:
    """The ledger's module, its data dir and port, and its runs (the last one running)."""
    service_file = tmp_path / "batch_ledger.py"
    service_file.write_text(SERVICE)
    port = free_port()
    runs = [RunProcess(service_file, tmp_path / "data", port)]
    try:
        yield load_service(str(service_file)), tmp_path / "data", port, runs
    finally:
        runs[-1].stop()


def test_batched_calls_run_exactly_once_across_sigkills(
    ledger: tuple[Any, Path, int, list[RunProcess]],
) -> None:
    service, data_dir, port, runs = ledger
    address = f"127.0.0.1:{port}"
    answered: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    errors: list[BaseException] = []
    clients = [Client(address, data_dir=data_dir, timeout=10 * DEADLINE) for _ in range(CALLERS)]

    def caller(t: int) -> None:
        i = 0
        try:
            while not stop.is_set():
                token = f"shared-{i // SHARED_EVERY}" if i % SHARED_EVERY == 0 else f"{t}-{i}"
                answer = clients[t].call(service.apply, token, key=token)
                with lock:
                    if answered.setdefault(token, answer) != answer:
                        errors.append(AssertionError(f"{token}: {answer} after {answered[token]}"))
                i += 1
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(t,), daemon=True) for t in range(CALLERS)]
    try:
        for thread in threads:
            thread.start()
        for kill in (*KILLS, None):
            target = len(answered) + CALLS_BETWEEN_KILLS
            deadline = time.monotonic() + DEADLINE
            while len(answered) < target:
                assert not errors, errors
                assert time.monotonic() < deadline, f"no progress before killing the {kill}"
                time.sleep(0.005)  # polling the callers' progress, bounded by the deadline
            if kill is None:
                break
            runs[-1].kill(kill)  # calls in flight, some read into a batch: sent again, run once
            runs.append(RunProcess(Path(runs[-1].service), data_dir, port))
        stop.set()
        for thread in threads:
            thread.join(DEADLINE)
            assert not thread.is_alive()
        assert not errors, errors
        applied, answers = clients[0].call(service.report)
        # Acknowledged keys called again: their stored outcomes, nothing run.
        again = {
            token: clients[1].call(service.apply, token, key=token) for token in list(answered)[:50]
        }
        applied_after, _ = clients[0].call(service.report)
        resent = sum(client.resent for client in clients)
    finally:
        stop.set()
        for client in clients:
            client.close()
    # The count (the ledger's order) is the number of distinct keys acknowledged.
    assert sorted(answered.values()) == list(range(1, len(answered) + 1))
    assert set(applied) == set(answered)
    assert all(times == 1 for times in applied.values()), {
        token: n for token, n in applied.items() if n != 1
    }
    assert answers == answered
    assert again == {token: answered[token] for token in again}
    assert applied_after == applied
    assert resent > 0  # calls in flight at a kill were sent again and still ran once
    assert any(size > 1 for size in _batch_sizes(data_dir))


def test_calls_read_together_are_logged_as_one_batch(
    ledger: tuple[Any, Path, int, list[RunProcess]],
) -> None:
    """Calls that reach the ingress in one read (one client, one write) are one impulse."""
    service, data_dir, port, _ = ledger

    async def burst() -> list[int]:
        async with AsyncClient(f"127.0.0.1:{port}", data_dir=data_dir, timeout=DEADLINE) as c:
            await c.call(service.apply, "first", key="first")  # connected: the rest at once
            calls = [c.call(service.apply, f"b{i}", key=f"b{i % 30}") for i in range(40)]
            return list(await asyncio.gather(*calls))

    results = eventloop.run(burst())
    with Client(f"127.0.0.1:{port}", data_dir=data_dir, timeout=DEADLINE) as client:
        applied, _ = client.call(service.report)
    assert len(applied) == 31  # "first" and 30 distinct keys
    assert results[30:] == results[:10]  # keys 0..9 again: the first call's answers
    assert 40 >= max(_batch_sizes(data_dir)) > 1
